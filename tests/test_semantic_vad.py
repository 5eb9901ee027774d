"""semantic_vad (rill.speech.semantic_vad): session.update takes it with each eagerness and refuses bad values
in OpenAI's error shape; over a live server with real speech (espeak-ng -> rill-tiny-speech, read by
rill-tiny) a question cut mid-phrase waits through its pause and stays one turn; with the scorer's answer
forced (fault injection) words that sound finished commit sooner than server_vad's silence, and no
answer leaves the turn to the eagerness's cap. Whether rill-tiny reads a finished question as finished
depends on the words the recogniser writes ("What is 12 + 30?" yes, "What is 12 plus 30?" no): its
figures are `rill bench turn-detection`'s, not a test's.

Silence after the speech is sent at a slow pace (`SLOW`: 4 x 100 ms of audio per real second) and each
commit is timed by the audio sent before it, not by the clock: the policy is about how much silence
it takes, and a busy test machine must not turn that into a race."""

from __future__ import annotations

import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_voice import needs_espeak, of_type, silence, speak, voice_client, voice_server
from helpers_whisper import make_whisper_dir
from rill.speech.async_speech import speech_model_available
from rill.speech.semantic_vad import FINISHED_AT, ends_turn, max_wait_ms
from rill.speech.vad import TurnDetection
from rill.transports.realtime.turn_end import TurnEndScorer

pytestmark = needs_espeak
needs_tiny_speech = pytest.mark.skipif(not speech_model_available("rill-tiny-speech"),
                                       reason="rill-tiny-speech is not in this build")
CHUNK_S = 0.1
SLOW = 0.4  # silence sent at 0.4 x real time


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=False, max_source_positions=250,
                            max_target_positions=64)


# -- the policy's numbers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("eagerness,cap_ms", [("low", 8000), ("medium", 4000), ("high", 2000), ("auto", 4000)])
def test_each_eagerness_waits_at_most_openais_cap(eagerness, cap_ms):
    turn = TurnDetection.semantic(eagerness)
    assert turn.is_semantic and turn.silence_duration_ms == max_wait_ms(eagerness) == cap_ms
    assert turn.prefix_padding_ms == 300 and turn.create_response and turn.interrupt_response


def test_a_lower_eagerness_needs_more_certainty_and_no_answer_never_ends_a_turn():
    assert FINISHED_AT["high"] < FINISHED_AT["medium"] < FINISHED_AT["low"]
    assert ends_turn("auto", FINISHED_AT["medium"]) and not ends_turn("auto", FINISHED_AT["medium"] - 1e-3)
    assert ends_turn("high", 0.5) and not ends_turn("low", 0.5)
    assert not ends_turn("high", None)  # the scorer failed: the cap decides
    with pytest.raises(ValueError, match="eagerness"):
        TurnDetection.semantic("eager")


# -- session.update -------------------------------------------------------------------------------------------


async def test_session_update_takes_semantic_vad_in_both_forms_and_shows_it(llm_dir, speech_dir):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        beta = await client.update(turn_detection={"type": "semantic_vad"})  # the beta field, GA's session shape
        assert beta["audio"]["input"]["turn_detection"] == {"type": "semantic_vad", "eagerness": "auto",
                                                            "create_response": True, "interrupt_response": True}
        for eagerness in ("low", "medium", "high", "auto"):
            ga = await client.update(type="realtime", audio={"input": {"turn_detection": {
                "type": "semantic_vad", "eagerness": eagerness, "create_response": False}}})
            assert ga["audio"]["input"]["turn_detection"] == {"type": "semantic_vad", "eagerness": eagerness,
                                                              "create_response": False, "interrupt_response": True}
        back = await client.update(turn_detection={"type": "server_vad"})
        back = back["audio"]["input"]["turn_detection"]
        assert back["type"] == "server_vad" and "eagerness" not in back


BAD_SETTINGS = [
    ({"type": "semantic_vad", "eagerness": "eager"}, "session.turn_detection.eagerness"),
    ({"type": "semantic_vad", "eagerness": ""}, "session.turn_detection.eagerness"),
    ({"type": "semantic_vad", "silence_duration_ms": 300}, "session.turn_detection.silence_duration_ms"),
    ({"type": "server_vad", "eagerness": "high"}, "session.turn_detection.eagerness"),
]


