"""WS /v1/audio/speech/stream against a real server: text in pieces in, each clause's audio out as soon as
the clause is complete (before input.done), vLLM-Omni's events around it; limits at and past; errors as
error events; refusals at the upgrade in OpenAI's error shape."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import soundfile as sf
import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, open_websocket_url

from helpers_server import running_server, wait_for
from helpers_voice_out import needs_voice, running_voice_server
from rill.assets import RILL_TINY_DIR
from rill.transports import speech_stream_ws
from rill.tts.stream_events import MAX_MESSAGE_BYTES, MAX_UTTERANCE_CHARS

PATH = "/v1/audio/speech/stream"
TEXT = "The first clause is here, and the second one follows it. Then comes the end."
CONFIG = {"type": "session.config", "voice": "alloy", "response_format": "pcm"}


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + PATH


async def send(ws, message: dict) -> None:
    await ws.send_message(json.dumps(message))


async def next_event(ws) -> dict:
    while True:
        message = await ws.get_message()
        if isinstance(message, str):
            return json.loads(message)


async def next_error(ws) -> dict:
    """The next error event (audio of clauses already complete may come first)."""
    while (event := await next_event(ws))["type"] != "error":
        pass
    return event


async def read_utterance(ws) -> tuple[list[dict], list[bytes]]:
    """Events and binary frames up to and including session.done."""
    events, frames = [], []
    with trio.fail_after(60):
        while True:
            message = await ws.get_message()
            if isinstance(message, bytes):
                frames.append(message)
                continue
            events.append(json.loads(message))
            if events[-1]["type"] == "session.done":
                return events, frames


async def test_a_server_without_a_voice_refuses_the_upgrade_with_404():
    async with running_server(RILL_TINY_DIR) as server:
        with pytest.raises(ConnectionRejected) as caught:
            async with open_websocket_url(ws_url(server)):
                pass
        assert caught.value.status_code == 404
        assert json.loads(caught.value.body)["error"]["code"] == "model_not_found"


@needs_voice
async def test_text_streamed_a_word_at_a_time_is_spoken_clause_by_clause_before_input_done():
    async with running_voice_server(RILL_TINY_DIR) as server, open_websocket_url(ws_url(server)) as ws:
        await send(ws, CONFIG)
        words = TEXT.split(" ")
        cut = words.index("Then") + 1  # "Then" makes the second clause's end certain
        for i, word in enumerate(words[:cut]):
            await send(ws, {"type": "input.text", "text": word if i == 0 else " " + word})
        with trio.fail_after(30):  # the first clause's audio comes while the text is still unfinished
            start = await next_event(ws)
        assert start["type"] == "audio.start" and start["sentence_text"] == "The first clause is here,"
        assert (start["format"], start["sample_rate"], start["channels"]) == ("pcm", 24000, 1)
        for word in words[cut:]:
            await send(ws, {"type": "input.text", "text": " " + word})
        await send(ws, {"type": "input.done"})
        events, frames = await read_utterance(ws)
        events = [start, *events]
        starts = [e for e in events if e["type"] == "audio.start"]
        dones = [e for e in events if e["type"] == "audio.done"]
        assert [e["sentence_text"] for e in starts] == ["The first clause is here,", "and the second one follows it.",
                                                        "Then comes the end."]
        assert [e["sentence_index"] for e in dones] == [0, 1, 2] and not any(e["error"] for e in dones)
        assert events[-1] == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
        pcm = np.frombuffer(b"".join(frames), dtype="<i2")
        assert sum(e["total_bytes"] for e in dones) == 2 * len(pcm)
        assert len(pcm) / 24000 > 1.0 and np.abs(pcm).max() > 100  # seconds of audible speech

        await send(ws, {"type": "input.text", "text": "A second utterance."})  # the connection serves another
        await send(ws, {"type": "input.done"})
        events, _ = await read_utterance(ws)
        assert events[-1] == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


@needs_voice
async def test_wav_sends_one_file_per_clause_and_session_close_speaks_what_was_flushed():
    async with running_voice_server(RILL_TINY_DIR) as server, open_websocket_url(ws_url(server)) as ws:
        await send(ws, {**CONFIG, "response_format": "wav", "split_granularity": "sentence", "speed": 1.5})
        await send(ws, {"type": "input.text", "text": TEXT})
        await send(ws, {"type": "input.done"})
        await send(ws, {"type": "session.close"})
        events, frames = await read_utterance(ws)
        assert [e["sentence_text"] for e in events if e["type"] == "audio.start"] == [
            "The first clause is here, and the second one follows it.", "Then comes the end."]
        assert len(frames) == 2
        for frame in frames:
            audio, rate = sf.read(io.BytesIO(frame))
            assert rate == 24000 and len(audio) / rate > 0.3
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
        assert closed.value.reason.code == 1000


@needs_voice
async def test_message_and_utterance_limits_at_and_past():
    async with running_voice_server(RILL_TINY_DIR) as server, open_websocket_url(ws_url(server)) as ws:
        await send(ws, CONFIG)
        head = '{"type":"input.text","text":"Hi.'
        at_limit = head + " " * (MAX_MESSAGE_BYTES - len(head) - 2) + '"}'
        await ws.send_message(at_limit)  # taken: no error
        await ws.send_message(at_limit[:-2] + ' "}')  # one byte past
        error = await next_error(ws)
        assert (error["type"], error["code"]) == ("error", "message_too_large")
        taken = len(json.loads(at_limit)["text"])
        rest = MAX_UTTERANCE_CHARS - taken
        for i in range(0, rest, 8000):  # the utterance exactly at its limit, in messages under theirs
            await send(ws, {"type": "input.text", "text": " " * min(8000, rest - i)})
        await send(ws, {"type": "input.text", "text": " "})  # one character past
        error = await next_error(ws)
        assert (error["code"], error["param"]) == ("text_too_long", "text")
        await send(ws, {"type": "input.done"})  # the connection goes on: the utterance says "Hi."
        events, _ = await read_utterance(ws)
        assert events[-1]["total_sentences"] == 1  # "Hi." (its audio may have come before the errors)


@needs_voice
async def test_bad_messages_are_error_events_and_a_bad_start_closes():
    async with running_voice_server(RILL_TINY_DIR) as server:
        url = ws_url(server)
        async with open_websocket_url(url) as ws:
            await send(ws, {"type": "input.text", "text": "no config first"})
            error = await next_event(ws)
            assert error["code"] == "missing_session_config"
            with pytest.raises(ConnectionClosed) as closed:
                await ws.get_message()
            assert closed.value.reason.code == 1008
        async with open_websocket_url(url) as ws:
            await send(ws, {**CONFIG, "voice": "nobody"})
            error = await next_event(ws)
            assert error["param"] == "voice"
            with pytest.raises(ConnectionClosed):
                await ws.get_message()
        async with open_websocket_url(url) as ws:
            await send(ws, CONFIG)
            await ws.send_message("not json")
            assert (await next_event(ws))["code"] == "invalid_json"
            await send(ws, {"type": "input.text", "text": 5})
            assert (await next_event(ws))["param"] == "text"
            await send(ws, {**CONFIG, "model": "no-such-voice"})
            assert (await next_event(ws))["code"] == "model_not_found"
            await send(ws, {"type": "what"})
            assert (await next_event(ws))["code"] == "unknown_event"
            await send(ws, {"type": "input.text", "text": "Still here."})
            await send(ws, {"type": "input.done"})
            events, _ = await read_utterance(ws)
            assert events[-1]["total_sentences"] == 1


@needs_voice
async def test_a_client_that_sends_no_config_is_closed_after_the_timeout(monkeypatch):
    monkeypatch.setattr(speech_stream_ws, "CONFIG_TIMEOUT_S", 0.3)
    async with running_voice_server(RILL_TINY_DIR) as server, open_websocket_url(ws_url(server)) as ws:
        with trio.fail_after(10):
            error = await next_event(ws)
        assert error["code"] == "idle_timeout"
        with pytest.raises(ConnectionClosed):
            await ws.get_message()


@needs_voice
async def test_a_client_that_leaves_mid_utterance_leaves_nothing_on_the_worker():
    async with running_voice_server(RILL_TINY_DIR) as server:
        out = server.app.extensions["rill"].speech_out
        async with open_websocket_url(ws_url(server)) as ws:
            await send(ws, CONFIG)
            await send(ws, {"type": "input.text", "text": TEXT * 5})  # clauses queued, none flushed
            with trio.fail_after(30):
                assert (await next_event(ws))["type"] == "audio.start"
        await wait_for(lambda: out.num_requests == 0 and out.num_queued == 0, 10)


@needs_voice
async def test_an_idle_client_is_told_and_closed_after_the_idle_timeout(monkeypatch):
    monkeypatch.setattr(speech_stream_ws, "IDLE_TIMEOUT_S", 0.5)
    async with running_voice_server(RILL_TINY_DIR) as server, open_websocket_url(ws_url(server)) as ws:
        await send(ws, CONFIG)
        await send(ws, {"type": "input.text", "text": "Said while the client waits."})
        await send(ws, {"type": "input.done"})
        events, _ = await read_utterance(ws)
        assert events[-1]["total_sentences"] == 1
        with trio.fail_after(10):
            error = await next_error(ws)
        assert error["code"] == "idle_timeout"
        with pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
        assert closed.value.reason.code == 1000
