"""Speech output of streaming-input sessions (Mode A and Mode B): the answer's text deltas read aloud by the
server's voice, audio chunks in OpenAI's streamed-audio shape on the same SSE stream, [DONE] after the last;
and the requests that cannot have it refused in OpenAI's error shape."""

from __future__ import annotations

import json

import httpx
import pytest

from helpers_models import make_model_dir
from helpers_server import assert_nothing_left, one_torch_thread, running_server  # noqa: F401

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
