"""Mode A and Mode B with spoken chunks (`modality: "audio"`, base64 PCM16, `sample_rate`): transcribed
as they arrive by the speech worker and fed to the prompt. Random-weight models: the prompt the run built
is read back with `echo` (completions) and its answer must equal the engine's answer to that prompt sent
whole; meaning is tested with rill-tiny-speech in test_realtime_voice.py."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import soxr
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_voice import needs_espeak, pcm16_b64, silence, speak, voice_server
from helpers_whisper import make_whisper_dir

pytestmark = needs_espeak
SESSIONS = "/v1/streaming_input/sessions"
RATE = 16_000


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=False, max_source_positions=250,
                            max_target_positions=64)


@pytest.fixture(scope="module")
def question():
    return np.concatenate([speak("What is twelve plus thirty?"), silence(0.3)])


def audio_chunks(audio: np.ndarray, chunk_s: float = 0.1, rate: int = RATE) -> list[dict]:
    step = int(chunk_s * rate)
    return [{"modality": "audio", "payload": pcm16_b64(audio[i:i + step]), "sample_rate": rate}
            for i in range(0, len(audio), step)]


async def whole_completion(client: httpx.AsyncClient, prompt: str, max_tokens: int) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


async def test_mode_b_audio_then_text_builds_the_prompt_in_order(llm_dir, speech_dir, question):
    async with voice_server(llm_dir, speech_dir) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        body = {"prompt": "Q:", "max_tokens": 4, "temperature": 0, "echo": True,
                "streaming_input": {"api": "completions"}}
        created = await client.post(SESSIONS, json=body)
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        chunks = audio_chunks(question) + [{"payload": " Answer:"}]
        for seq, chunk in enumerate(chunks):
            response = await client.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": seq, **chunk})
            assert response.status_code == 202, response.text
            await trio.sleep(0.1)  # real-time pace
        assert (await client.post(f"{SESSIONS}/{session_id}/finish")).status_code == 202
        with trio.fail_after(60):
            while (result := await client.get(f"{SESSIONS}/{session_id}/result")).status_code == 202:
                await trio.sleep(0.1)
        assert result.status_code == 200, result.text
        text = result.json()["choices"][0]["text"]
        prompt, answer = text[:text.index(" Answer:") + len(" Answer:")], text[text.index(" Answer:") + 8:]
        assert prompt.startswith("Q: ") and len(prompt) > len("Q:  Answer:")  # "Q:", a space, the words
        assert answer == await whole_completion(client, prompt, 4)
        await wait_for(lambda: server.all_kv_free and not server.engine.core.requests
                       and server.speech.num_requests == 0)


async def test_mode_a_audio_at_24khz_is_resampled_and_answered(llm_dir, speech_dir, question):
    audio_24k = soxr.resample(question, RATE, 24_000).astype(np.float32)
    lines = [{"prompt": "Q:", "max_tokens": 3, "temperature": 0, "echo": True}] + \
        audio_chunks(audio_24k, rate=24_000) + [{"payload": " Answer:"}]

    async def body():
        for line in lines:
            yield (json.dumps(line) + "\n").encode()
            await trio.sleep(0.02)

    async with voice_server(llm_dir, speech_dir) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        response = await client.post("/v1/completions", content=body(),
                                     headers={"Content-Type": "application/x-ndjson"})
        assert response.status_code == 200, response.text
        text = response.json()["choices"][0]["text"]
        cut = text.index(" Answer:") + len(" Answer:")
        assert text.startswith("Q: ") and cut > len("Q:  Answer:")
        assert text[cut:] == await whole_completion(client, text[:cut], 3)


async def test_a_malformed_audio_chunk_is_400_and_the_session_lives(llm_dir, speech_dir, question):
    async with voice_server(llm_dir, speech_dir) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        created = await client.post(SESSIONS, json={"messages": [], "max_tokens": 2, "temperature": 0})
        session_id = created.json()["session_id"]
        for bad, param in (("%%%", "payload"), ("AAE", "payload")):
            response = await client.post(f"{SESSIONS}/{session_id}/chunks",
                                         json={"sequence_id": 0, "modality": "audio", "payload": bad})
            assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        bad_rate = await client.post(f"{SESSIONS}/{session_id}/chunks", json={
            "sequence_id": 0, "modality": "audio", "payload": pcm16_b64(question[:1600]), "sample_rate": 100})
        assert bad_rate.status_code == 400
        for seq, chunk in enumerate(audio_chunks(question, chunk_s=0.5)):
            response = await client.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": seq, **chunk})
            assert response.status_code == 202, response.text
        await client.post(f"{SESSIONS}/{session_id}/finish")
        with trio.fail_after(60):
            while (result := await client.get(f"{SESSIONS}/{session_id}/result")).status_code == 202:
                await trio.sleep(0.1)
        assert result.status_code == 200 and result.json()["choices"][0]["message"]["role"] == "assistant"


async def test_mode_b_audio_past_the_backlog_is_429_then_accepted(llm_dir, speech_dir, question):
    # 8 s of speech (256 KB of PCM16: one chunk at the default chunk limit) in turns of one question each
    noise = np.tile(question, 8 * RATE // len(question) + 1)[:8 * RATE]
    async with voice_server(llm_dir, speech_dir) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        created = await client.post(SESSIONS, json={"messages": [], "max_tokens": 1, "temperature": 0})
        session_id = created.json()["session_id"]
        statuses, seq = [], 0
        with trio.fail_after(120):
            while seq < 6:
                response = await client.post(f"{SESSIONS}/{session_id}/chunks", json={
                    "sequence_id": seq, "modality": "audio", "payload": pcm16_b64(noise)})
                statuses.append(response.status_code)
                if response.status_code == 429:
                    assert response.json()["error"]["code"] == "rate_limited"
                    await trio.sleep(0.5)
                    continue
                assert response.status_code == 202, response.text
                seq += 1
        assert 429 in statuses and statuses.count(202) == 6
        await client.delete(f"{SESSIONS}/{session_id}")
        await wait_for(lambda: server.speech.num_requests == 0 and not server.engine.core.requests, 30)


async def test_respond_per_chunk_answers_each_spoken_turn(llm_dir, speech_dir, question):
    async with voice_server(llm_dir, speech_dir) as server, \
            httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        body = {"messages": [], "max_tokens": 3, "temperature": 0, "stream": True,
                "streaming_input": {"output_mode": "respond_per_chunk"}}
        session_id = (await client.post(SESSIONS, json=body)).json()["session_id"]
        audio = np.concatenate([question, silence(0.8), question, silence(0.8)])
        for seq, chunk in enumerate(audio_chunks(audio, chunk_s=0.2)):
            await client.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": seq, **chunk})
            await trio.sleep(0.2)
        await client.post(f"{SESSIONS}/{session_id}/finish")
        async with client.stream("GET", f"{SESSIONS}/{session_id}/events") as events:
            frames = [line async for line in events.aiter_lines() if line.startswith("data: {")]
        turns = [f for f in frames if "turn_finish_reason" in f]
        assert len(turns) == 2, frames
