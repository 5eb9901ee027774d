"""Realtime voice on both listeners: audio appended at real-time pace over /v1/realtime and the raw
listener, the recogniser's events, turns by server VAD or manual commit, the transcript streamed into
the user turn, barge-in, transcription-only sessions (OpenAI's and vLLM's flows), bad audio.

The plumbing runs on random-weight models (a Whisper with rill-tiny-speech's 5 s window and a small
LLM), so answers are checked against the engine's own greedy answer to the transcript the server
reported; meaning (a spoken question answered) is tested with rill-tiny-speech + rill-tiny at the end."""

from __future__ import annotations

import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_voice import (needs_espeak, of_type, pcm16_b64, silence, speak, voice_client, voice_server)
from helpers_whisper import make_whisper_dir
from rill.sampling_params import SamplingParams
from rill.speech.async_speech import speech_model_available

pytestmark = needs_espeak


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(scope="module")
def endless_llm_dir(tmp_path_factory):
    """An LLM whose greedy answer never ends on its own: a barge-in must be what stops it."""
    return make_model_dir(tmp_path_factory.mktemp("endless"), "mistral", endless=True)


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=False, max_source_positions=250,
                            max_target_positions=64)


@pytest.fixture(scope="module")
def question():
    return speak("What is twelve plus thirty?")


@pytest.fixture(params=["http", "raw"])
def listener(request) -> str:
    return request.param


async def engine_answer(server, text: str, max_tokens: int) -> str:
    prompt = server.engine.tokenizer.encode_chat([{"role": "user", "content": text}])
    out = ""
    async for delta in server.engine.generate(prompt, SamplingParams(temperature=0, max_tokens=max_tokens)):
        out += delta.text
    return out


# -- session settings ---------------------------------------------------------------------------------------


async def test_session_shows_server_vad_by_default_and_takes_both_update_forms(llm_dir, speech_dir):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        ga = await client.update(type="realtime", audio={"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 800},
            "transcription": {"model": str(speech_dir), "language": "en"}}})
        assert ga["audio"]["input"]["turn_detection"] == {"type": "server_vad", "threshold": 0.5,
                                                          "prefix_padding_ms": 300, "silence_duration_ms": 800,
                                                          "create_response": True, "interrupt_response": True}
        assert ga["audio"]["input"]["transcription"] == {"model": str(speech_dir), "language": "en"}
        assert "turn_detection" not in ga and "input_audio_transcription" not in ga  # the beta's places
        beta = await client.update(turn_detection=None, input_audio_transcription={"prompt": "arithmetic"})
        assert beta["audio"]["input"]["turn_detection"] is None  # the beta form updates a GA session too
        assert beta["audio"]["input"]["transcription"] == {"model": str(speech_dir), "language": "en",
                                                           "prompt": "arithmetic"}
        kept = await client.update(instructions="Be brief.")  # left out: kept
        assert kept["audio"]["input"]["turn_detection"] is None


@pytest.mark.parametrize("session,param", [
    ({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}, "session.turn_detection.eagerness"),
    ({"turn_detection": {"type": "server_vad", "threshold": 2}}, "session.turn_detection.threshold"),
    ({"audio": {"input": {"turn_detection": {"silence_duration_ms": 5}}}}, "session.turn_detection.silence_duration_ms"),
    ({"input_audio_transcription": {"model": "no-such-transcriber"}}, "session.input_audio_transcription.model"),
    ({"input_audio_transcription": {"language": "fr"}}, "language"),  # the test model is English-only
])
async def test_bad_voice_settings_get_one_error_and_change_nothing(llm_dir, speech_dir, session, param):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        await client.send("session.update", session=session)
        error = (await client.recv())["error"]
        assert error["param"] == param, error
        assert error["message"].endswith("(this session.update was not applied: nothing in it changed)")
        still = (await client.update())["audio"]["input"]["turn_detection"]
        assert still["type"] == "server_vad" and still["threshold"] == 0.5


# -- turns ------------------------------------------------------------------------------------------------


