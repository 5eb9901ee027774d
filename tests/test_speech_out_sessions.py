"""Speech output of streaming-input sessions (Mode A and Mode B): the answer's text deltas read aloud by the
server's voice, audio chunks in OpenAI's streamed-audio shape on the same SSE stream, [DONE] after the last;
and the requests that cannot have it refused in OpenAI's error shape."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest

from helpers_models import make_model_dir
from helpers_server import assert_nothing_left, one_torch_thread, parse_sse, running_server  # noqa: F401
from helpers_voice_out import needs_voice, running_voice_server

NDJSON = {"content-type": "application/x-ndjson"}
SESSIONS = "/v1/streaming_input/sessions"
ANSWER = {"temperature": 0, "max_tokens": 40, "ignore_eos": True, "stream": True}
SPOKEN = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


def ndjson(*lines) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def assert_error(response: httpx.Response, status: int, param: str | None = None, code: str | None = None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


async def test_audio_output_without_a_voice_is_refused_and_leaves_nothing(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        first = {"messages": [{"role": "user", "content": "Say: "}], **ANSWER, **SPOKEN}
        response = await client.post("/v1/chat/completions", content=ndjson(first, {"payload": "hi"}), headers=NDJSON)
        assert_error(response, 400, "modalities", "unsupported")
        response = await client.post(SESSIONS, json=first)
        assert_error(response, 400, "modalities", "unsupported")
        bad = {**first, "modalities": ["text", "video"]}
        response = await client.post(SESSIONS, json=bad)
        assert_error(response, 400, "modalities")
        plain = {**first, "modalities": ["text"]}  # text only: the audio field alone does not ask for speech
        response = await client.post("/v1/chat/completions", content=ndjson(plain, {"payload": "hi"}), headers=NDJSON)
        assert response.status_code == 200 and "data: [DONE]" in response.text
        await assert_nothing_left(server)


def spoken_frames(text: str) -> tuple[list[dict], str, list[int]]:
    """(audio objects, content text, frame index of each audio chunk) of a chat SSE body that ends in [DONE]."""
    frames = parse_sse(text)
    assert frames[-1].data == "[DONE]", text[-300:]
    audio, content, where = [], [], []
    for i, frame in enumerate(frames[:-1]):
        delta = frame.json["choices"][0]["delta"] if frame.json["choices"] else {}
        if "audio" in delta:
            audio.append(delta["audio"])
            where.append(i)
        content.append(delta.get("content") or "")
    return audio, "".join(content), where


def check_audio(audio: list[dict], content: str) -> None:
    assert audio, "no audio chunk"
    assert len({a["id"] for a in audio}) == 1
    pcm = np.frombuffer(b"".join(base64.b64decode(a["data"]) for a in audio), dtype="<i2")
    assert len(pcm) / 24000 > 0.3 and np.abs(pcm).max() > 100  # audible speech at 24 kHz
    spoken = " ".join(a["transcript"] for a in audio)
    assert words(spoken) == words(content)  # every word of the answer is said, in order, once


def last_text_frame(text: str) -> int:
    frames = parse_sse(text)[:-1]
    return max(i for i, f in enumerate(frames) if f.json["choices"] and f.json["choices"][0]["delta"].get("content"))


def words(text: str) -> list[str]:
    return [w for w in text.split() if any(c.isalnum() for c in w)]  # a clause of punctuation alone is not said


@needs_voice
async def test_mode_a_speaks_the_answer_as_delta_audio_beside_the_text(model_dir):
    async with running_voice_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        first = {"messages": [{"role": "user", "content": "Say: "}], **ANSWER, **SPOKEN, "max_tokens": 200}
        body = ndjson(first, {"payload": "the quick"}, {"payload": " brown fox", "end_of_input": True})
        response = await client.post("/v1/chat/completions", content=body, headers=NDJSON)
        assert response.status_code == 200, response.text
        audio, content, where = spoken_frames(response.text)
        check_audio(audio, content)
        assert len(audio) > 1 and where[0] < last_text_frame(response.text)  # speech began while the model wrote
        whole = ndjson({**first, "stream": False}, {"payload": "hi"})  # audio streams or it is not asked for
        assert_error(await client.post("/v1/chat/completions", content=whole, headers=NDJSON), 400, "stream")
        await assert_nothing_left(server)
        assert server.app.extensions["rill"].speech_out.num_requests == 0


@needs_voice
async def test_mode_b_events_carry_the_spoken_answer_and_a_bad_voice_is_refused(model_dir):
    async with running_voice_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        body = {"messages": [{"role": "user", "content": "Say: "}], **ANSWER, **SPOKEN, "stream": False}
        response = await client.post(SESSIONS, json={**body, "audio": {"voice": "nobody"}})
        assert_error(response, 400, "audio.voice")
        response = await client.post(SESSIONS, json={**body, "audio": {"voice": "alloy", "format": "mp3"}})
        assert_error(response, 400, "audio.format")
        response = await client.post(SESSIONS, json={**body, "audio": {"speed": 4.5}})
        assert_error(response, 400, "audio.speed")
        session_id = (await client.post(SESSIONS, json=body)).json()["session_id"]
        await client.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": 0, "payload": "hello there"})
        await client.post(f"{SESSIONS}/{session_id}/finish")
        events = await client.get(f"{SESSIONS}/{session_id}/events")
        without_ids = "\n".join(line for line in events.text.split("\n") if not line.startswith("id: "))
        audio, content, _ = spoken_frames(without_ids)
        check_audio(audio, content)
        await assert_nothing_left(server)


@needs_voice
async def test_a_voice_that_fails_fault_injected_ends_the_audio_and_the_text_answer_goes_on(model_dir):
    from rill.tts.espeak import EspeakBackend

    class FailingVoiceFaultInjected(EspeakBackend):
        def synthesize(self, batch):
            raise ValueError("injected fault")

    async with running_voice_server(model_dir, backend=FailingVoiceFaultInjected()) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        first = {"messages": [{"role": "user", "content": "Say: "}], **ANSWER, **SPOKEN}
        response = await client.post("/v1/chat/completions", content=ndjson(first, {"payload": "hi"}), headers=NDJSON)
        assert response.status_code == 200, response.text
        frames = parse_sse(response.text)
        assert frames[-1].data == "[DONE]"
        failed = [f.json for f in frames[:-1] if "speech_error" in f.json]
        assert len(failed) == 1 and failed[0]["choices"] == [] and "injected fault" in failed[0]["speech_error"]["message"]
        audio, content, _ = spoken_frames(response.text)
        assert audio == [] and words(content)  # no audio, and the whole text answer
        await assert_nothing_left(server)
        assert server.app.extensions["rill"].speech_out.num_requests == 0
