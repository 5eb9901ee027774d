"""Streaming recognition's parts: the forced prefix in the speech runtime, the prefix agreement policy, the
VAD's turns on espeak-ng speech, and LiveTranscriber driving the real speech worker (a random-weight
Whisper, so the tests pin timing, order and bookkeeping, never words; meaning is tested with
rill-tiny-speech in test_realtime_voice.py)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
import trio

from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_whisper import make_whisper_dir, synthetic_audio
from rill.speech.async_speech import open_speech_engine
from rill.speech.core import SpeechCore
from rill.speech.decoding import TranscribeParams, decode_window
from rill.speech.features import FeatureConfig, LogMel
from rill.speech.live import (LiveConfig, LiveTranscriber, SpeechStarted, SpeechStopped, TranscriptDelta,
                              TranscriptDone)
from rill.speech.prefix_agreement import PrefixAgreement, split_words
from rill.speech.vad import Activity, TurnDetection, VoiceActivity, aggressiveness, quietest_sample
from rill.speech.whisper import load_whisper

needs_espeak = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng makes the test speech")
RATE = 16_000


@pytest.fixture(scope="module")
def whisper_dir(tmp_path_factory):
    """English-only, a 5 s window like rill-tiny-speech's."""
    return make_whisper_dir(tmp_path_factory.mktemp("whisper-en"), multilingual=False, max_source_positions=250,
                            max_target_positions=64)


def speak(text: str) -> np.ndarray:
    from rill.tiny_speech.synth import synthesize
    from rill.tiny_speech.voices import Voice

    return synthesize(text, Voice("en-us", "", 160, 50, 100, 0))


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.float32)


# -- the forced prefix ------------------------------------------------------------------------------------


def run_core(core: SpeechCore, audio: np.ndarray, params: TranscribeParams):
    core.add_request("r", audio, params)
    while True:
        for delta in core.step():
            if delta.finished is not None:
                return delta.finished


def test_a_prefix_of_the_greedy_output_gives_the_rest_of_it(whisper_dir):
    core = SpeechCore(str(whisper_dir))
    audio = synthetic_audio(3.0, seed=3)
    whole = run_core(core, audio, TranscribeParams())
    tokenizer = core.runtime.tokenizer
    assert len(whole.token_ids) >= 4
    # random weights write bytes that are not all text: test the cuts whose text encodes back to the same ids
    cuts = [k for k in range(1, len(whole.token_ids))
            if tokenizer.encode(tokenizer.decode(whole.token_ids[:k]), add_special_tokens=False) == whole.token_ids[:k]]
    assert cuts
    for k in cuts[:3]:
        rest = run_core(core, audio, TranscribeParams(prefix=tokenizer.decode(whole.token_ids[:k])))
        assert rest.token_ids == whole.token_ids[k:]


def test_the_batched_core_equals_the_one_window_reference_with_a_prefix(whisper_dir):
    core = SpeechCore(str(whisper_dir))
    runtime = load_whisper(str(whisper_dir))
    features = LogMel(FeatureConfig.from_dir(whisper_dir))
    audio = synthetic_audio(2.0, seed=5)
    params = TranscribeParams(prefix=" the word", max_new_tokens=10)
    want, _ = decode_window(runtime, features.batch([audio]), params)
    assert run_core(core, audio, params).token_ids == want


def test_a_prefix_with_special_tokens_is_refused(whisper_dir):
    from rill.errors import ValidationError

    core = SpeechCore(str(whisper_dir))
    with pytest.raises(ValidationError, match="prefix"):
        core.add_request("r", silence(1.0), TranscribeParams(prefix="<|endoftext|>"))
    assert not core.requests


# -- the agreement policy ---------------------------------------------------------------------------------


def test_split_words_keeps_leading_spaces():
    assert split_words(" What is 12 + 30?") == [" What", " is", " 12", " +", " 30?"]
    assert "".join(split_words("a  b ")) == "a  b"


def test_words_commit_when_two_passes_agree_and_never_change():
    policy = PrefixAgreement()
    assert policy.insert(" What is twenty") == []  # one pass agrees with nothing yet
    assert policy.insert(" What is twelve plus") == [" What", " is"]  # "twelve" vs "twenty": not yet
    assert policy.prefix == " What is"
    # the next pass is forced to start with the prefix: it returns only what follows
    assert policy.insert(" twelve plus thirty") == [" twelve", " plus"]  # the last word waits
    assert policy.unconfirmed == " thirty"
    assert policy.insert(" thirty?") == []  # punctuation is part of the word: "thirty" is not "thirty?"
    assert policy.insert(" thirty?", speaking=False) == [" thirty?"]
    assert policy.finish("") == [] and policy.prefix == " What is twelve plus thirty?"


