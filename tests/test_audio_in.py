"""Audio in (rill.speech.audio): files in every container libsndfile reads, raw PCM16, mixing, resampling,
the length cap, and a clear AudioError for every input that cannot be used.

Test files are written at test time with soundfile (and one with sox, an encoder independent of ours)."""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rill.errors import ValidationError
from rill.speech.audio import (
    SAMPLE_RATE,
    AudioError,
    decode_audio,
    load_audio,
    pcm16_to_float,
    to_mono_16k,
)


def sine(freq_hz: float, seconds: float, rate: int, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)


def encode(samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def peak_hz(mono_16k: np.ndarray) -> float:
    spectrum = np.abs(np.fft.rfft(mono_16k))
    return float(np.fft.rfftfreq(len(mono_16k), 1 / SAMPLE_RATE)[spectrum.argmax()])


# --- files -------------------------------------------------------------------------------------------

LOSSLESS = [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("FLAC", "PCM_16"), ("FLAC", "PCM_24")]


@pytest.mark.parametrize(("fmt", "subtype"), LOSSLESS)
def test_lossless_file_decodes_to_the_samples_written(tmp_path, fmt, subtype):
    written = sine(440, 0.5, SAMPLE_RATE)
    path = tmp_path / f"a.{fmt.lower()}"
    sf.write(path, written, SAMPLE_RATE, format=fmt, subtype=subtype)
    samples, rate = decode_audio(path.read_bytes())
    assert rate == SAMPLE_RATE and samples.shape == (len(written), 1) and samples.dtype == np.float32
    np.testing.assert_allclose(samples[:, 0], written, atol=1 / 32768)
    np.testing.assert_allclose(load_audio(path), written, atol=1 / 32768)  # a path; 16 kHz mono passes through


@pytest.mark.parametrize(("fmt", "subtype", "rate"), [("OGG", "VORBIS", 16000), ("OGG", "OPUS", 48000),
                                                      ("MP3", "MPEG_LAYER_III", 16000)])
def test_lossy_file_decodes_with_its_pitch_and_length(fmt, subtype, rate):
    if fmt not in sf.available_formats() or subtype not in sf.available_subtypes(fmt):
        pytest.skip(f"this libsndfile ({sf.__libsndfile_version__}) has no {fmt}/{subtype}")
    audio = load_audio(encode(sine(440, 1.0, rate), rate, fmt, subtype))
    # Lossy codecs add encoder delay and padding: the length is right within a few codec frames.
    assert abs(len(audio) - SAMPLE_RATE) < 0.1 * SAMPLE_RATE
    assert abs(peak_hz(audio) - 440) <= 2


def test_file_made_by_sox_decodes_and_resamples(tmp_path):
    if shutil.which("sox") is None:
        pytest.skip("sox is not installed (.ci/run installs it)")
    path = tmp_path / "sox.wav"
    subprocess.run(["sox", "-n", "-r", "44100", "-c", "2", "-b", "16", str(path), "synth", "1.5", "sine", "1000"],
                   check=True, timeout=30)
    audio = load_audio(path)
    assert len(audio) == 24000
    assert abs(peak_hz(audio) - 1000) <= 1


def test_stereo_file_is_mixed_to_mono():
    left, right = sine(300, 1.0, SAMPLE_RATE, 0.4), sine(300, 1.0, SAMPLE_RATE, 0.2)
    audio = load_audio(encode(np.stack([left, right], axis=1), SAMPLE_RATE, "WAV", "FLOAT"))
    np.testing.assert_allclose(audio, (left + right) / 2, atol=1e-6)


def test_opposite_channels_mix_to_silence():
    left = sine(300, 0.5, SAMPLE_RATE)
    audio = load_audio(encode(np.stack([left, -left], axis=1), SAMPLE_RATE, "WAV", "FLOAT"))
    assert np.abs(audio).max() < 1e-6


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
def test_file_at_another_rate_is_resampled_to_16k_with_its_pitch(rate):
    audio = load_audio(encode(sine(1000, 2.0, rate), rate, "FLAC", "PCM_16"))
    assert audio.dtype == np.float32 and audio.ndim == 1 and audio.flags.c_contiguous
    assert len(audio) == 2 * SAMPLE_RATE
    assert abs(peak_hz(audio) - 1000) <= 0.5
    # soxr's band-limited resampling keeps the amplitude of an in-band tone.
    assert abs(np.abs(audio[1000:-1000]).max() - 0.5) < 0.01


@pytest.mark.parametrize(("rate", "frames", "expected"), [(44100, 12345, 4479), (48000, 12345, 4115),
                                                          (8000, 12345, 24690)])
def test_resampled_length_is_the_rounded_duration(rate, frames, expected):
    assert len(to_mono_16k(np.zeros(frames, np.float32), rate)) == expected == round(frames * SAMPLE_RATE / rate)


def test_resampling_keeps_speech_band_and_drops_what_16k_cannot_hold():
    # 7 kHz survives 48k -> 16k; 12 kHz is above the new Nyquist (8 kHz) and must be filtered, not aliased to 4 kHz.
    kept = to_mono_16k(sine(7000, 1.0, 48000), 48000)
    dropped = to_mono_16k(sine(12000, 1.0, 48000), 48000)
    assert np.abs(kept[500:-500]).max() > 0.45
    assert np.abs(dropped[500:-500]).max() < 0.01


# --- arrays and raw PCM16 ----------------------------------------------------------------------------

def test_float_array_without_rate_is_taken_as_16k_and_returned_unchanged():
    audio = sine(200, 0.25, SAMPLE_RATE)
    out = load_audio(audio)
    np.testing.assert_array_equal(out, audio)
    assert out.dtype == np.float32


def test_float64_float16_big_endian_and_int16_arrays_are_converted():
    audio = sine(200, 0.25, SAMPLE_RATE)
    np.testing.assert_allclose(load_audio(audio.astype(np.float64)), audio, atol=1e-7)
    np.testing.assert_allclose(load_audio(audio.astype(np.float16)), audio, atol=1e-3)
    np.testing.assert_array_equal(load_audio(audio.astype(">f4")), audio)
    as_int16 = np.round(audio * 32767).astype(np.int16)
    np.testing.assert_allclose(load_audio(as_int16), audio, atol=2 / 32768)


def test_array_with_its_rate_is_resampled_and_stereo_array_mixed():
    stereo = np.stack([sine(500, 1.0, 48000)] * 2, axis=1)
    audio = load_audio(stereo, sample_rate=48000)
    assert len(audio) == SAMPLE_RATE and abs(peak_hz(audio) - 500) <= 1


def test_pcm16_bytes_scale_to_minus_one_up_to_just_below_one():
    values = np.array([-32768, -16384, 0, 16384, 32767], dtype="<i2")
    out = pcm16_to_float(values.tobytes())
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [-1.0, -0.5, 0.0, 0.5, 32767 / 32768])


