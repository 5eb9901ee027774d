"""Decompression bombs (issue 52, item 6): a small file that decodes to far more than its size.

A hostile client on 127.0.0.1 sends each bomb to a real server; the answer must be a 400 in OpenAI's
shape, quickly, with the process's resident memory barely moved. On the old code the FLAC bomb
(184 KiB: 120 s of 192 kHz 8-channel silence) was a 200 after the server grew by ~870 MB, and the
H.264 bomb (63 KB: 1,200 black 4K frames) a 200 after ~17 s of decoding; as a live stream's blob all
1,200 frames were decoded. Audio at the sample cap decodes in pieces: its peak memory is the 16 kHz
result, not the file's 690 MB of float32.
"""

from __future__ import annotations

import io
import threading
import time
from contextlib import asynccontextmanager, contextmanager
from fractions import Fraction

import httpx
import numpy as np
import pytest
import soundfile as sf
import trio

from helpers_media import data_url, make_video, png_bomb
from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server  # noqa: F401
from helpers_vision import make_vl_model_dir
from helpers_whisper import make_whisper_dir
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.media.errors import VideoError
from rill.media.policy import MediaPolicy
from rill.live_video.segments import SegmentDecoder
from rill.media.video import load_video
from rill.server import hypercorn_config
from rill.speech.async_speech import open_serving_speech
from rill.speech.audio import MAX_DECODED_SAMPLES, SAMPLE_RATE, AudioError, load_audio
from rill.transports.http import ServerConfig, create_app

MB = 1 << 20
BOMB_RATE, BOMB_CHANNELS = 192_000, 8


# -- measuring ---------------------------------------------------------------------------------------------


@contextmanager
def peak_rss():
    """Yields a dict whose "growth" (bytes) is set on exit: the highest RSS seen minus the RSS at entry.
    A thread samples /proc/self/statm every 2 ms, so a transient allocation in a decode thread is seen."""
    page = 4096
    result, stop = {"growth": 0}, threading.Event()

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    start, peak = rss(), [0]

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            stop.wait(0.002)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield result
    finally:
        stop.set()
        thread.join()
        result["growth"] = max(peak[0], rss()) - start


# -- bombs -------------------------------------------------------------------------------------------------


def flac_silence(num_frames: int, rate: int = BOMB_RATE, channels: int = BOMB_CHANNELS) -> bytes:
    """FLAC of `num_frames` silent frames, written a second at a time (never held whole here either)."""
    buf = io.BytesIO()
    with sf.SoundFile(buf, "w", samplerate=rate, channels=channels, format="FLAC", subtype="PCM_16") as f:
        second = np.zeros((rate, channels), np.int16)
        for start in range(0, num_frames, rate):
            f.write(second[: min(rate, num_frames - start)])
    return buf.getvalue()