async def test_server_vad_turn_is_transcribed_committed_and_answered(llm_dir, speech_dir, question, listener):
    async with voice_server(llm_dir, speech_dir) as server:
        async with voice_client(server, listener) as client:
            await client.update(temperature=0, max_output_tokens=5)
            await client.stream(silence(0.4))
            await client.stream(question)
            await client.stream(silence(1.0))
            events = await client.until("response.done")
        types = [e["type"] for e in events]
        started, stopped = of_type(events, "input_audio_buffer.speech_started"), \
            of_type(events, "input_audio_buffer.speech_stopped")
        assert len(started) == len(stopped) == 1
        item_id = started[0]["item_id"]
        assert stopped[0]["item_id"] == item_id and abs(started[0]["audio_start_ms"] - 100) <= 100
        assert types.index("input_audio_buffer.speech_started") < types.index("input_audio_buffer.committed") \
            < types.index("response.created")
        deltas = of_type(events, "conversation.item.input_audio_transcription.delta")
        assert not of_type(events, "transcription.delta")  # vLLM's event: for sessions opened vLLM's way only
        (completed,) = of_type(events, "conversation.item.input_audio_transcription.completed")
        transcript = completed["transcript"]
        assert transcript == "".join(d["delta"] for d in deltas) and completed["item_id"] == item_id
        assert 1.0 < completed["usage"]["seconds"] < 3.5 and completed["usage"]["type"] == "duration"
        (created,) = [e for e in of_type(events, "conversation.item.added") if e["item"]["role"] == "user"]
        assert created["item"]["id"] == item_id
        assert created["item"]["content"] == [{"type": "input_audio", "transcript": transcript}]
        answer = "".join(d["delta"] for d in of_type(events, "response.output_text.delta"))
        assert answer == await engine_answer(server, transcript, 5)
        await wait_for(lambda: server.all_kv_free and server.num_connections == 0 and server.speech.num_requests == 0)


async def test_manual_commit_turn_then_response_create(llm_dir, speech_dir, question, listener):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server, listener) as client:
        await client.update(turn_detection=None, temperature=0, max_output_tokens=4)
        await client.stream(question, pace=float("inf"))  # faster than real time is fine
        await client.send("input_audio_buffer.commit")
        events = await client.until("conversation.item.input_audio_transcription.completed")
        assert not of_type(events, "input_audio_buffer.speech_started")  # no VAD events without turn detection
        assert of_type(events, "input_audio_buffer.committed")
        transcript = events[-1]["transcript"]
        await client.send("response.create")
        answer = await client.until("response.done")
        assert "".join(d["delta"] for d in of_type(answer, "response.output_text.delta")) == \
            await engine_answer(server, transcript, 4)


async def test_response_create_right_after_commit_answers_the_committed_audio(llm_dir, speech_dir, question):
    """As OpenAI's clients do it: commit and response.create back to back; the answer waits for the words."""
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        await client.update(turn_detection=None, temperature=0, max_output_tokens=3)
        await client.stream(question, pace=float("inf"))
        await client.send("input_audio_buffer.commit")
        await client.send("response.create")
        events = await client.until("response.done")
        assert not of_type(events, "error")
        types = [e["type"] for e in events]
        assert types.index("conversation.item.input_audio_transcription.completed") < types.index("response.created")
        transcript = of_type(events, "conversation.item.input_audio_transcription.completed")[0]["transcript"]
        assert "".join(d["delta"] for d in of_type(events, "response.output_text.delta")) == \
            await engine_answer(server, transcript, 3)


async def test_an_item_with_input_audio_is_transcribed_before_it_joins(llm_dir, speech_dir, question, listener):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server, listener) as client:
        await client.update(temperature=0, max_output_tokens=3)
        await client.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": pcm16_b64(question)}]})
        await client.send("response.create")  # waits for the item's transcript
        events = await client.until("response.done")
        assert not of_type(events, "error")
        (created,) = [e for e in of_type(events, "conversation.item.added") if e["item"]["role"] == "user"]
        (completed,) = of_type(events, "conversation.item.input_audio_transcription.completed")
        transcript = completed["transcript"]
        assert created["item"]["content"] == [{"type": "input_audio", "transcript": transcript}]  # no audio kept
        assert completed["item_id"] == created["item"]["id"] and completed["usage"]["seconds"] > 1.0
        assert "".join(d["delta"] for d in of_type(events, "response.output_text.delta")) == \
            await engine_answer(server, transcript, 3)


async def test_commit_of_an_empty_buffer_is_an_error_and_the_connection_lives(llm_dir, speech_dir):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        await client.send("input_audio_buffer.commit")
        assert (await client.recv())["error"]["code"] == "input_audio_buffer_commit_empty"
        await client.send("input_audio_buffer.clear")
        assert (await client.recv())["type"] == "input_audio_buffer.cleared"


@pytest.mark.parametrize("audio,code", [("%%%not base64", "invalid_audio"), ("AAEC", "invalid_audio"),
                                        (pcm16_b64(silence(16.0)), "audio_too_large")])
async def test_malformed_or_oversized_audio_gets_one_error_and_the_connection_lives(llm_dir, speech_dir, question,
                                                                                   audio, code):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        await client.update(turn_detection=None)
        event_id = await client.send("input_audio_buffer.append", audio=audio)
        error = (await client.recv())["error"]
        assert (error["code"], error["event_id"]) == (code, event_id)
        await client.stream(question, pace=float("inf"))
        await client.send("input_audio_buffer.commit")
        done = await client.until("conversation.item.input_audio_transcription.completed")
        assert not of_type(done, "error")


