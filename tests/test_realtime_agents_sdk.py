"""OpenAI's Agents SDK (`agents.realtime`) drives a realtime voice agent on rill, set up as its docs show:
a RealtimeAgent with a @function_tool, run by RealtimeRunner with the model config's `url` pointed at
rill and an API key of "none", every other setting the SDK's default. The SDK then sends its own
session.update (model `gpt-realtime-2.1`, transcription `gpt-4o-mini-transcribe`, turn detection
`semantic_vad`, output modalities ["audio"], PCM16 at 24 kHz) and validates every server event against
its pydantic models; a validation failure reaches the session as an error event, which these tests
count. rill serves rill-tiny and rill-tiny-speech: a typed question and a spoken one (espeak-ng at
24 kHz) each call get_weather, the SDK runs it and sends the result, and rill-tiny answers from it. On a
server with a voice (espeak-ng on the speech-out worker) the SDK's ["audio"] is honoured: the answer
comes back spoken, as the SDK's audio events, with its transcript.

openai-agents comes with the `frameworks` extra, in its own venv (.ci/run: .venv-fw); without it the
module skips. The SDK is asyncio, so it runs in a worker thread beside the trio server.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import soxr
import trio

from helpers_server import one_torch_thread  # noqa: F401
from helpers_voice import needs_espeak, silence, speak, voice_server
from rill.speech.async_speech import speech_model_available
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig

pytest.importorskip("agents.realtime", reason="openai-agents is not installed: the `frameworks` extra (.ci/run)")
pytestmark = [needs_espeak, pytest.mark.skipif(not speech_model_available("rill-tiny-speech"),
                                               reason="rill-tiny-speech is not in this build")]

RESULT = {"temperature_c": 21, "condition": "sunny"}  # get_weather's result in rill-tiny's training
TURN_TIMEOUT_S = 120
CHUNK_S = 0.1
MAX_SILENCE_S = 10.0  # past semantic_vad's longest wait (eagerness low: 8 s)


def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    get_weather.cities.append(city)
    return json.dumps(RESULT)


def pcm16_24k(samples_16k: np.ndarray) -> bytes:
    """What an OpenAI client sends: PCM16 little-endian at 24 kHz."""
    samples = soxr.resample(samples_16k, 16_000, 24_000)
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


def run_agent(url: str, audio: bytes | None) -> dict:
    """Blocking: one user turn, typed or spoken, until the agent has called the tool and answered; what the
    session showed. `audio` goes as a microphone's would: 100 ms pieces through the SDK's send_audio, at
    four times real time, then silence until the answer is in (semantic VAD decides on the audio it hears)."""
    from agents import function_tool, set_tracing_disabled
    from agents.realtime import RealtimeAgent, RealtimeRunner

    set_tracing_disabled(True)  # no trace export: nothing leaves 127.0.0.1

    async def main() -> dict:
        agent = RealtimeAgent(name="Assistant", instructions="You are a helpful assistant.",
                              tools=[function_tool(get_weather)])
        seen = {"errors": [], "server_events": [], "tool_ends": 0, "answer": None, "audio_bytes": 0}
        session = await RealtimeRunner(starting_agent=agent).run(model_config={"url": url, "api_key": "none"})
        async with session:
            if audio is None:
                await session.send_message("What's the weather in Paris?")
            microphone = asyncio.create_task(speak_into(session, audio or b""))
            async for event in session:
                _record(seen, event)
                if seen["answer"] is not None:
                    break
            microphone.cancel()
        return seen

    return asyncio.run(asyncio.wait_for(main(), TURN_TIMEOUT_S))


async def speak_into(session, audio: bytes) -> None:
    piece = int(CHUNK_S * 24_000) * 2
    quiet = bytes(piece)
    for at in range(0, len(audio), piece):
        await session.send_audio(audio[at:at + piece])
        await asyncio.sleep(CHUNK_S / 4)
    for _ in range(int(MAX_SILENCE_S / CHUNK_S)) if audio else ():
        await session.send_audio(quiet)
        await asyncio.sleep(CHUNK_S / 4)


def _record(seen: dict, event) -> None:
    if event.type == "error":
        seen["errors"].append(str(event.error))
    elif event.type == "raw_model_event" and event.data.type == "error":  # a server event the SDK refused
        seen["errors"].append(str(event.data.error)[:2000])
    elif event.type == "raw_model_event" and event.data.type == "raw_server_event":
        seen["server_events"].append(event.data.data)
    elif event.type == "tool_end":
        seen["tool_ends"] += 1
    elif event.type == "audio":  # the spoken answer, as the SDK hands it to a player
        seen["audio_bytes"] += len(event.audio.data)
    data = event.data.data if event.type == "raw_model_event" and event.data.type == "raw_server_event" else {}
    if data.get("type") == "response.done" and seen["tool_ends"]:
        output = data["response"]["output"]
        texts = [part.get("text", part.get("transcript")) for item in output if item["type"] == "message"
                 for part in item["content"]]
        if texts:
            seen["answer"] = "".join(t or "" for t in texts)


@pytest.fixture(autouse=True)
def fresh_calls():
    get_weather.cities = []


def server_config() -> ServerConfig:
    return ServerConfig(realtime=RealtimeConfig(ws_port=0))  # OpenAI's defaults: 24 kHz PCM16


def check(seen: dict, spoken: bool = False) -> None:
    assert seen["errors"] == [], seen["errors"]
    assert len(get_weather.cities) == 1 and seen["tool_ends"] == 1  # the tool ran once (the city as sampled)
    assert "21°C" in seen["answer"] and "sunny" in seen["answer"], seen["answer"]
    session = next(e for e in reversed(seen["server_events"]) if e["type"] == "session.updated")["session"]
    assert session["model"] == "rill-tiny"  # gpt-realtime-2.1 asked; the model that answers reported
    assert session["audio"]["input"]["transcription"]["model"] == "rill-tiny-speech"  # for gpt-4o-mini-transcribe
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24_000}
    if spoken:  # ["audio"] asked of a server with a voice: the answer is spoken, PCM16 at 24 kHz
        assert session["output_modalities"] == ["audio"] and seen["audio_bytes"] > 0.5 * 48_000, seen["audio_bytes"]
    else:  # ["audio"] asked of a server without one: rill answers in text (and says so)
        assert session["output_modalities"] == ["text"] and seen["audio_bytes"] == 0
    assert [t["name"] for t in session["tools"]] == ["get_weather"] and session["instructions"]


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_agents_sdk_realtime_agent_calls_the_tool_and_answers_a_typed_question(listener):
    async with voice_server("rill-tiny", "rill-tiny-speech", server_config()) as server:
        with trio.fail_after(TURN_TIMEOUT_S + 10):
            seen = await trio.to_thread.run_sync(run_agent, server.realtime_url(listener), None,
                                                 abandon_on_cancel=True)
    check(seen)


async def test_agents_sdk_realtime_agent_hears_24khz_speech_calls_the_tool_and_answers():
    question = np.concatenate([silence(0.3), speak("What is the weather in Paris?", rate_wpm=140)])
    async with voice_server("rill-tiny", "rill-tiny-speech", server_config()) as server:
        with trio.fail_after(TURN_TIMEOUT_S + 10):
            seen = await trio.to_thread.run_sync(run_agent, server.realtime_url("http"), pcm16_24k(question),
                                                 abandon_on_cancel=True)
    check(seen)
    (completed,) = [e for e in seen["server_events"]
                    if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert "weather" in completed["transcript"].lower(), completed  # rill-tiny-speech: "What is the weather in ..."


async def test_agents_sdk_realtime_voice_agent_hears_speech_calls_the_tool_and_answers_aloud():
    from helpers_voice_out import voice_available
    from rill.tts.espeak import EspeakBackend
    from rill.tts.worker import open_speech_out

    if not voice_available():
        pytest.skip("espeakng-loader (libespeak-ng) is not installed")
    question = np.concatenate([silence(0.3), speak("What is the weather in Paris?", rate_wpm=140)])
    async with open_speech_out(EspeakBackend()) as out, \
            voice_server("rill-tiny", "rill-tiny-speech", server_config()) as server:
        server.app.extensions["rill"].speech_out = out
        with trio.fail_after(TURN_TIMEOUT_S + 10):
            seen = await trio.to_thread.run_sync(run_agent, server.realtime_url("raw"), pcm16_24k(question),
                                                 abandon_on_cancel=True)
    check(seen, spoken=True)