def test_the_last_word_waits_while_speaking_unless_told_not_to():
    held, eager = PrefixAgreement(), PrefixAgreement(hold_last_word=False)
    for policy in (held, eager):
        policy.insert(" one two")
    assert held.insert(" one two") == [" one"]
    assert eager.insert(" one two") == [" one", " two"]


def test_a_number_commits_when_three_passes_agree_and_a_word_after_it_is_agreed():
    # rill-tiny-speech, 0.7 s into "Add five hundred fifty-eight and one", twice: "Add 5 and". The number waits.
    policy = PrefixAgreement()
    policy.insert(" Add 5 and")
    assert policy.insert(" Add 5 and 8.") == [" Add"]
    assert policy.insert(" 558 and") == []  # two passes before it said 5
    assert policy.insert(" 558 and 1") == []  # two passes agree on 558, the third does not
    assert policy.insert(" 558 and 1.") == [" 558", " and"]
    # "twelve" is 12 until "hundred" makes it 1200: while the speaker talks, a number never ends the words committed
    policy = PrefixAgreement(hold_last_word=False)
    policy.insert(" What is 12")
    assert policy.insert(" What is 12") == [" What", " is"]
    assert policy.insert(" 12") == []  # three passes said 12, but nothing agreed after it yet
    assert policy.insert(" 12 plus") == []
    assert policy.insert(" 12 plus") == [" 12", " plus"]  # "plus" is agreed after it (two passes are enough)
    assert policy.finish(" 30?") == [" 30?"]  # the segment's end commits everything


def test_finish_commits_everything_the_final_pass_says():
    policy = PrefixAgreement()
    policy.insert(" a b c")
    policy.insert(" a b d")
    assert policy.finish(" c d e") == [" c", " d", " e"]
    assert policy.prefix == " a b c d e"  # " a b" agreed first


# -- the VAD ----------------------------------------------------------------------------------------------


def test_threshold_picks_webrtc_aggressiveness():
    assert [aggressiveness(t) for t in (0.0, 0.3, 0.5, 0.8, 1.0)] == [0, 1, 2, 3, 3]


@pytest.mark.parametrize("field,value", [("threshold", 1.5), ("prefix_padding_ms", -1), ("silence_duration_ms", 0)])
def test_turn_detection_refuses_values_out_of_range(field, value):
    with pytest.raises(ValueError, match=field):
        TurnDetection(**{field: value})


def test_silence_and_noise_floor_are_not_speech():
    vad = VoiceActivity()
    quiet = np.random.default_rng(0).standard_normal(RATE).astype(np.float32) * 1e-4
    assert vad.feed(silence(2.0)) == [] and vad.feed(quiet) == []


@needs_espeak
def test_vad_finds_a_turn_in_speech_between_silences():
    speech = speak("What is twelve plus thirty?")
    audio = np.concatenate([silence(0.5), speech, silence(1.0)])
    vad, events = VoiceActivity(TurnDetection(silence_duration_ms=500)), []
    for i in range(0, len(audio), 1600):  # 100 ms appends
        events += vad.feed(audio[i:i + 1600])
    kinds = [e.kind for e in events]
    assert kinds[0] is Activity.SPEECH_STARTED and kinds[-1] is Activity.SPEECH_STOPPED
    assert kinds.count(Activity.SPEECH_STARTED) == 1
    assert abs(events[0].at_sample / RATE - 0.5) < 0.15
    end_s = (0.5 + len(speech) / RATE)
    assert abs(events[-1].at_sample / RATE - end_s) < 0.15


@needs_espeak
def test_a_short_pause_ends_a_segment_but_not_the_turn():
    audio = np.concatenate([silence(0.3), speak("twelve"), silence(0.35), speak("thirty"), silence(0.8)])
    vad = VoiceActivity(TurnDetection(silence_duration_ms=500), pause_ms=200)
    kinds = [e.kind for e in vad.feed(audio)]
    assert kinds == [Activity.SPEECH_STARTED, Activity.PAUSED, Activity.RESUMED, Activity.PAUSED,
                     Activity.SPEECH_STOPPED]


def test_quietest_sample_finds_the_gap():
    audio = np.ones(RATE, dtype=np.float32) * 0.5
    audio[8000:8480] = 0.0
    cut = quietest_sample(audio, 4000)  # frames start at 4000 + 480 k: the one at 7840 holds most of the gap
    assert cut == 7840 and quietest_sample(audio, len(audio) - 100) == len(audio)  # too little to search


