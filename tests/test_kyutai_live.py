"""Realtime transcription served by a Kyutai STT directory (`rill serve --speech-model DIR`): /v1/realtime
in vLLM's protocol and OpenAI's GA transcription sessions, the voice conversation path, turn detection
on top, errors, and freeing. A real hypercorn server on 127.0.0.1, real websocket clients, random-weight
models: the deltas are compared with a KyutaiStream fed the same samples offline (arbitrary tokens, but
deterministic), never with words."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio

from helpers_kyutai import make_kyutai_dir, synthetic_audio
from helpers_models import make_model_dir
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_voice import mode_b_echo, needs_espeak, of_type, pcm16_b64, silence, speak, voice_client, voice_server
from rill.speech.kyutai import KyutaiStream, load_kyutai
from rill.transports.realtime.audio_input import decode_pcm16

websockets_sync = pytest.importorskip("websockets.sync.client")
RATE = 16_000
CHUNK_S = 0.1
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(scope="module")
def kyutai_dir(tmp_path_factory):
    return make_kyutai_dir(tmp_path_factory.mktemp("kyutai") / "stt", "wide", seed=4)


@pytest.fixture(scope="module")
def runtime(kyutai_dir):
    return load_kyutai(kyutai_dir)


def on_the_wire(audio: np.ndarray) -> np.ndarray:
    """What the server decodes from the PCM16 the clients send."""
    return decode_pcm16(pcm16_b64(audio), len(audio))


def offline(runtime, audio: np.ndarray) -> str:
    stream = KyutaiStream(runtime, RATE)
    return stream.feed(on_the_wire(audio)).text + stream.finish().text


def words(text: str) -> list[str]:
    return text.split()


async def transcribe_ga(client, kyutai_dir, audio: np.ndarray, pace: float = float("inf")) -> list[dict]:
    """One GA transcription session, manual commit: the events up to the turn's completed transcript."""
    await client.update(type="transcription", audio={"input": {"transcription": {"model": str(kyutai_dir)},
                                                               "turn_detection": None}})
    await client.stream(audio, CHUNK_S, pace)
    await client.send("input_audio_buffer.commit")
    return await client.until(COMPLETED)


async def test_ga_transcription_session_streams_the_offline_transcript(llm_dir, kyutai_dir, runtime):
    audio = synthetic_audio(4.0, seed=21, rate=RATE)
    async with voice_server(llm_dir, kyutai_dir) as server:
        async with voice_client(server) as client:
            events = await transcribe_ga(client, kyutai_dir, audio)
            again = await transcribe_ga(client, kyutai_dir, audio)  # a commit starts a fresh stream
        await wait_for(lambda: server.speech.core.live.num_live == 0)
        assert not server.engine.core.requests  # a transcription session asks the LLM nothing
    expected = offline(runtime, audio).strip()
    for got in (events, again):
        deltas = [e["delta"] for e in of_type(got, DELTA)]
        assert expected and len(deltas) >= 2 and "".join(deltas) == expected
        assert of_type(got, COMPLETED)[0]["transcript"] == expected


