"""examples/live_video_client.py against a real server on a random-weight Qwen2-VL: an MP4 drawn here is
streamed at its real frame rate over /v1/realtime, one question comes on stdin, and the answer printed is
the engine's own for the clip's frames and the question sent whole."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import av
import numpy as np
import pytest
import trio

from helpers_live_video import FLASHES_QUESTION, light_clip, whole_answer
from helpers_server import one_torch_thread, running_server  # noqa: F401
from helpers_vision import make_vl_model_dir
from rill.live_video.config import LiveVideoConfig
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig

CLIENT = Path(__file__).resolve().parents[1] / "examples" / "live_video_client.py"
STATES = [False, True, True, False, True, False, False, True]
FPS = 4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


def draw_mp4(path: Path, frames: list[np.ndarray], fps: int) -> list[np.ndarray]:
    """An MPEG-4 file of the frames; returns them as a decoder gives them back (the codec is lossy)."""
    h, w = frames[0].shape[:2]
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


async def test_the_example_streams_a_file_and_answers_a_question_from_stdin(model_dir, tmp_path):
    clip = tmp_path / "light.mp4"
    decoded = draw_mp4(clip, light_clip(STATES, size=(84, 56)), FPS)
    assert len(decoded) == len(STATES)
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0), live_video=LiveVideoConfig(max_waiting_frames=64))
    async with running_server(model_dir, config) as server:
        url = server.url.replace("http://", "ws://") + "/v1/realtime"
        command = [sys.executable, str(CLIENT), str(clip), "--url", url, "--fps", str(FPS), "--image-format",
                   "png", "--ask-at-end", "--max-tokens", "6"]
        start = time.perf_counter()
        with trio.fail_after(60):
            done = await trio.run_process(command, stdin=(FLASHES_QUESTION + "\n").encode(), capture_stdout=True,
                                          capture_stderr=True, check=False)
        assert done.returncode == 0, done.stderr.decode()
        assert time.perf_counter() - start >= (len(STATES) - 1) / FPS  # sent at the clip's own pace
        log = done.stderr.decode()
        assert f"[{len(STATES)} frames sent]" in log and "first token" in log and "error" not in log
        expected = await whole_answer(server, decoded, FLASHES_QUESTION, {"temperature": 0, "max_tokens": 6})
        assert expected and done.stdout.decode().strip("\n") == expected
        assert server.serving.live_video.num_frames_appended == len(STATES)


async def read(stream, sink: list) -> None:
    async for chunk in stream:
        sink.append(chunk)


async def test_the_example_streams_a_live_source_as_a_camera_until_stdin_ends(model_dir):
    """--camera with FFmpeg's lavfi test source standing in for a webcam (an endless stream whose clock
    starts anywhere): frames go at --fps while it runs, a question typed after a while is answered about
    them, and the client stops at the end of stdin."""
    config = ServerConfig(realtime=RealtimeConfig(ws_port=0), live_video=LiveVideoConfig(max_waiting_frames=64))
    async with running_server(model_dir, config) as server:
        url = server.url.replace("http://", "ws://") + "/v1/realtime"
        command = [sys.executable, str(CLIENT), "--camera", "testsrc=size=84x56:rate=8", "--camera-format", "lavfi",
                   "--url", url, "--fps", "4", "--max-tokens", "4"]
        stats = server.serving.live_video
        with trio.fail_after(60):
            process = await trio.lowlevel.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                       stderr=subprocess.PIPE)
            try:
                while stats.num_frames_appended < 4:
                    await trio.sleep(0.05)
                await process.stdin.send_all((FLASHES_QUESTION + "\n").encode())
                await process.stdin.aclose()
                out, err = [], []
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read, process.stdout, out)
                    nursery.start_soon(read, process.stderr, err)
                    await process.wait()
            finally:
                if process.returncode is None:  # the test failed first: stop the client
                    process.kill()
                    await process.wait()
        stdout, stderr = b"".join(out).decode(), b"".join(err).decode()
        assert process.returncode == 0, stderr
        assert "first token" in stderr and "error" not in stderr and stdout.strip()
        assert stats.num_frames_appended >= 4 and stats.num_frames_dropped == 0
