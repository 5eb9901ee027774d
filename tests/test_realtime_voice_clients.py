"""Realtime voice with other people's clients, on both listeners: the openai SDK's realtime client (GA,
which parses every event into its own models) and the `websockets` library speaking vLLM's
transcription flow. Both are blocking here (the SDK's sync client, websockets.sync), so each runs in a
worker thread beside the trio server, sending audio at real-time pace."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
import soxr
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread  # noqa: F401
from helpers_voice import needs_espeak, pcm16_b64, silence, speak, voice_server
from helpers_whisper import make_whisper_dir
from rill.speech.whisper import RILL_TINY_SPEECH, speech_model_path
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig

openai = pytest.importorskip("openai")
websockets_sync = pytest.importorskip("websockets.sync.client")
pytestmark = needs_espeak
CHUNK_S = 0.1


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=False, max_source_positions=250,
                            max_target_positions=64)


@pytest.fixture(scope="module")
def turn_audio():
    return np.concatenate([silence(0.3), speak("What is twelve plus thirty?"), silence(1.0)])


def pieces(audio: np.ndarray, rate_hz: int = 16_000) -> list[str]:
    """`audio` (16 kHz) as base64 PCM16 pieces of CHUNK_S at `rate_hz`."""
    if rate_hz != 16_000:
        audio = soxr.resample(audio, 16_000, rate_hz).astype(np.float32)
    step = int(CHUNK_S * rate_hz)
    return [pcm16_b64(audio[i:i + step]) for i in range(0, len(audio), step)]


def sdk_voice_turn(client, model: str, audio: np.ndarray) -> list:
    """Blocking: one spoken turn with server VAD through the SDK, in OpenAI's audio format (PCM16 at 24 kHz,
    as `audio/pcm`); every event up to response.done."""
    events = []
    with client.realtime.connect(model=model) as conn:
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 4,
                                     "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24_000},
                                                         "turn_detection": {"type": "server_vad",
                                                                            "silence_duration_ms": 500}}}})
        for piece in pieces(audio, 24_000):
            conn.input_audio_buffer.append(audio=piece)
            time.sleep(CHUNK_S)
        for event in conn:
            events.append(event)
            if event.type in ("response.done", "error"):
                break
    return events


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_openai_sdk_realtime_client_speaks_a_turn_and_gets_an_answer(llm_dir, speech_dir, turn_audio,
                                                                          listener):
    async with voice_server(llm_dir, speech_dir, ServerConfig(realtime=RealtimeConfig(ws_port=0))) as server:
        ws_base = server.ws_url + "/v1" if listener == "raw" else None
        client = openai.OpenAI(api_key="unused", base_url=server.url + "/v1", websocket_base_url=ws_base,
                               max_retries=0)
        model = server.app.extensions["rill"].serving.model_names[0]
        with trio.fail_after(90):
            events = await trio.to_thread.run_sync(sdk_voice_turn, client, model, turn_audio,
                                                   abandon_on_cancel=True)
    by_type = {}
    for event in events:
        by_type.setdefault(event.type, []).append(event)
    assert "error" not in by_type and events[-1].type == "response.done", [e.type for e in events]
    assert type(by_type["input_audio_buffer.speech_started"][0]).__name__ == "InputAudioBufferSpeechStartedEvent"
    assert type(by_type["input_audio_buffer.speech_stopped"][0]).__name__ == "InputAudioBufferSpeechStoppedEvent"
    (completed,) = by_type["conversation.item.input_audio_transcription.completed"]
    assert type(completed).__name__ == "ConversationItemInputAudioTranscriptionCompletedEvent"
    assert completed.transcript == "".join(
        e.delta for e in by_type["conversation.item.input_audio_transcription.delta"])
    # 24 kHz audio read at 24 kHz: speech ends where it was said (read at 16 kHz it would end 1.5x later)
    spoken_end_ms = 1000 * (len(turn_audio) / 16_000 - 1.0)
    end_ms = by_type["input_audio_buffer.speech_stopped"][0].audio_end_ms
    assert abs(end_ms - spoken_end_ms) < 0.2 * spoken_end_ms, (end_ms, spoken_end_ms)
    (committed,) = by_type["input_audio_buffer.committed"]
    assert committed.item_id == completed.item_id == by_type["input_audio_buffer.speech_started"][0].item_id
    assert events[-1].response.usage.output_tokens == 4


def vllm_transcribe(url: str, model: str, audio: np.ndarray) -> list[dict]:
    """Blocking, as vLLM's example client does it: model, an opening commit, appends, commit final."""
    events = []
    with websockets_sync.connect(url) as ws:
        events.append(json.loads(ws.recv()))
        ws.send(json.dumps({"type": "session.update", "model": model}))
        ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
        for piece in pieces(audio):
            ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": piece}))
            time.sleep(CHUNK_S / 4)
        ws.send(json.dumps({"type": "input_audio_buffer.commit", "final": True}))
        while events[-1]["type"] not in ("transcription.done", "error"):
            events.append(json.loads(ws.recv(timeout=60)))
    return events


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_websockets_client_in_vllms_transcription_flow(llm_dir, speech_dir, turn_audio, listener):
    """On a server with OpenAI's default (24 kHz): a session opened vLLM's way reads its unnamed audio as 16 kHz."""
    async with voice_server(llm_dir, speech_dir, ServerConfig(realtime=RealtimeConfig(ws_port=0))) as server:
        with trio.fail_after(90):
            events = await trio.to_thread.run_sync(vllm_transcribe, server.realtime_url(listener),
                                                   str(speech_dir), turn_audio, abandon_on_cancel=True)
        assert not server.engine.core.requests  # a transcription session asks the LLM nothing
    types = [e["type"] for e in events]
    assert types[0] == "session.created" and types[-1] == "transcription.done" and "error" not in types, types
    assert events[1]["type"] == "session.updated" and events[1]["session"]["type"] == "transcription"
    assert events[1]["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16_000}
    text = "".join(e["delta"] for e in events if e["type"] == "transcription.delta")
    assert events[-1]["text"] == text.strip() != ""


async def test_vllms_running_transcript_keeps_the_space_between_turns(llm_dir):
    """Two questions with a pause that server VAD ends a turn at (rill-tiny-speech hears them): vLLM's
    `transcription.delta` text is one running transcript, so the second turn's first word keeps its space
    ("...thirty? What..."), as `transcription.done` joins the turns."""
    speech_dir = speech_model_path(RILL_TINY_SPEECH)
    audio = np.concatenate([silence(0.3), speak("What is twelve plus thirty?"), silence(1.2),
                            speak("What is rill?"), silence(1.0)])
    async with voice_server(llm_dir, speech_dir) as server:
        with trio.fail_after(90):
            events = await trio.to_thread.run_sync(vllm_transcribe, server.realtime_url("http"), str(speech_dir),
                                                   audio, abandon_on_cancel=True)
    types = [e["type"] for e in events]
    assert types[-1] == "transcription.done" and "error" not in types, types
    text = "".join(e["delta"] for e in events if e["type"] == "transcription.delta")
    assert events[-1]["text"] == text.strip()
    assert "? What" in text, text