async def test_bad_semantic_settings_get_one_invalid_value_error_each_and_change_nothing(llm_dir, speech_dir):
    async with voice_server(llm_dir, speech_dir) as server, voice_client(server) as client:
        for turn_detection, param in BAD_SETTINGS:
            event_id = await client.send("session.update", session={"turn_detection": turn_detection,
                                                                    "instructions": "Be brief."})
            error = await client.recv()
            assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error", error
            assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == param, error
            assert error["error"]["event_id"] == event_id
            still = await client.update()
            assert still["audio"]["input"]["turn_detection"]["type"] == "server_vad" and not still.get("instructions")


# -- turns, with the shipped models ----------------------------------------------------------------------------


async def speak_then_wait(client, audio, max_silence_s: float) -> float | None:
    """Stream `audio` at real time, then silence slowly until a commit comes: the seconds of silence
    sent before it (None: none within max_silence_s)."""
    await client.stream(silence(0.3))
    await client.stream(audio)
    sent = 0.0
    while sent < max_silence_s:
        if any(e["type"] == "input_audio_buffer.committed" for _, e in client.log):
            return sent
        await client.stream(silence(CHUNK_S))
        sent += CHUNK_S
        await trio.sleep(CHUNK_S / SLOW - CHUNK_S)
    return None


def committed(client) -> list[dict]:
    return [e for _, e in client.log if e["type"] == "input_audio_buffer.committed"]


def scorer_says(monkeypatch, probability: float | None) -> None:
    """Fault injection: every end-of-turn question gets `probability` (None: the engine gave no answer)."""
    async def fixed(self, text: str) -> float | None:
        self.num_requests += 1
        return probability

    monkeypatch.setattr(TurnEndScorer, "__call__", fixed)


async def semantic_session(server, **fields):
    client_cm = voice_client(server)
    client = await client_cm.__aenter__()
    await client.update(turn_detection={"type": "semantic_vad", "create_response": False, **fields})
    return client_cm, client


@needs_tiny_speech
async def test_a_cut_question_waits_through_its_pause_and_stays_one_turn(one_torch_thread):
    """rill-tiny as shipped reads "What is 12 plus" as unfinished (P(end of turn) 0.27 < 0.5)."""
    async with voice_server("rill-tiny", "rill-tiny-speech") as server:
        client_cm, client = await semantic_session(server)
        try:
            await client.stream(silence(0.3))
            await client.stream(speak("What is twelve plus"))
            await client.stream(silence(1.2), pace=SLOW)
            assert committed(client) == []  # server_vad would have committed at 0.5 s
            await client.stream(speak("thirty?"))
            await client.stream(silence(4.5), pace=float("inf"))  # rill-tiny may not know it is finished: the cap
            events = await client.until("conversation.item.input_audio_transcription.completed")
        finally:
            await client_cm.__aexit__(None, None, None)
        assert len(committed(client)) == 1
        transcript = of_type(events, "conversation.item.input_audio_transcription.completed")[0]["transcript"]
        assert transcript.startswith("What is 12"), transcript
        await wait_for(lambda: server.all_kv_free and server.num_connections == 0)


@needs_tiny_speech
async def test_words_that_sound_finished_commit_after_a_shorter_silence_than_server_vad_with_a_forced_sure_scorer(
        monkeypatch, one_torch_thread):
    scorer_says(monkeypatch, 0.99)
    async with voice_server("rill-tiny", "rill-tiny-speech") as server:
        client_cm, client = await semantic_session(server, eagerness="low")
        try:
            waited = await speak_then_wait(client, speak("What is twelve plus thirty?"), 2.0)
            events = await client.until("conversation.item.input_audio_transcription.completed")
        finally:
            await client_cm.__aexit__(None, None, None)
    assert waited is not None and waited < 0.5, waited  # server_vad needs its 500 ms of silence
    stopped = of_type([e for _, e in client.log], "input_audio_buffer.speech_stopped")
    assert len(stopped) == 1 and len(committed(client)) == 1
    assert "12" in of_type(events, "conversation.item.input_audio_transcription.completed")[0]["transcript"]


@needs_tiny_speech
async def test_without_an_answer_the_turn_ends_at_the_eagerness_cap_fault_injection(monkeypatch, one_torch_thread):
    scorer_says(monkeypatch, None)
    cap_s = 2.0  # high's; the others' caps: test_each_eagerness_waits_at_most_openais_cap
    async with voice_server("rill-tiny", "rill-tiny-speech") as server:
        client_cm, client = await semantic_session(server, eagerness="high")
        try:
            waited = await speak_then_wait(client, speak("What is twelve plus thirty?"), cap_s + 1.0)
            await client.until("conversation.item.input_audio_transcription.completed")
        finally:
            await client_cm.__aexit__(None, None, None)
    assert waited is not None and cap_s <= waited < cap_s + 0.6, waited
    assert len(committed(client)) == 1