def test_pcm16_is_little_endian_whatever_the_host():
    assert pcm16_to_float(b"\x00\x40")[0] == 0.5  # 0x4000 little-endian


def test_pcm16_round_trips_a_sine_through_to_mono_16k():
    audio = sine(440, 0.5, 24000)
    pcm = np.round(audio * 32767).astype("<i2").tobytes()
    out = to_mono_16k(pcm16_to_float(pcm), 24000)
    assert len(out) == 8000 and abs(peak_hz(out) - 440) <= 2


# --- the length cap ----------------------------------------------------------------------------------

def test_file_exactly_at_max_seconds_decodes():
    data = encode(np.zeros(2 * 8000, np.float32), 8000, "WAV", "PCM_16")
    samples, rate = decode_audio(data, max_seconds=2.0)
    assert (len(samples), rate) == (16000, 8000)
    assert len(load_audio(data, max_seconds=2.0)) == 2 * SAMPLE_RATE


def test_file_one_frame_past_max_seconds_is_refused():
    data = encode(np.zeros(2 * 8000 + 1, np.float32), 8000, "WAV", "PCM_16")
    with pytest.raises(AudioError, match="longer than the limit of 2 s"):
        decode_audio(data, max_seconds=2.0)
    with pytest.raises(AudioError, match="longer than"):
        load_audio(data, max_seconds=2.0)


