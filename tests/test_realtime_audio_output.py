"""A spoken answer's audio for the realtime wire (transports/realtime/audio_output.py): the session's output
formats (PCM16 at 24 kHz, G.711 u-law and a-law at 8 kHz) decoded back and measured, pieces and their
bounds, and the timeline that maps audio_end_ms to the words heard by then."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import soundfile

from rill.transports.realtime.audio_output import PIECE_MS, OutputFormat, Timeline, WireAudio, beta_format, ga_format
from rill.transports.realtime.events import RealtimeError

RATE = 24_000


def tone(seconds: float, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def joined(pieces: list[str]) -> bytes:
    return b"".join(base64.b64decode(p) for p in pieces)


def test_pcm16_at_24k_is_the_samples_in_pieces_of_200_ms():
    wire = WireAudio(OutputFormat("pcm16"), RATE)
    clip = tone(1.0)
    pieces = wire.pieces(clip) + wire.pieces([], last=True)
    assert len(pieces) == 1000 // PIECE_MS
    assert all(len(base64.b64decode(p)) <= RATE * PIECE_MS // 1000 * 2 for p in pieces)
    back = np.frombuffer(joined(pieces), dtype="<i2") / 32767
    assert len(back) == len(clip) and np.abs(back - clip).max() < 1e-4


@pytest.mark.parametrize("name, subtype", [("g711_ulaw", "ULAW"), ("g711_alaw", "ALAW")])
def test_g711_is_8k_one_byte_a_sample_and_decodes_to_the_clip(name, subtype):
    wire = WireAudio(OutputFormat(name), RATE)
    clips = [tone(0.35), tone(0.65)]  # two clauses through one resampler: no sample lost at the join
    data = joined([p for c in clips for p in wire.pieces(c)] + wire.pieces([], last=True))
    assert len(data) == pytest.approx(8_000, abs=2)  # 1 s at 8 kHz, one byte a sample
    assert wire.num_bytes == len(data)
    back, rate = soundfile.read(io.BytesIO(data), format="RAW", subtype=subtype, samplerate=8_000, channels=1)
    assert rate == 8_000
    expected = tone(1.0)[::3][:len(back)]
    middle = slice(100, len(back) - 100)  # the resampler's filter edges aside
    assert np.corrcoef(back[middle], expected[middle])[0, 1] > 0.95


def test_formats_ga_and_beta_names():
    assert ga_format({"type": "audio/pcm", "rate": 24000}, "p") == OutputFormat("pcm16")
    assert ga_format({"type": "audio/pcmu"}, "p").rate_hz == 8_000
    assert ga_format({"type": "audio/pcma"}, "p").ga_wire() == {"type": "audio/pcma"}
    assert beta_format("g711_ulaw", "p") == OutputFormat("g711_ulaw")
    assert OutputFormat().ga_wire() == {"type": "audio/pcm", "rate": 24000}


@pytest.mark.parametrize("given, param", [({"type": "audio/pcm", "rate": 16000}, "p.rate"),
                                          ({"type": "audio/mp3"}, "p.type")])
def test_ga_format_refused(given, param):
    with pytest.raises(RealtimeError) as caught:
        ga_format(given, "p")
    assert caught.value.param == param


def test_beta_format_refused():
    with pytest.raises(RealtimeError):
        beta_format("opus", "p")


def test_timeline_text_at_clause_ends_and_inside_a_clause():
    timeline = Timeline()
    timeline.add("The answer is four.", 1000.0)
    timeline.add(" Two and two make four.", 1000.0)
    assert timeline.total_ms == 2000.0
    assert timeline.text_at(0) == ""
    assert timeline.text_at(1000) == "The answer is four."
    assert timeline.text_at(2000) == "The answer is four. Two and two make four."
    assert timeline.text_at(1500) == "The answer is four. Two and two"  # 5 words, half the time: 3 begun
    assert timeline.text_at(1001) == "The answer is four. Two"  # a word begun is a word heard
    assert timeline.text_at(250) == "The"
