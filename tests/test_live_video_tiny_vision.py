"""rill-tiny-vision watching live video: the recipe's held-out clips (a red light that flashes beside
another light, digits shown one after another), drawn here by the recipe's own code, stream frame by
frame into a real server over both realtime listeners and over Mode B; the question after the frames
is answered with the true count and the true last digit, as when the clip is sent whole; nothing is
left held after. Skipped where the build does not ship rill-tiny-vision (RILL_TINY_VISION_DIR may
point at another run of the recipe)."""

from __future__ import annotations

import httpx
import pytest

from helpers_live_video import FLASHES_QUESTION, LAST_DIGIT_QUESTION, png_b64, whole_answer
from helpers_server import assert_nothing_left, one_torch_thread, running_server, wait_for  # noqa: F401
from rill.assets import tiny_vision_dir
from rill.live_video.config import LiveVideoConfig
from rill.tiny_vision import tasks
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig
from test_live_video_mode_b import create, result, send
from test_realtime_server import connect, hub, text_of
from test_realtime_video import put_question, stream

MODEL = tiny_vision_dir()
pytestmark = pytest.mark.skipif(not (MODEL / "model.safetensors").is_file(), reason="rill-tiny-vision not shipped")
QUESTIONS = {"flashes": FLASHES_QUESTION, "last_digit": LAST_DIGIT_QUESTION}
ANSWER = {"temperature": 0, "max_tokens": 4}
PER_FAMILY = 2  # the first held-out clips of each family (seed 0), as `rill eval-tiny-vision` draws them


def clips() -> list[tuple[str, tasks.Example]]:
    return [(family, e) for family in QUESTIONS for e in tasks.eval_examples(0, family, PER_FAMILY)]


def config(**realtime) -> ServerConfig:
    return ServerConfig(realtime=RealtimeConfig(**realtime), live_video=LiveVideoConfig(max_waiting_frames=64))


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_streamed_clips_are_answered_over_the_realtime_listeners(listener):
    async with running_server(MODEL, config(ws_port=0)) as server:
        for family, example in clips():
            frames = list(example.frames)
            async with connect(server, listener) as client:
                await client.update(temperature=0, max_response_output_tokens=ANSWER["max_tokens"])
                await stream(client, frames)
                await put_question(client, QUESTIONS[family])
                events = await client.respond()
            assert not [e for e in events if e["type"] == "error"]
            answer = text_of(events).strip()
            assert answer == example.answer, (family, example.key, answer)
            assert answer == (await whole_answer(server, frames, QUESTIONS[family], ANSWER)).strip()
        await wait_for(lambda: hub(server).num_connections == 0 and server.serving.live_video.num_open_feeds == 0)
        await assert_nothing_left(server)


async def test_streamed_clips_are_answered_over_mode_b():
    async with running_server(MODEL, config()) as server, httpx.AsyncClient(base_url=server.url) as client:
        for family, example in clips():
            session_id = await create(client, **ANSWER, ignore_eos=False)
            for i, frame in enumerate(example.frames):
                response = await send(client, session_id, i, png_b64(frame), modality="image", timestamp_ms=500 * i)
                assert response.status_code == 202, response.text
            await send(client, session_id, len(example.frames), QUESTIONS[family], end_of_input=True)
            answer = (await result(client, session_id))["choices"][0]["message"]["content"].strip()
            assert answer == example.answer, (family, example.key, answer)
        await assert_nothing_left(server)