def test_tiny_flac_of_long_silence_is_refused_by_duration_not_size():
    # Ten minutes of silence compress to a few kB of FLAC: the cap is on decoded length, not bytes.
    data = encode(np.zeros(600 * 8000, np.int16), 8000, "FLAC", "PCM_16")
    assert len(data) < 200_000
    with pytest.raises(AudioError, match="longer than the limit of 60 s"):
        decode_audio(data, max_seconds=60)


def test_array_at_and_past_max_seconds():
    assert len(load_audio(np.zeros(48000, np.float32), 48000, max_seconds=1.0)) == SAMPLE_RATE
    with pytest.raises(AudioError, match="longer than"):
        load_audio(np.zeros(48001, np.float32), 48000, max_seconds=1.0)


# --- refusals ----------------------------------------------------------------------------------------

def test_audio_error_is_a_400_validation_error_with_code_invalid_audio():
    with pytest.raises(AudioError) as info:
        decode_audio(b"")
    assert isinstance(info.value, ValidationError)
    assert (info.value.code, info.value.param) == ("invalid_audio", "file")
    assert "empty" in info.value.message


@pytest.mark.parametrize(("data", "message"), [
    (b"", "empty"),
    (b"this is not audio at all, just some text " * 4, "could not decode.*Format not recognised"),
    (b"RIFF\x24\x00\x00\x00WAVEfmt ", "could not decode"),  # a WAV header cut short
    (bytes(range(256)) * 8, "could not decode"),
])
def test_undecodable_bytes_are_refused(data, message):
    with pytest.raises(AudioError, match=message):
        decode_audio(data)
    with pytest.raises(AudioError, match=message):
        load_audio(data)


