"""A Voxtral Realtime stream's end that stops early, and the delay as a server setting (issue 56).

The early stop is checked on the shipped rill-tiny-causal with espeak-ng speech (a random model writes words
anywhere, so the transformers-parity tests keep the full padding): the same text as mistral-common's
whole right padding, in fewer decoder steps, on the file path and the live commit path alike. The delay
goes `RILL_SPEECH_DELAY_MS` -> `rill serve`'s parser -> serve() on a real hypercorn server on 127.0.0.1
(/v1/audio/transcriptions through the openai SDK, a realtime transcription session through a websocket);
a delay a model cannot take is refused at startup, before any model loads."""

from __future__ import annotations

import io
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np
import openai
import pytest
import soundfile
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread  # noqa: F401
from helpers_voice import needs_espeak, of_type, pcm16_b64, silence, speak, voice_client
from rill import cli
from rill.config import EngineConfig
from rill.server import serve
from rill.speech.async_speech import speech_model_available
from rill.speech.causal import LiveStreams
from rill.speech.voxtral_realtime import VoxtralStream, load_voxtral_realtime
from rill.speech.voxtral_realtime.live import VoxtralCausal
from rill.speech.whisper import RILL_TINY_CAUSAL, RILL_TINY_SPEECH, speech_model_path
from rill.transports.http import ServerConfig
from rill.transports.realtime.audio_input import decode_pcm16
from rill.transports.realtime.driver import RealtimeConfig
from rill.transports.realtime.turn_end import TurnEndScorer

pytestmark = needs_espeak

RATE = 16_000
QUESTIONS = ("What is rill?", "Add 558 and 1.", "Reverse the word helium.", "How much is 18 - 8?")
COMPLETED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def runtime():
    return load_voxtral_realtime(speech_model_path(RILL_TINY_CAUSAL))


@pytest.fixture(scope="module")
def clips():
    return [speak(q) for q in QUESTIONS]


def alone(runtime, audio: np.ndarray, **stream_kwargs) -> tuple[str, int, VoxtralStream]:
    """The stream's text and the decoder steps its end ran (after all the audio had been fed)."""
    stream = VoxtralStream(runtime, RATE, **stream_kwargs)
    text = stream.feed(audio).text
    fed = stream.num_positions
    text += stream.finish().text
    return text, stream.num_positions - fed, stream


def test_early_stop_writes_the_full_padding_text_in_fewer_steps(runtime, clips):
    num_full = num_early = 0
    for audio in clips:
        full, full_steps, _ = alone(runtime, audio)
        early, early_steps, stream = alone(runtime, audio, early_stop=True)
        assert early == full and full.strip()
        assert full_steps == runtime.audio.num_delay_tokens() + 1 + 10  # mistral-common's right padding
        assert early_steps <= full_steps
        if stream.stopped_early:  # at the first pad written once the audio's end plus the delay and a frame
            assert stream.num_positions - 1 >= stream.stop_position  # was heard
            assert stream._last_token == runtime.tokenizer.streaming_pad_id
        num_full, num_early = num_full + full_steps, num_early + early_steps
    assert num_early < 0.8 * num_full  # the shipped weights' last words are out soon after the stop


def test_the_full_padding_stays_the_default_of_a_stream_and_of_a_core(runtime, clips):
    from rill.speech.voxtral_realtime.core import VoxtralCore

    _, _, stream = alone(runtime, clips[0])
    assert not stream.early_stop and not stream.stopped_early
    assert not VoxtralCore(runtime).early_stop


def live_transcript(runtime, audio: np.ndarray, early_stop: bool) -> tuple[str, int, int]:
    """A live stream on the worker's LiveStreams, fed 100 ms at a time, then ended (a commit): its text,
    its decoder steps and the worker steps the end took."""
    live = LiveStreams(VoxtralCausal(runtime, early_stop=early_stop))
    live.open("s", RATE)
    text, piece = "", RATE // 10
    for start in range(0, len(audio), piece):
        live.feed("s", audio[start:start + piece])
        text += "".join(d.text for d in live.step())
    while live.has_work():  # the audio fed so far, as a live stream has heard it by the commit
        text += "".join(d.text for d in live.step())
    live.end("s")
    for end_steps in range(1, 20):
        deltas = live.step()
        text += "".join(d.text for d in deltas)
        if done := [d.finished for d in deltas if d.finished is not None]:
            assert not live.num_live  # nothing left behind
            return text, done[0].num_steps, end_steps
    raise AssertionError("the stream did not finish")