def vllm_transcribe(url: str, model: str, audio: np.ndarray) -> tuple[list[dict], float]:
    """Blocking, as vLLM's example client: model, an opening commit, appends, commit final."""
    events = []
    with websockets_sync.connect(url) as ws:
        events.append(json.loads(ws.recv()))
        ws.send(json.dumps({"type": "session.update", "model": model}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        step = int(CHUNK_S * RATE)
        for i in range(0, len(audio), step):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": pcm16_b64(audio[i:i + step])}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        while events[-1]["type"] not in ("transcription.done", "error"):
            events.append(json.loads(ws.recv(timeout=60)))
    return events


async def test_vllm_flow_streams_deltas_of_the_offline_transcript(llm_dir, kyutai_dir, runtime):
    """vLLM's session (server_vad on by default here): turns split the deltas, the words are the whole clip's."""
    audio = np.concatenate([synthetic_audio(5.0, seed=22, rate=RATE), silence(1.5)])
    async with voice_server(llm_dir, kyutai_dir) as server:
        with trio.fail_after(120):
            events = await trio.to_thread.run_sync(vllm_transcribe, server.realtime_url("http"), str(kyutai_dir),
                                                   audio, abandon_on_cancel=True)
        await wait_for(lambda: server.speech.core.live.num_live == 0)
    types = [e["type"] for e in events]
    assert types[-1] == "transcription.done" and "error" not in types, types
    assert events[1]["session"]["type"] == "transcription"
    deltas = "".join(e["delta"] for e in events if e["type"] == "transcription.delta")
    expected = words(offline(runtime, audio))
    assert expected and words(deltas) == expected
    # transcription.done joins the turns with a space: a random model writes on through the silence where
    # the detector ends a turn, so the cut may split one of its words (a trained model writes pads there)
    assert "".join(words(events[-1]["text"])) == "".join(expected)


async def test_three_concurrent_sessions_batch_and_each_equals_its_own(llm_dir, kyutai_dir, runtime):
    audios = [synthetic_audio(s, seed=30 + i, rate=RATE) for i, s in enumerate((3.0, 4.2, 3.6))]
    results = {}
    async with voice_server(llm_dir, kyutai_dir) as server:
        async def session(i: int) -> None:
            async with voice_client(server) as client:
                results[i] = await transcribe_ga(client, kyutai_dir, audios[i], pace=4.0)

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(session, i)
        live = server.speech.core.live
        await wait_for(lambda: live.num_live == 0)
        assert live.max_batch >= 2  # streams of different sessions shared a forward
    for i, audio in enumerate(audios):
        assert "".join(e["delta"] for e in of_type(results[i], DELTA)) == offline(runtime, audio).strip()


async def test_a_closed_connection_frees_its_stream(llm_dir, kyutai_dir):
    audio = synthetic_audio(20.0, seed=23, rate=RATE)
    async with voice_server(llm_dir, kyutai_dir) as server:
        live = server.speech.core.live
        async with voice_client(server) as client:
            await client.update(type="transcription", audio={"input": {
                "transcription": {"model": str(kyutai_dir)}, "turn_detection": None}})
            await client.stream(audio[:RATE * 2], CHUNK_S)
            await wait_for(lambda: live.num_live == 1)
        await wait_for(lambda: live.num_live == 0 and not server.speech.num_requests)
        await wait_for(lambda: server.num_connections == 0)


@pytest.mark.parametrize("setting,param", [
    ({"transcription": {"model": "no-such-model"}}, "model"),
    ({"transcription": {"language": "de"}}, "language"),
    ({"transcription": {"prompt": "arithmetic"}}, "prompt"),
])
async def test_what_the_model_cannot_do_is_a_realtime_error(llm_dir, kyutai_dir, setting, param):
    async with voice_server(llm_dir, kyutai_dir) as server, voice_client(server) as client:
        await client.send("session.update", session={"type": "transcription", "audio": {"input": setting}})
        (error,) = of_type(await client.until("error"), "error")
        assert error["error"]["type"] == "invalid_request_error"
        assert param in (error["error"].get("param") or "") or param in error["error"]["message"], error
        ok = await client.update(type="transcription", audio={"input": {"transcription": {"language": "fr"}}})
        assert ok["audio"]["input"]["transcription"]["language"] == "fr"  # a language the model has


async def test_spoken_words_flow_into_the_chat_prompt_and_are_answered(llm_dir, kyutai_dir, runtime):
    """A realtime (conversation) session: the words join the user turn as they come; the answer reads them."""
    audio = synthetic_audio(4.0, seed=24, rate=RATE)
    async with voice_server(llm_dir, kyutai_dir) as server, voice_client(server) as client:
        await client.update(type="realtime", output_modalities=["text"], max_output_tokens=4,
                            audio={"input": {"turn_detection": None}})
        await client.stream(audio, CHUNK_S, pace=4.0)
        sent_s = trio.current_time()
        await client.send("input_audio_buffer.commit")
        await client.until(COMPLETED)
        await client.send("response.create")
        events = await client.until("response.done")
        first_delta_s = next(t for t, e in client.log if e["type"] == DELTA)
        transcript = next(e for _, e in client.log if e["type"] == COMPLETED)["transcript"]
        answer = "".join(e.get("delta", "") for e in of_type(events, "response.output_text.delta"))
    assert transcript == offline(runtime, audio).strip()
    assert first_delta_s < sent_s  # words came while audio was still being sent
    assert events[-1]["response"]["status"] == "incomplete" and answer  # 4 tokens of an answer


@needs_espeak
@pytest.mark.parametrize("turn_detection", [{"type": "server_vad", "silence_duration_ms": 500},
                                            {"type": "semantic_vad", "eagerness": "high"}])
async def test_turn_detection_on_the_causal_stream(llm_dir, kyutai_dir, runtime, turn_detection):
    """The client's own silence ends the turn (semantic_vad: the chat model's answer at the pause, or
    its cap of 2 s of silence at eagerness high)."""
    audio = np.concatenate([silence(0.5), speak("What is twelve plus thirty?"), silence(2.5)])
    async with voice_server(llm_dir, kyutai_dir) as server, voice_client(server) as client:
        await client.update(type="transcription", audio={"input": {
            "transcription": {"model": str(kyutai_dir)}, "turn_detection": turn_detection}})
        await client.stream(audio, CHUNK_S, pace=4.0)
        turn = await client.until(COMPLETED)
        await client.send("input_audio_buffer.commit", final=True)
        await trio.sleep(0)
        rest = await client.until(COMPLETED)
    types = [e["type"] for e in turn]
    assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.speech_stopped")
    assert of_type(turn, COMPLETED)[0]["transcript"] == "".join(e["delta"] for e in of_type(turn, DELTA))
    heard = "".join(e["delta"] for e in of_type(turn + rest, DELTA))
    # Every word up to the end of the client's audio, as the whole clip gives it (joined: turns may cut a
    # word). After it the tails may differ: when the detector's turn end plus the model's delay reaches past
    # the audio sent (semantic_vad's 2 s cap, at pace 4), the server feeds the missing part as silence
    # (causal_live's FILL_AFTER_S) before the final commit's flush, and a random model writes on silence.
    fed = KyutaiStream(runtime, RATE).feed(on_the_wire(audio)).text
    assert "".join(words(heard)).startswith("".join(words(fed))) and words(fed)


async def test_mode_b_audio_chunks_put_the_streamed_words_in_the_prompt(llm_dir, kyutai_dir, runtime):
    """Mode B with spoken chunks: the causal stream's words join the prompt (read back with echo)."""
    audio = synthetic_audio(3.0, seed=25, rate=RATE)
    async with voice_server(llm_dir, kyutai_dir) as server:
        text = await mode_b_echo(server, audio, RATE, int(CHUNK_S * RATE))
    expected = "Q: " + offline(runtime, audio).strip()
    assert text.startswith(expected), (text, expected)