def test_truncated_flac_is_refused_or_shorter_never_a_crash():
    data = encode(sine(440, 1.0, SAMPLE_RATE), SAMPLE_RATE, "FLAC", "PCM_16")
    try:
        audio = load_audio(data[: len(data) // 2])
    except AudioError:
        return
    assert 0 < len(audio) <= SAMPLE_RATE


def test_wav_with_zero_frames_is_refused():
    data = encode(np.zeros((0, 1), np.float32), SAMPLE_RATE, "WAV", "PCM_16")
    with pytest.raises(AudioError, match="no samples"):
        decode_audio(data)


def test_float_wav_holding_nan_or_inf_is_refused():
    for bad in (np.nan, np.inf):
        samples = sine(440, 0.1, SAMPLE_RATE)
        samples[10] = bad
        with pytest.raises(AudioError, match="NaN or infinite"):
            load_audio(encode(samples, SAMPLE_RATE, "WAV", "FLOAT"))


def test_wav_with_too_many_channels_is_refused():
    data = encode(np.zeros((100, 9), np.float32), SAMPLE_RATE, "WAV", "FLOAT")
    with pytest.raises(AudioError, match="9 channels"):
        decode_audio(data)


@pytest.mark.parametrize(("array", "message"), [
    (np.zeros(0, np.float32), "no samples"),
    (np.zeros((0, 2), np.float32), "no samples"),
    (np.array([0.0, np.nan], np.float32), "NaN or infinite"),
    (np.array([0.0, -np.inf]), "NaN or infinite"),
    (np.zeros(100, np.int32), r"float \(any width\) or int16.*int32"),
    (np.zeros(100, np.uint8), "float .* or int16"),
    (np.array(["a", "b"]), "float .* or int16"),
    (np.zeros(100, np.complex64), "float .* or int16"),
    (np.array(0.5, np.float32), r"shaped \(frames,\) or \(frames, channels\), got shape \(\)"),
    (np.zeros((10, 2, 2), np.float32), r"shaped \(frames,\) or \(frames, channels\)"),
    (np.zeros((2, 16000), np.float32), "channels"),  # (channels, frames): the transposed layout
])
def test_unusable_arrays_are_refused(array, message):
    with pytest.raises(AudioError, match=message):
        load_audio(array)


@pytest.mark.parametrize("rate", [0, -16000, 16000.0, "16000", True, 10_000_000])
def test_bad_sample_rate_is_refused_naming_the_param(rate):
    with pytest.raises(AudioError, match="sample_rate") as info:
        load_audio(np.zeros(100, np.float32), sample_rate=rate)
    assert info.value.param == "sample_rate"


def test_sample_rate_that_contradicts_the_file_header_is_refused():
    data = encode(np.zeros(8000, np.float32), 8000, "WAV", "PCM_16")
    with pytest.raises(AudioError, match="sample_rate=16000 was given but the file says 8000 Hz"):
        load_audio(data, sample_rate=16000)
    assert len(load_audio(data, sample_rate=8000)) == SAMPLE_RATE


@pytest.mark.parametrize("value", [[0.0, 0.1], 3.5, None, {"file": b""}])
def test_values_that_are_not_audio_are_refused(value):
    with pytest.raises(AudioError, match="path, the bytes of an audio file or a numpy array"):
        load_audio(value)


@pytest.mark.parametrize("max_seconds", [0, -1.0, float("inf"), float("nan")])
def test_max_seconds_must_be_positive_and_finite(max_seconds):
    with pytest.raises(ValueError, match="max_seconds must be a positive"):
        load_audio(np.zeros(10, np.float32), max_seconds=max_seconds)


def test_audio_shorter_than_one_16k_sample_is_refused_not_returned_empty():
    with pytest.raises(AudioError, match="shorter than one sample"):
        load_audio(np.ones(1, np.float32), sample_rate=48000)
    assert len(load_audio(np.ones(1, np.float32), sample_rate=8000)) == 2


def test_to_mono_16k_refuses_int_arrays_it_cannot_scale():
    with pytest.raises(AudioError, match="must be a float numpy array"):
        to_mono_16k(np.zeros(100, np.int16), SAMPLE_RATE)


@pytest.mark.parametrize(("data", "message"), [(b"", "empty"), (b"\x00\x01\x02", "odd")])
def test_bad_pcm16_is_refused(data, message):
    with pytest.raises(AudioError, match=message):
        pcm16_to_float(data)


def test_missing_path_raises_file_not_found():
    with pytest.raises(FileNotFoundError):
        load_audio("/nonexistent/rill-test.wav")


# --- fuzzing: libsndfile sees hostile bytes first --------------------------------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
VALID_FILES = [encode(sine(440, 0.05, 8000), 8000, fmt, subtype)
               for fmt, subtype in [("WAV", "PCM_16"), ("WAV", "FLOAT"), ("FLAC", "PCM_16"), ("OGG", "VORBIS")]]


def decodes_or_refuses(data: bytes) -> None:
    """The only outcomes allowed: finite 16 kHz mono float32, or AudioError."""
    try:
        audio = load_audio(data, max_seconds=10)
    except AudioError:
        return
    assert audio.dtype == np.float32 and audio.ndim == 1 and audio.size > 0 and np.isfinite(audio).all()


@FUZZ
@given(st.binary(max_size=2048))
def test_random_bytes_decode_or_raise_audio_error(data):
    decodes_or_refuses(data)


@FUZZ
@given(st.sampled_from(range(len(VALID_FILES))), st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                     min_size=1, max_size=8), st.integers(0, 10**6))
def test_corrupted_files_decode_or_raise_audio_error(which, edits, cut):
    data = bytearray(VALID_FILES[which])
    for position, value in edits:  # overwrite bytes, headers included
        data[position % len(data)] = value
    decodes_or_refuses(bytes(data[: max(1, cut % (len(data) + 1))]))
