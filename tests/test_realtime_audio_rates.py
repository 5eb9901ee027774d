"""Realtime input audio at the session's rate, resampled as a stream (transports/realtime/audio_input.py):
pieces of any size give the samples the whole clip resampled at once gives; a causal model that hears at
the session's rate (Kyutai's Mimi, 24 kHz) gets the samples as sent. The connection-level tests feed an
AudioInput whose front end records what it is given (the real resampling, no model); the served test runs
a GA 24 kHz transcription session against a random-weight Kyutai model on a real hypercorn server."""

from __future__ import annotations

import base64

import numpy as np
import pytest
import soxr

from helpers_kyutai import synthetic_audio
from helpers_server import one_torch_thread, wait_for  # noqa: F401
from helpers_voice import of_type, voice_client, voice_server
from test_kyutai_live import kyutai_dir, llm_dir  # noqa: F401  (the same random models)
from rill.speech.kyutai import KyutaiStream, load_kyutai
from rill.transports.realtime.audio_input import AudioInput

COMPLETED = "conversation.item.input_audio_transcription.completed"
DELTA = "conversation.item.input_audio_transcription.delta"


class RecordingFrontEnd:
    """Records what the connection gives the recogniser (both copies), in order."""

    def __init__(self):
        self.at_16k: list[np.ndarray] = []
        self.native: list[np.ndarray] = []
        self.rates: set[int] = set()

    def feed(self, samples_16k, native=None, rate_hz=16_000):
        self.at_16k.append(samples_16k)
        if native is not None:
            self.native.append(native)
            self.rates.add(rate_hz)


def irregular_pieces(audio: np.ndarray, seed: int) -> list[np.ndarray]:
    rng, pieces, i = np.random.default_rng(seed), [], 0
    while i < audio.size:
        size = int(rng.choice([1, 7, 161, 480, 2399, 4800, int(rng.integers(2, 6000))]))
        pieces.append(audio[i : i + size])
        i += size
    return pieces


def wire(audio: np.ndarray) -> np.ndarray:
    """What the server decodes from the PCM16 a client sends (exact: pcm16_b64 of it gives it back)."""
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").astype(np.float32) / 32768.0


def b64(samples: np.ndarray) -> str:
    """`wire` samples back to base64 PCM16, bit for bit."""
    return base64.b64encode(np.round(samples * 32768).astype("<i2").tobytes()).decode()


@pytest.mark.parametrize("rate", [16_000, 24_000])
def test_pieces_of_any_size_give_the_whole_clip_resampled_at_once(rate):
    audio = wire(synthetic_audio(2.3, seed=3, rate=rate))
    front = RecordingFrontEnd()
    audio_input = AudioInput(front)
    for piece in irregular_pieces(audio, seed=rate):
        audio_input.append(b64(piece), rate)
    audio_input.commit()
    got, native = np.concatenate(front.at_16k), np.concatenate(front.native)
    assert front.rates == {rate} and np.array_equal(native, audio)  # the audio as sent, untouched
    if rate == 16_000:
        assert np.array_equal(got, audio)  # 16k -> 16k: nothing done
    else:
        whole = soxr.resample(audio, rate, 16_000)
        assert got.size == whole.size and np.allclose(got, whole, atol=1e-6)
    assert audio_input.num_samples_16k == pytest.approx(audio.size * 16_000 / rate, abs=len(front.native))


def test_a_commit_starts_the_next_turn_afresh_and_a_rate_change_a_new_resampler():
    first, second = (wire(synthetic_audio(s, seed=9 + i, rate=24_000)) for i, s in enumerate((1.0, 0.7)))
    front = RecordingFrontEnd()
    audio_input = AudioInput(front)
    for clip in (first, second):
        for piece in irregular_pieces(clip, seed=clip.size):
            audio_input.append(b64(piece), 24_000)
        audio_input.commit()
    whole = np.concatenate([soxr.resample(first, 24_000, 16_000), soxr.resample(second, 24_000, 16_000)])
    assert np.allclose(np.concatenate(front.at_16k), whole, atol=1e-6)
    front.at_16k.clear()
    audio_input.append(b64(first[:1600]), 16_000)  # session.update named 16 kHz: passed as it is
    assert np.array_equal(front.at_16k[-1], first[:1600])


def test_clear_drops_what_the_resampler_holds():
    clip = wire(synthetic_audio(0.5, seed=11, rate=24_000))
    front = RecordingFrontEnd()
    audio_input = AudioInput(front)
    audio_input.append(b64(clip), 24_000)
    audio_input.clear()
    front.at_16k.clear()
    audio_input.append(b64(clip), 24_000)
    audio_input.commit()
    assert np.allclose(np.concatenate(front.at_16k), soxr.resample(clip, 24_000, 16_000), atol=1e-6)



async def test_ga_24k_session_streams_kyutai_the_samples_as_sent(llm_dir, kyutai_dir):
    """Kyutai hears at 24 kHz: a GA session's 24 kHz audio reaches its stream untouched (not 24k -> 16k ->
    24k), so the transcript is the whole clip's given to a 24 kHz KyutaiStream at once."""
    runtime = load_kyutai(kyutai_dir)
    assert runtime.sampling_rate == 24_000
    audio = wire(synthetic_audio(3.0, seed=21, rate=24_000))
    async with voice_server(llm_dir, kyutai_dir) as server:
        async with voice_client(server) as client:
            await client.update(type="transcription", audio={"input": {
                "format": {"type": "audio/pcm", "rate": 24_000}, "turn_detection": None,
                "transcription": {"model": str(kyutai_dir)}}})
            for piece in irregular_pieces(audio, seed=5):
                await client.send("input_audio_buffer.append", audio=b64(piece))
            await wait_for(lambda: server.speech.core.live.num_live == 1)
            assert [s.input_rate for s in server.speech.core.live.streams.values()] == [24_000]
            await client.send("input_audio_buffer.commit")
            events = await client.until(COMPLETED)
        await wait_for(lambda: server.speech.core.live.num_live == 0)
    stream = KyutaiStream(runtime, 24_000)
    expected = (stream.feed(audio).text + stream.finish().text).strip()
    assert expected and "".join(e["delta"] for e in of_type(events, DELTA)) == expected
    assert of_type(events, COMPLETED)[0]["transcript"] == expected


async def test_ga_24k_item_with_input_audio_reaches_kyutai_as_sent(llm_dir, kyutai_dir):
    """A conversation.item.create input_audio part at 24 kHz is transcribed whole at the model's own 24 kHz
    (one resample at most; here none), so its transcript is a 24 kHz KyutaiStream's of the same samples."""
    runtime = load_kyutai(kyutai_dir)
    audio = wire(synthetic_audio(2.0, seed=22, rate=24_000))
    async with voice_server(llm_dir, kyutai_dir) as server:
        async with voice_client(server) as client:
            await client.update(audio={"input": {"format": {"type": "audio/pcm", "rate": 24_000},
                                                 "turn_detection": None}}, temperature=0, max_output_tokens=2)
            await client.send("conversation.item.create", item={
                "type": "message", "role": "user", "content": [{"type": "input_audio", "audio": b64(audio)}]})
            events = await client.until(COMPLETED)
    assert not of_type(events, "error")
    stream = KyutaiStream(runtime, 24_000)
    expected = (stream.feed(audio).text + stream.finish().text).strip()
    assert expected and of_type(events, COMPLETED)[0]["transcript"] == expected