def h264_bomb(num_frames: int, width: int = 3840, height: int = 2160, rate: int = 30,
              fragmented: bool = False) -> bytes:
    """An MP4 of `num_frames` black frames: one key frame, then the same "nothing changed" P frame muxed
    again and again, so the file grows by ~50 bytes a frame while each frame decodes to 8.3 M pixels.
    `fragmented`: a streamable MP4 (moov first), as a live stream's blobs are."""
    import av

    encoder = av.CodecContext.create("libx264", "w")
    encoder.width, encoder.height, encoder.pix_fmt = width, height, "yuv420p"
    encoder.time_base, encoder.framerate = Fraction(1, rate), Fraction(rate, 1)
    encoder.options = {"preset": "ultrafast", "bframes": "0", "keyint": "100000", "tune": "zerolatency"}
    black = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), format="rgb24")
    packets = []
    for pts in range(2):
        black.pts = pts
        packets += encoder.encode(black)
    packets += encoder.encode(None)
    key, same = bytes(packets[0]), bytes(packets[1])
    buf = io.BytesIO()
    options = {"movflags": "frag_keyframe+empty_moov+default_base_moof"} if fragmented else {}
    with av.open(buf, "w", format="mp4", options=options) as out:
        stream = out.add_stream("libx264", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.extradata = encoder.extradata
        for i in range(num_frames):
            packet = av.Packet(key if i == 0 else same)
            packet.pts = packet.dts = i
            packet.time_base, packet.stream, packet.is_keyframe = Fraction(1, rate), stream, i == 0
            out.mux(packet)
    return buf.getvalue()


@pytest.fixture(scope="module")
def flac_bomb() -> bytes:
    data = flac_silence(120 * BOMB_RATE)  # the file: 120 s, 184 M samples
    assert len(data) < 200 * 1024
    return data


def assert_error(response: httpx.Response, status: int, param, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    return error


# -- audio -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), max_source_positions=100, max_target_positions=48)


@asynccontextmanager
async def speech_server(llm_dir, speech_dir):
    hyper = hypercorn_config("127.0.0.1", 0, 1.0, ServerConfig())
    async with open_engine(EngineConfig(model=str(llm_dir), num_kv_blocks=64)) as engine, \
            open_serving_speech(str(speech_dir)) as speech:
        app = create_app(engine=engine, server=ServerConfig(), speech=speech)
        async with trio.open_nursery() as nursery:
            from hypercorn.trio import serve

            binds = await nursery.start(serve, app, hyper)
            try:
                yield binds[0]
            finally:
                nursery.cancel_scope.cancel()


async def test_flac_bomb_is_400_before_decoding_and_memory_stays_flat(llm_dir, speech_dir, flac_bomb):
    async with speech_server(llm_dir, speech_dir) as url, httpx.AsyncClient(base_url=url, timeout=30) as client:
        with peak_rss() as rss:
            started = time.monotonic()
            response = await client.post("/v1/audio/transcriptions", data={"model": str(speech_dir)},
                                         files={"file": ("bomb.flac", flac_bomb, "audio/flac")})
            elapsed_s = time.monotonic() - started
        error = assert_error(response, 400, "file", "invalid_audio")
        assert "184320000 samples, past the limit of 172800000" in error["message"]
        assert elapsed_s < 2.0, elapsed_s  # refused from the header
        assert rss["growth"] < 64 * MB, rss["growth"] / MB  # old code: +871 MB
        one_second = io.BytesIO()
        sf.write(one_second, np.zeros(SAMPLE_RATE, np.float32), SAMPLE_RATE, format="WAV")
        response = await client.post("/v1/audio/transcriptions", data={"model": str(speech_dir)},
                                     files={"file": ("ok.wav", one_second.getvalue(), "audio/wav")})
        assert response.status_code == 200, response.text  # the server goes on transcribing


def test_flac_at_the_sample_cap_decodes_in_pieces_and_one_frame_past_is_refused():
    at_cap = MAX_DECODED_SAMPLES // BOMB_CHANNELS  # 112.5 s at 192 kHz x 8: 690 MB as float32
    data = flac_silence(at_cap)
    with peak_rss() as rss:
        mono = load_audio(data)
    assert mono.shape == (at_cap * SAMPLE_RATE // BOMB_RATE,) and mono.dtype == np.float32
    # the 16 kHz result (7 MB) and a piece or two; decoding whole held 690 MB
    assert rss["growth"] < 64 * MB, rss["growth"] / MB
    with pytest.raises(AudioError, match="past the limit of 172800000"):
        load_audio(flac_silence(at_cap + 1))


# -- images and video, through a vision model --------------------------------------------------------------


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


def media_question(model_dir, part: dict) -> dict:
    return {"model": str(model_dir), "max_tokens": 2,
            "messages": [{"role": "user", "content": [part, {"type": "text", "text": "What is it?"}]}]}


async def test_image_and_video_bombs_are_400_before_decoding(vl_dir):
    png = png_bomb(8000, 8000)  # 64 M pixels (192 MB as RGB) in ~20 KB
    mp4 = h264_bomb(1200)  # 9.95 G pixels to decode in 63 KB
    assert len(png) < 100_000 and len(mp4) < 100_000
    async with running_server(vl_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        for kind, url in (("image", data_url(png)), ("video", data_url(mp4, "video/mp4"))):
            part = {"type": f"{kind}_url", f"{kind}_url": {"url": url}}
            with peak_rss() as rss:
                started = time.monotonic()
                response = await client.post("/v1/chat/completions", json=media_question(vl_dir, part))
                elapsed_s = time.monotonic() - started
            error = assert_error(response, 400, f"messages[0].content[0].{kind}_url.url", f"invalid_{kind}")
            assert "past the limit" in error["message"]
            assert elapsed_s < 3.0, (kind, elapsed_s)  # old code, the video: a 200 after ~17 s of decoding
            assert rss["growth"] < 64 * MB, (kind, rss["growth"] / MB)


def test_decoded_video_pixel_limit_at_and_past():
    data = make_video([0, 40, 80, 120], size=(64, 48))  # 4 frames of 3,072 pixels
    assert load_video(data, MediaPolicy(max_video_decoded_pixels=4 * 64 * 48), fps=1, max_frames=4).num_frames == 1
    with pytest.raises(VideoError, match="4 frames of 64x48: 12288 pixels to decode, past the limit of 12287"):
        load_video(data, MediaPolicy(max_video_decoded_pixels=4 * 64 * 48 - 1), fps=1, max_frames=4)


async def test_a_live_video_stream_that_decodes_faster_than_real_time_is_refused():
    """The same bomb as a live stream's blob (Mode A/B and realtime video chunks): the decoder thread stops
    once the pixels decoded run 10 s of 1080p60 ahead of the wall clock (old code: all 1,200 frames)."""
    errors, frames = [], []
    decoder = SegmentDecoder(MediaPolicy(), 1.0, lambda pixels, t: frames.append(t), errors.append)
    decoder.feed(h264_bomb(1200, fragmented=True))
    decoder.end()
    with trio.fail_after(60):
        await decoder.run()
    assert len(errors) == 1 and "faster than real time" in str(errors[0]), errors
    assert decoder.num_decoded < 300, decoder.num_decoded  # 10 s of 1080p60 is 150 4K frames, plus the clock's
