"""Live Voxtral Realtime streams on the speech worker (rill.speech.causal's LiveStreams over VoxtralCausal),
and realtime transcription served by a Voxtral directory: OpenAI's GA transcription session and vLLM's
flow over real websockets, on a real hypercorn server on 127.0.0.1 with random-weight models. The deltas are
compared with a VoxtralStream fed the same samples alone (arbitrary tokens, but deterministic)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_voice import mode_b_echo, of_type, pcm16_b64, voice_client, voice_server
from helpers_voxtral import make_voxtral_dir, synthetic_audio
from rill.speech.causal import LiveStreams
from rill.speech.voxtral_realtime import VoxtralStream, load_voxtral_realtime
from rill.speech.voxtral_realtime.live import VoxtralCausal
from rill.transports.realtime.audio_input import decode_pcm16

if not hasattr(pytest.importorskip("transformers"), "VoxtralRealtimeConfig"):
    pytest.skip("transformers has no Voxtral Realtime (5.x needed)", allow_module_level=True)
websockets_sync = pytest.importorskip("websockets.sync.client")

RATE = 16_000
CHUNK_S = 0.1
DELTA = "conversation.item.input_audio_transcription.delta"
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(scope="module")
def voxtral_dir(tmp_path_factory):
    return make_voxtral_dir(tmp_path_factory.mktemp("voxtral") / "realtime", "wide", seed=4)


@pytest.fixture(scope="module")
def runtime(voxtral_dir):
    return load_voxtral_realtime(voxtral_dir)


def alone(runtime, audio: np.ndarray, rate: int = RATE) -> tuple[list[int], str]:
    stream = VoxtralStream(runtime, rate)
    first, last = stream.feed(audio), stream.finish()
    return first.token_ids + last.token_ids, first.text + last.text


def test_live_streams_batched_together_equal_each_alone(runtime):
    audios = [synthetic_audio(s, seed=40 + i) for i, s in enumerate((2.0, 3.1, 1.3))]
    live = LiveStreams(VoxtralCausal(runtime), max_frames=3)
    got = {name: [] for name in ("0", "1", "2", "gone")}
    for i in range(3):
        live.open(str(i), RATE)
    live.open("gone", RATE)
    live.feed("gone", audios[0])
    piece = 1000  # pieces of 62.5 ms, interleaved, a worker step now and then
    for start in range(0, max(a.size for a in audios), piece):
        for i, audio in enumerate(audios):
            if start < audio.size:
                live.feed(str(i), audio[start : start + piece])
            if start + piece >= audio.size:
                live.end(str(i))
        if start // piece % 3 == 0:
            for delta in live.step():
                got[delta.request_id] += delta.token_ids
        if start == 5 * piece:
            assert live.abort("gone") and not live.abort("gone")
    for _ in range(200):
        if not live.has_work():
            break
        for delta in live.step():
            got[delta.request_id] += delta.token_ids
    assert live.num_live == 0 and not live.has_work()
    assert live.model.max_rows == 3  # the streams' decoder positions shared forwards
    for i, audio in enumerate(audios):
        assert got[str(i)] == alone(runtime, audio)[0]


def test_batched_encoder_rows_of_irregular_pieces_equal_each_alone(runtime):
    """Four streams fed pieces of irregular sizes (so each worker step brings each row a different number
    of encoder positions), of different lengths; one joins after the others have run a while, one ends
    mid-way and a fifth is aborted: each stream's tokens are the stream's alone."""
    rng = np.random.default_rng(7)
    audios = {str(i): synthetic_audio(s, seed=60 + i) for i, s in enumerate((2.3, 1.1, 3.0, 1.7))}
    live = LiveStreams(VoxtralCausal(runtime), max_frames=4)
    got = {name: [] for name in [*audios, "gone"]}
    sent = dict.fromkeys(audios, 0)
    for name in ("0", "1", "2", "gone"):
        live.open(name, RATE)
    for k in range(400):
        if k == 12:
            live.open("3", RATE)  # joins while the others are mid-stream
        if k == 9:
            assert live.abort("gone")
        for name, audio in audios.items():
            if name == "3" and k < 12 or sent[name] >= audio.size:
                continue
            size = int(rng.integers(37, 4000))
            live.feed(name, audio[sent[name] : sent[name] + size])
            sent[name] += size
            if sent[name] >= audio.size:
                live.end(name)  # "1" ends while the others still stream
        if k < 9:
            live.feed("gone", audios["0"][k * 1500 : (k + 1) * 1500])
        if rng.random() < 0.6:
            for delta in live.step():
                got[delta.request_id] += delta.token_ids
        if all(sent[n] >= a.size for n, a in audios.items()) and not live.has_work():
            break
    while live.has_work():
        for delta in live.step():
            got[delta.request_id] += delta.token_ids
    assert live.num_live == 0
    assert live.model.max_encoder_rows >= 3  # the encoder passes were batched
    for name, audio in audios.items():
        assert got[name] == alone(runtime, audio)[0], name


def test_a_long_live_stream_holds_the_same_state(runtime):
    live = LiveStreams(VoxtralCausal(runtime))
    live.open("s", RATE)
    sizes = []
    for i in range(4):
        live.feed("s", synthetic_audio(2.0, seed=50 + i))
        while live.has_work():
            live.step()
        sizes.append(live.num_state_bytes)
    assert sizes[1] == sizes[2] == sizes[3] > 0


def on_the_wire(audio: np.ndarray) -> np.ndarray:
    """What the server decodes from the PCM16 the clients send."""
    return decode_pcm16(pcm16_b64(audio), len(audio))


async def test_ga_transcription_session_streams_the_stream_alone_transcript(llm_dir, voxtral_dir, runtime):
    audio = synthetic_audio(3.0, seed=21)
    async with voice_server(llm_dir, voxtral_dir) as server:
        async with voice_client(server) as client:
            await client.update(type="transcription", audio={"input": {
                "transcription": {"model": str(voxtral_dir)}, "turn_detection": None}})
            await client.stream(audio, CHUNK_S, float("inf"))
            await client.send("input_audio_buffer.commit")
            events = await client.until(COMPLETED)
        await wait_for(lambda: server.speech.core.live.num_live == 0)
        assert not server.engine.core.requests  # a transcription session asks the LLM nothing
    expected = alone(runtime, on_the_wire(audio))[1].strip()
    deltas = [e["delta"] for e in of_type(events, DELTA)]
    assert expected and len(deltas) >= 2 and "".join(deltas) == expected
    assert of_type(events, COMPLETED)[0]["transcript"] == expected


def vllm_transcribe(url: str, model: str, audio: np.ndarray) -> list[dict]:
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


async def test_vllm_flow_streams_deltas_of_the_stream_alone(llm_dir, voxtral_dir, runtime):
    """vLLM's session (server_vad on by default here): turns split the deltas, the words are the whole clip's."""
    audio = np.concatenate([synthetic_audio(3.0, seed=22), np.zeros(int(1.5 * RATE), np.float32)])
    async with voice_server(llm_dir, voxtral_dir) as server:
        with trio.fail_after(120):
            events = await trio.to_thread.run_sync(vllm_transcribe, server.realtime_url("http"), str(voxtral_dir),
                                                   audio, abandon_on_cancel=True)
        await wait_for(lambda: server.speech.core.live.num_live == 0)
    types = [e["type"] for e in events]
    assert types[-1] == "transcription.done" and "error" not in types, types
    assert events[1]["session"]["type"] == "transcription"
    deltas = "".join(e["delta"] for e in events if e["type"] == "transcription.delta")
    expected = alone(runtime, on_the_wire(audio))[1].split()
    assert expected and deltas.split() == expected
    # transcription.done joins the turns with a space: a random model writes on through the silence where
    # the detector ends a turn, so the cut may split one of its words
    assert "".join(events[-1]["text"].split()) == "".join(expected)


@pytest.mark.parametrize("setting, param", [
    ({"transcription": {"language": "xx"}}, "language"),
    ({"transcription": {"prompt": "arithmetic"}}, "prompt"),
])
async def test_what_the_model_cannot_do_is_a_realtime_error(llm_dir, voxtral_dir, setting, param):
    async with voice_server(llm_dir, voxtral_dir) as server, voice_client(server) as client:
        await client.send("session.update", session={"type": "transcription", "audio": {"input": setting}})
        (error,) = of_type(await client.until("error"), "error")
        assert error["error"]["type"] == "invalid_request_error"
        assert param in (error["error"].get("param") or "") or param in error["error"]["message"], error
        ok = await client.update(type="transcription", audio={"input": {"transcription": {"language": "de"}}})
        assert ok["audio"]["input"]["transcription"]["language"] == "de"  # a language the model has


async def test_mode_b_audio_chunks_put_the_streamed_words_in_the_prompt(llm_dir, voxtral_dir, runtime):
    """Mode B with spoken chunks: the causal stream's words join the prompt (read back with echo)."""
    audio = synthetic_audio(3.0, seed=25)
    async with voice_server(llm_dir, voxtral_dir) as server:
        text = await mode_b_echo(server, audio, RATE, int(CHUNK_S * RATE))
    expected = "Q: " + alone(runtime, on_the_wire(audio))[1].strip()
    assert text.startswith(expected), (text, expected)