# -- LiveTranscriber on the speech worker -------------------------------------------------------------------


async def run_live(whisper_dir, audio: np.ndarray, config: LiveConfig, *, append_s: float = 0.1,
                   pace: float = 1.0, then=None):
    """Feed `audio` in `append_s` pieces at `pace` x real time; return the events with their arrival times."""
    events = []
    async with open_speech_engine(str(whisper_dir)) as speech:
        start = trio.current_time()
        live = LiveTranscriber(speech, config, lambda e: events.append((trio.current_time() - start, e)))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run)
            step = int(append_s * RATE)
            for i in range(0, len(audio), step):
                await live.wait_for_room()
                live.feed(audio[i:i + step])
                await trio.sleep(append_s / pace)
            if then is not None:
                then(live)
            await wait_for(lambda: any(isinstance(e, TranscriptDone) for _, e in events)
                           and not live._closed and live._open is None, 60)
            nursery.cancel_scope.cancel()
        assert speech.num_requests == 0 and not speech.core.has_work()
    return live, events


@needs_espeak
async def test_server_vad_turn_events_come_in_order_and_the_final_words_before_the_end(whisper_dir):
    speech = speak("What is twelve plus thirty?")
    audio = np.concatenate([silence(0.5), speech, silence(1.2)])
    live, events = await run_live(whisper_dir, audio, LiveConfig())
    kinds = [type(e) for _, e in events]
    assert kinds[0] is SpeechStarted and SpeechStopped in kinds and kinds[-1] is TranscriptDone
    started = events[0][1]
    assert abs(started.audio_start_ms - 200) <= 100  # 500 ms onset less 300 ms of prefix padding
    done = events[-1][1]
    assert done.text == "".join(e.text for _, e in events if isinstance(e, TranscriptDelta))
    assert 0 < done.audio_s <= len(audio) / RATE
    # one final pass, or none when the pass the pause started heard all the speech before the segment closed
    assert live.num_passes >= 2 and live.num_final_passes <= 1


@needs_espeak
async def test_manual_commit_ends_the_turn_without_vad_stop(whisper_dir):
    speech = speak("Reverse the word stream")
    audio = np.concatenate([silence(0.3), speech])  # no trailing silence: only the commit ends it
    live, events = await run_live(whisper_dir, audio, LiveConfig(turn_detection=None),
                                  then=lambda live: live.commit(final=True))
    assert not any(isinstance(e, (SpeechStarted, SpeechStopped)) for _, e in events)
    done = events[-1][1]
    assert isinstance(done, TranscriptDone) and done.final


async def test_clear_drops_the_turn(whisper_dir):
    audio = np.concatenate([silence(0.3), synthetic_audio(1.5)])
    live, events = await run_live(whisper_dir, audio, LiveConfig(turn_detection=None),
                                  then=lambda live: (live.clear(), live.commit()))
    done = events[-1][1]
    assert isinstance(done, TranscriptDone) and done.text == "" and done.audio_s == 0


async def test_a_long_stream_is_cut_into_windows_and_costs_the_same_per_second(whisper_dir):
    """Twelve seconds of continuous sound in a 5 s window: cut at least twice, every pass at most one window."""
    audio = synthetic_audio(12.0, seed=1)
    live, events = await run_live(whisper_dir, audio, LiveConfig(turn_detection=None, pass_interval_s=1.0),
                                  pace=4.0, then=lambda live: live.commit())
    assert live.num_final_passes >= 2  # the two cut heads (the commit's segment may close on its last pass)
    assert live.backlog_s == 0


async def test_backlog_holds_a_fast_source(whisper_dir):
    """Audio sent 50x faster than real time: wait_for_room keeps the backlog near its bound."""
    audio = synthetic_audio(20.0, seed=2)
    peak = []
    events = []
    async with open_speech_engine(str(whisper_dir)) as speech:
        live = LiveTranscriber(speech, LiveConfig(turn_detection=None, max_backlog_s=4.0), events.append)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(live.run)
            for i in range(0, len(audio), 8000):
                await live.wait_for_room()
                live.feed(audio[i:i + 8000])
                peak.append(live.backlog_s)
                await trio.sleep(0.01)
            live.commit()
            await wait_for(lambda: any(isinstance(e, TranscriptDone) for e in events), 120)
            nursery.cancel_scope.cancel()
    assert max(peak) <= 4.0 + 0.5
    assert live.num_samples == len(audio)