async def test_barge_in_cancels_the_answer_in_flight(endless_llm_dir, speech_dir, question, listener):
    async with voice_server(endless_llm_dir, speech_dir) as server, voice_client(server, listener) as client:
        await client.update(temperature=0, max_output_tokens=900)  # the test model's context is 1024
        await client.stream(question)
        await client.stream(silence(0.8))
        await client.until("response.created")
        await client.until("response.output_text.delta")
        await client.stream(question, pace=4.0)  # the user talks over the answer
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] == "cancelled"
        assert events[-1]["response"]["status_details"]["reason"] == "turn_detected"
        assert of_type(events, "input_audio_buffer.speech_started")
        await client.update(max_output_tokens=8)  # the first turn leaves the context if the second needs its room
        await client.stream(silence(0.8))
        second = await client.until("response.done")  # the new turn is answered in its turn
        assert of_type(second, "input_audio_buffer.committed") and second[-1]["response"]["status"] != "failed"


async def test_interrupt_response_false_lets_the_answer_finish(llm_dir, speech_dir, question):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        await client.update(temperature=0, max_output_tokens=60,
                            turn_detection={"type": "server_vad", "interrupt_response": False,
                                            "create_response": False})
        await client.stream(question)
        await client.stream(silence(0.8))
        await client.until("conversation.item.input_audio_transcription.completed")
        await client.send("response.create")
        await client.until("response.created")
        await client.stream(question, pace=4.0)
        events = await client.until("response.done")
        assert events[-1]["response"]["status"] in ("completed", "incomplete")


# -- transcription sessions ---------------------------------------------------------------------------------


async def test_transcription_session_transcribes_and_never_answers(llm_dir, speech_dir, question, listener):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server, listener) as client:
        session = await client.update(type="transcription")
        assert session["type"] == "transcription"
        await client.stream(question)
        await client.stream(silence(1.0))
        events = await client.until("conversation.item.input_audio_transcription.completed")
        assert of_type(events, "input_audio_buffer.committed")
        await trio.sleep(0.5)
        await client.send("input_audio_buffer.clear")
        later = await client.until("input_audio_buffer.cleared")
        assert not of_type(events + later, "response.created")
        assert not server.engine.core.requests


async def test_vllm_flow_model_commit_append_final(llm_dir, speech_dir, question, listener):
    """vLLM's client: session.update with the speech model, an opening commit, appends, commit final."""
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server, listener) as client:
        await client.send("session.update", model=str(speech_dir))
        assert (await client.recv())["session"]["type"] == "transcription"
        await client.send("input_audio_buffer.commit")  # vLLM starts so; no error
        await client.stream(question, pace=float("inf"))
        await client.send("input_audio_buffer.commit", final=True)
        events = await client.until("transcription.done")
        assert not of_type(events, "error")
        text = "".join(e["delta"] for e in of_type(events, "transcription.delta"))
        assert events[-1]["text"] == text.strip()


async def test_audio_without_a_speech_model_is_refused_clearly(llm_dir, question):
    async with voice_server(llm_dir, None) as server, voice_client(server) as client:
        await client.send("input_audio_buffer.append", audio=pcm16_b64(question[:1600]))
        assert (await client.recv())["error"]["code"] == "audio_not_supported"
        await client.send("input_audio_buffer.commit")
        assert (await client.recv())["error"]["code"] == "audio_not_supported"
        await client.send("conversation.item.create", item={
            "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": pcm16_b64(question)}]})
        assert (await client.recv())["error"]["code"] == "audio_not_supported"


# -- meaning, with the shipped models ------------------------------------------------------------------------

needs_tiny_speech = pytest.mark.skipif(not speech_model_available("rill-tiny-speech"),
                                       reason="rill-tiny-speech is not in this build")


@needs_tiny_speech
async def test_spoken_question_is_answered_with_42_and_deltas_come_before_the_speech_ends(listener):
    audio = speak("What is twelve plus thirty?", rate_wpm=140)
    async with voice_server("rill-tiny", "rill-tiny-speech") as server, voice_client(server, listener) as client:
        await client.update(temperature=0, max_output_tokens=48)
        await client.stream(silence(0.3))
        speech_end = await client.stream(audio)
        await client.stream(silence(1.0))
        events = await client.until("response.done")
    deltas = [t for t, e in client.log if e["type"] == "conversation.item.input_audio_transcription.delta"]
    assert deltas and deltas[0] < speech_end  # words are out while the user still speaks
    transcript = of_type(events, "conversation.item.input_audio_transcription.completed")[0]["transcript"]
    answer = "".join(d["delta"] for d in of_type(events, "response.output_text.delta"))
    assert "12" in transcript and "30" in transcript, transcript
    assert "42" in answer, (transcript, answer)