def test_a_live_commit_stops_early_and_writes_what_the_file_path_writes(runtime, clips):
    at_the_stop = 0
    for audio in clips[:2]:
        expected, _, stream = alone(runtime, audio, early_stop=True)
        text, num_steps, end_steps = live_transcript(runtime, audio, early_stop=True)
        full_text, full_num_steps, full_end_steps = live_transcript(runtime, audio, early_stop=False)
        assert text == expected == full_text and num_steps == stream.num_positions
        assert num_steps < full_num_steps and end_steps <= full_end_steps
        if stream.num_positions - 1 == stream.stop_position:  # the last word was out by then:
            at_the_stop += 1
            assert end_steps == 1 < full_end_steps  # the frames up to the stop ran in one worker step
    assert at_the_stop  # "What is rill?"


# -- the delay as a server setting ---------------------------------------------------------------------------


def serve_args(monkeypatch, *argv: str):
    """`rill serve ARGV` as the CLI parses it, RILL_* read from the environment when the parser is built."""
    monkeypatch.setenv("RILL_SPEECH_DELAY_MS", "160")
    return cli.build_parser().parse_args(["serve", *argv])


def test_the_cli_takes_the_delay_and_the_switch_from_flags_and_env(monkeypatch):
    args = serve_args(monkeypatch, "--speech-model", RILL_TINY_CAUSAL)
    assert cli.speech_serve_options(args) == {"speech_delay_ms": 160.0, "speech_early_stop": True}
    args = serve_args(monkeypatch, "--speech-model", RILL_TINY_CAUSAL, "--speech-delay-ms", "240",
                      "--no-speech-early-stop")
    assert cli.speech_serve_options(args) == {"speech_delay_ms": 240.0, "speech_early_stop": False}
    monkeypatch.setenv("RILL_NO_SPEECH_EARLY_STOP", "1")
    monkeypatch.delenv("RILL_SPEECH_DELAY_MS")
    args = cli.build_parser().parse_args(["serve", "--speech-model", RILL_TINY_CAUSAL])
    assert cli.speech_serve_options(args) == {"speech_delay_ms": None, "speech_early_stop": False}


@pytest.mark.parametrize("argv, message", [
    (["--speech-model", RILL_TINY_CAUSAL, "--speech-delay-ms", "100"], "not a positive multiple of 80"),
    (["--speech-model", RILL_TINY_CAUSAL, "--speech-delay-ms", "0"], "not a positive multiple of 80"),
    (["--speech-model", RILL_TINY_CAUSAL, "--speech-delay-ms", "-80"], "not a positive multiple of 80"),
    (["--speech-model", RILL_TINY_SPEECH, "--speech-delay-ms", "480"], "fixed by its weights"),
])
def test_a_delay_the_model_cannot_take_fails_at_startup(argv, message, capsys):
    if RILL_TINY_SPEECH in argv and not speech_model_available(RILL_TINY_SPEECH):
        pytest.skip("rill-tiny-speech is not in this build")
    assert cli.main(["serve", "--port", "0", "--tts-model", "none", *argv]) == 2  # before any model loads
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rill: error:") and message in err[0], err


def test_a_kyutai_model_refuses_the_delay(tmp_path):
    from helpers_kyutai import make_kyutai_dir
    from rill.errors import ModelLoadError
    from rill.speech.async_speech import check_speech_delay, speech_core

    kyutai = make_kyutai_dir(tmp_path / "kyutai")
    with pytest.raises(ModelLoadError, match="fixed by its weights"):
        check_speech_delay(str(kyutai), 480)
    with pytest.raises(ModelLoadError, match="fixed by its weights"):  # serve() built without the CLI's check
        speech_core(kyutai, delay_ms=480)
    assert speech_core(kyutai, early_stop=True).live is not None  # the switch alone is harmless


@dataclass
class Served:
    url: str

    def realtime_url(self, listener: str) -> str:
        return self.url.replace("http://", "ws://") + "/v1/realtime"


@asynccontextmanager
async def served(llm_dir, args):
    """serve() as `rill serve` runs it with the parsed speech options, on 127.0.0.1."""
    config = EngineConfig(model=str(llm_dir), num_kv_blocks=64)
    server = ServerConfig(realtime=RealtimeConfig(audio_rate_hz=RATE))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve(
            config, server, "127.0.0.1", 0, 1.0, speech_model=args.speech_model, tts_model=None,
            **cli.speech_serve_options(args), shutdown_trigger=stop.wait, task_status=task_status))
        try:
            yield Served(binds[0])
        finally:
            stop.set()


