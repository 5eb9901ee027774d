"""Live video over Mode B (REST sessions) and Mode A (NDJSON), against a real server on a random-weight
Qwen2-VL: frames sent as image chunks (PNG drawn here) and a question after them answer as the clip
and question sent whole; a WebM stream cut into MediaRecorder-like blobs is decoded as it arrives; a
bad frame is a 400 and the session goes on; a text-only model, an answer-every-chunk session and audio
beside frames are refused; frames sent faster than the engine takes them are dropped (the newest kept,
counted in the status and /metrics); a long stream holds flat KV through rebases; nothing is left."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import trio

from helpers_live_video import FLASHES_QUESTION, GREEDY, light_clip, png_b64, webm_blobs, whole_answer
from helpers_server import assert_nothing_left, one_torch_thread, running_server, wait_for  # noqa: F401
from helpers_vision import make_vl_model_dir
from rill.live_video.config import LiveVideoConfig
from rill.media import load_video
from rill.media.policy import MediaPolicy
from rill.transports.http import ServerConfig

SESSIONS = "/v1/streaming_input/sessions"
STATES = [False, True, True, False, True, False, False, True, False, False]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


def live(**fields) -> ServerConfig:
    return ServerConfig(live_video=LiveVideoConfig(**fields))


async def create(client, **fields) -> str:
    response = await client.post(SESSIONS, json={"messages": [], **GREEDY, **fields})
    assert response.status_code == 201, response.text
    return response.json()["session_id"]


async def send(client, session_id: str, sequence_id: int, payload, **fields) -> httpx.Response:
    return await client.post(f"{SESSIONS}/{session_id}/chunks",
                             json={"sequence_id": sequence_id, "payload": payload, **fields})


async def result(client, session_id: str) -> dict:
    with trio.fail_after(60):
        while True:
            response = await client.get(f"{SESSIONS}/{session_id}/result")
            if response.status_code == 200:
                return response.json()
            assert response.status_code == 202, response.text
            await trio.sleep(0.02)


async def status(client, session_id: str) -> dict:
    return (await client.get(f"{SESSIONS}/{session_id}")).json()


def assert_error(response: httpx.Response, status_code: int, code: str) -> dict:
    assert response.status_code == status_code, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error


async def test_frames_then_a_question_answer_as_the_whole_clip(model_dir):
    frames = light_clip(STATES)
    async with running_server(model_dir, live(max_waiting_frames=64)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        for i, frame in enumerate(frames):
            response = await send(client, session_id, i, png_b64(frame), modality="image", timestamp_ms=500 * i)
            assert response.status_code == 202, response.text
        await send(client, session_id, len(frames), FLASHES_QUESTION, end_of_input=True)
        body = await result(client, session_id)
        assert body["choices"][0]["message"]["content"] == await whole_answer(server, frames, FLASHES_QUESTION)
        video = (await status(client, session_id))["video"]
        assert video["num_frames_received"] == video["num_frames_appended"] == len(frames)
        assert video["num_frames_dropped"] == 0 and video["num_frames_in_context"] == len(frames)
        metrics = (await client.get("/metrics")).text
        assert f"rill_live_video_frames_appended_total {float(len(frames))}" in metrics
        await assert_nothing_left(server)


async def test_a_webm_stream_in_blobs_is_decoded_as_it_arrives(model_dir):
    frames = light_clip(STATES[:8], size=(64, 48))
    blobs = webm_blobs(frames, fps=2)
    assert len(blobs) > 2
    decoded = load_video(b"".join(blobs), MediaPolicy(), fps=2.0, max_frames=64).frames  # the same decoder's pixels
    async with running_server(model_dir, live(max_waiting_frames=64)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        import base64
        for i, blob in enumerate(blobs):
            response = await send(client, session_id, i, base64.b64encode(blob).decode(), modality="video")
            assert response.status_code == 202, response.text
        await send(client, session_id, len(blobs), FLASHES_QUESTION, end_of_input=True)
        body = await result(client, session_id)
        assert (await status(client, session_id))["video"]["num_frames_appended"] == len(frames)
        expected = await whole_answer(server, list(decoded), FLASHES_QUESTION)
        assert body["choices"][0]["message"]["content"] == expected
        await assert_nothing_left(server)


async def test_a_bad_frame_is_refused_alone_and_the_session_goes_on(model_dir):
    frames = light_clip(STATES[:4])
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        assert (await send(client, session_id, 0, png_b64(frames[0]), modality="image")).status_code == 202
        assert_error(await send(client, session_id, 1, "bm90IGFuIGltYWdl", modality="image"), 400, "invalid_image")
        assert_error(await send(client, session_id, 1, "%%%", modality="image"), 400, "invalid_image")
        assert_error(await send(client, session_id, 1, png_b64(frames[1]), modality="image", sample_rate=16000),
                     400, "invalid_value")
        assert_error(await send(client, session_id, 1, "AAAA", modality="video"), 400, "invalid_video")
        for i, frame in enumerate(frames[1:], start=1):  # the refused sequence id is taken by a good frame
            assert (await send(client, session_id, i, png_b64(frame), modality="image")).status_code == 202
        await send(client, session_id, len(frames), FLASHES_QUESTION, end_of_input=True)
        body = await result(client, session_id)
        assert body["choices"][0]["message"]["content"] == await whole_answer(server, frames, FLASHES_QUESTION)
        assert (await status(client, session_id))["video"]["num_bad_frames"] == 0  # refused before the feed
        assert "rill_live_video_bad_frames_total 3.0" in (await client.get("/metrics")).text
        await assert_nothing_left(server)


async def test_sessions_that_cannot_take_frames_say_so(model_dir, tmp_path):
    from helpers_models import make_model_dir

    frame = png_b64(light_clip([True])[0])
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        per_chunk = await create(client, streaming_input={"output_mode": "respond_per_chunk"})
        assert_error(await send(client, per_chunk, 0, frame, modality="image"), 400, "unsupported_modality")
        session_id = await create(client)
        assert_error(await send(client, session_id, 0, frame, modality="image", timestamp_ms=-1), 400, "invalid_type")
        assert_error(await send(client, session_id, 0, "hello", timestamp_ms=5), 400, "invalid_value")
        await client.delete(f"{SESSIONS}/{per_chunk}")
        await client.delete(f"{SESSIONS}/{session_id}")
        await assert_nothing_left(server)
    async with running_server(make_model_dir(tmp_path, "qwen2")) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        error = assert_error(await send(client, session_id, 0, frame, modality="image"), 400, "unsupported_modality")
        assert "text only" in error["message"]
        await client.delete(f"{SESSIONS}/{session_id}")
        await assert_nothing_left(server)


class SlowSteps:
    """Fault injection: every engine step takes at least `seconds` (a slow encoder)."""

    def __init__(self, core, seconds: float):
        self.execute, self.seconds = core.runner.execute, seconds
        core.runner.execute = self

    def __call__(self, *args, **kwargs):
        import time

        time.sleep(self.seconds)
        return self.execute(*args, **kwargs)


async def test_frames_faster_than_the_engine_are_dropped_oldest_first(model_dir):
    frames = light_clip([i % 3 == 0 for i in range(24)])
    async with running_server(model_dir, live(max_frames_in_flight=2, max_waiting_frames=2)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        SlowSteps(server.engine.core, 0.15)
        session_id = await create(client)
        for i, frame in enumerate(frames):  # as fast as the client can: far faster than 0.15 s a step
            assert (await send(client, session_id, i, png_b64(frame), modality="image")).status_code == 202
        await send(client, session_id, len(frames), FLASHES_QUESTION, end_of_input=True)
        await result(client, session_id)
        video = (await status(client, session_id))["video"]
        assert video["num_frames_dropped"] > 0
        assert video["num_frames_appended"] + video["num_frames_dropped"] == len(frames)
        assert video["num_frames_appended"] >= 4  # the first pieces, and the newest frames at the end
        metrics = (await client.get("/metrics")).text
        assert f"rill_live_video_frames_dropped_total {float(video['num_frames_dropped'])}" in metrics
        await assert_nothing_left(server)


async def test_a_long_stream_holds_flat_kv_through_rebases(model_dir):
    """Simulated 2 fps for 60 s, sped up: the context keeps 8-12 frames; KV in use stays flat."""
    config = live(max_frames=8, rebase_frames=4, max_waiting_frames=64)
    async with running_server(model_dir, config) as server, httpx.AsyncClient(base_url=server.url) as client:
        bm = server.engine.core.block_manager
        session_id = await create(client)
        used = []
        for i in range(120):
            frame = light_clip([i % 5 == 0])[0]
            assert (await send(client, session_id, i, png_b64(frame), modality="image",
                               timestamp_ms=500 * i)).status_code == 202
            if i % 2:
                run = server.app.extensions["rill"].sessions.get(session_id, None).run
                await wait_for(lambda: run.video.feed.num_pieces_in_flight() == 0 and not run.video.feed.inbox)
                used.append(bm.num_used_blocks)
        await send(client, session_id, 120, FLASHES_QUESTION, end_of_input=True)
        assert (await result(client, session_id))["choices"][0]["message"]["content"]
        video = (await status(client, session_id))["video"]
        assert video["num_frames_appended"] == 120 and video["num_rebases"] >= 20
        assert 8 <= video["num_frames_in_context"] <= 12
        assert max(used[30:]) <= max(used[:15])  # flat: no more KV at the end than within the first 15 s
        assert server.engine.stats.num_rebased >= 20
        await assert_nothing_left(server)


async def test_mode_a_frames_and_question_in_one_ndjson_body(model_dir):
    import json

    frames = light_clip(STATES[:6])
    async with running_server(model_dir, live(max_waiting_frames=64)) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        lines = [{"messages": [], **GREEDY}]
        lines += [{"modality": "image", "payload": png_b64(f)} for f in frames]
        lines += [{"payload": FLASHES_QUESTION, "end_of_input": True}]
        body = "".join(json.dumps(line) + "\n" for line in lines).encode()
        response = await client.post("/v1/chat/completions", content=body,
                                     headers={"Content-Type": "application/x-ndjson"})
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == await whole_answer(server, frames,
                                                                                         FLASHES_QUESTION)
        bad = "".join(json.dumps(line) + "\n" for line in [lines[0], {"modality": "image", "payload": "AAAA"}])
        response = await client.post("/v1/chat/completions", content=bad.encode(),
                                     headers={"Content-Type": "application/x-ndjson"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_image"
        assert response.json()["error"]["message"].startswith("line 2:")
        await assert_nothing_left(server)


async def test_mode_a_client_gone_mid_stream_frees_everything(model_dir):
    import json

    frames = light_clip([True, False] * 6)
    # Room for every frame: with the default two waiting, a busy machine drops some and 8 never go in.
    async with running_server(model_dir, live(max_waiting_frames=64)) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        sent = trio.Event()

        async def body():
            yield (json.dumps({"messages": [], **GREEDY}) + "\n").encode()
            for frame in frames:
                yield (json.dumps({"modality": "image", "payload": png_b64(frame)}) + "\n").encode()
            sent.set()
            await trio.sleep_forever()  # the client never ends its input

        async with trio.open_nursery() as nursery:
            async def post():
                await client.post("/v1/chat/completions", content=body(),
                                  headers={"Content-Type": "application/x-ndjson"})

            nursery.start_soon(post)
            await sent.wait()
            await wait_for(lambda: server.serving.live_video.num_frames_appended >= 8)
            nursery.cancel_scope.cancel()  # the connection drops
        await assert_nothing_left(server)
        await wait_for(lambda: server.serving.live_video.num_open_feeds == 0)
        assert np.all(server.engine.core.scheduler.vision.cache.num_holders == 0)