async def test_rill_serve_transcribes_at_the_delay_it_was_given(monkeypatch, tmp_path, runtime, clips):
    """RILL_SPEECH_DELAY_MS=160: the upload's tokens and a realtime commit's transcript are a 160 ms stream's
    with the early stop, not those of a stream at the model's default delay (80 ms)."""
    llm_dir = make_model_dir(tmp_path / "qwen2", "qwen2")
    args = serve_args(monkeypatch, "--speech-model", RILL_TINY_CAUSAL)
    audio = clips[2]  # a clip whose tokens differ between the delays (a well-conditioned model often writes
    # the same tokens at both, each a delay after its audio)
    buffer = io.BytesIO()
    soundfile.write(buffer, audio, RATE, format="WAV", subtype="FLOAT")
    async with served(llm_dir, args) as server:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        verbose = await client.audio.transcriptions.create(model=RILL_TINY_CAUSAL, file=("q.wav", buffer.getvalue()),
                                                           response_format="verbose_json")
        await client.close()
        async with voice_client(server) as ws:
            await ws.update(type="transcription", audio={"input": {
                "transcription": {"model": RILL_TINY_CAUSAL}, "turn_detection": None}})
            await ws.stream(audio, 0.1, float("inf"))
            await ws.send("input_audio_buffer.commit")
            events = await ws.until(COMPLETED)
    stream = VoxtralStream(runtime, RATE, delay_ms=160, early_stop=True)
    tokens = stream.feed(audio).token_ids + stream.finish().token_ids
    assert stream.num_delay_tokens == 2 and sum((s.tokens for s in verbose.segments), []) == tokens
    at_default = VoxtralStream(runtime, RATE, early_stop=True)
    assert at_default.num_delay_tokens == 1
    assert tokens != at_default.feed(audio).token_ids + at_default.finish().token_ids
    wire = decode_pcm16(pcm16_b64(audio), len(audio))
    expected = alone(runtime, wire, delay_ms=160, early_stop=True)[0].strip()
    assert of_type(events, COMPLETED)[0]["transcript"] == expected


@pytest.mark.parametrize("after_s", [2.0, 0.6], ids=["client-sends-silence", "client-stops-after-the-vad-silence"])
async def test_a_server_vad_turn_ends_after_the_word_in_flight(monkeypatch, tmp_path, runtime, after_s):
    """server_vad ends a turn at the step that hears the end of speech plus the delay and a frame; a word still
    being written there (a spelled-out word: a token a frame, past that step) holds the turn's end
    until the word is whole, so the turn's transcript is the whole recording's and not cut inside its last
    word (it was: 'Reverse the word "zi'). A client that stops sending once the VAD's 500 ms of silence are
    out gets the rest of the hold filled with silence: the turn still completes, with the same words. The
    server runs at serve_args' 160 ms, so the reference is a 160 ms stream."""
    transcript, expected = await spelled_question_turn(
        monkeypatch, tmp_path, runtime, {"type": "server_vad", "silence_duration_ms": 500}, after_s)
    assert transcript == expected


async def test_a_semantic_vad_turn_is_asked_about_and_ends_after_the_word_in_flight_with_a_forced_sure_scorer(
        monkeypatch, tmp_path, runtime):
    """semantic_vad asks the chat model at a pause once the words up to it are out; a word still being
    written then is held as server_vad's end holds it, so the question reads whole words and a turn it ends is
    the whole recording's (it was cut: 'Reverse the word "zi'). Fault injection: every question gets 0.99."""
    asked = []

    async def sure(self, text: str) -> float | None:
        asked.append(text)
        return 0.99

    monkeypatch.setattr(TurnEndScorer, "__call__", sure)
    transcript, expected = await spelled_question_turn(
        monkeypatch, tmp_path, runtime, {"type": "semantic_vad", "eagerness": "high"}, 2.0)
    assert transcript == expected
    assert asked and asked[-1] == expected


async def spelled_question_turn(monkeypatch, tmp_path, runtime, turn_detection: dict, after_s: float):
    """'Reverse the word "cinder".' then `after_s` of silence, sent at 4x real time to a transcription session
    with `turn_detection` on `rill serve`'s 160 ms: the first turn's transcript, and a 160 ms stream's of the
    whole recording (its last word spelled out: many tokens, one a frame)."""
    llm_dir = make_model_dir(tmp_path / "qwen2", "qwen2")
    args = serve_args(monkeypatch, "--speech-model", RILL_TINY_CAUSAL)
    spoken = np.concatenate([silence(0.5), speak('Reverse the word "cinder".')])
    async with served(llm_dir, args) as server:
        async with voice_client(server) as ws:
            await ws.update(type="transcription", audio={"input": {
                "transcription": {"model": RILL_TINY_CAUSAL}, "turn_detection": turn_detection}})
            await ws.stream(np.concatenate([spoken, silence(after_s)]), 0.1, 4.0)
            with trio.fail_after(10):
                events = await ws.until(COMPLETED)
    whole = np.concatenate([spoken, silence(2.0)])
    expected = alone(runtime, decode_pcm16(pcm16_b64(whole), len(whole)), delay_ms=160, early_stop=True)[0].strip()
    assert len(expected.split()[-1]) > 5
    return of_type(events, COMPLETED)[0]["transcript"], expected
