"""POST /v1/audio/transcriptions decodes an upload once, straight to the rate its model hears: Kyutai STT
(24 kHz, its Mimi codec) gets a 24 kHz file's samples as sent and a 44.1 kHz file's in one soxr resample,
never through 16 kHz (which drops the 8-12 kHz band); Whisper (16 kHz) gets a 16 kHz file as sent.
Mode B's spoken chunks at 24 kHz reach Kyutai as sent too.

A real hypercorn server on 127.0.0.1, the openai SDK, random-weight models: the tests pin equality with
the model fed the same samples whole, with no thread and no socket, never words."""

from __future__ import annotations

import io
from contextlib import asynccontextmanager

import numpy as np
import openai
import pytest
import soundfile
import soxr
import trio
from hypercorn.trio import serve as hypercorn_serve

from helpers_kyutai import synthetic_audio
from helpers_voice import mode_b_echo, pcm16_b64, voice_server
from helpers_whisper import make_whisper_dir
from test_kyutai_serving import kyutai_dir, llm_dir  # noqa: F401  (the same random models)
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.server import hypercorn_config
from rill.speech.async_speech import open_serving_speech
from rill.speech.audio import AudioError, load_audio
from rill.speech.core import SpeechCore
from rill.speech.decoding import TranscribeParams
from rill.speech.kyutai import KyutaiStream, load_kyutai
from rill.transports.http import ServerConfig, create_app
from rill.transports.realtime.audio_input import decode_pcm16

SECONDS = 3.0
KYUTAI_RATE = 24_000



def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """A WAV of float32 samples: decoding gives them back bit for bit."""
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def kyutai_tokens(kyutai_dir, samples_24k: np.ndarray) -> list[int]:
    """One KyutaiStream at 24 kHz fed the samples whole: the oracle for what the server must hear."""
    stream = KyutaiStream(load_kyutai(kyutai_dir), KYUTAI_RATE)
    first, last = stream.feed(samples_24k), stream.finish()
    return first.token_ids + last.token_ids


@asynccontextmanager
async def speech_server(llm_dir, speech_dir):
    server = ServerConfig()
    async with open_engine(EngineConfig(model=str(llm_dir), num_kv_blocks=64)) as engine, \
            open_serving_speech(str(speech_dir)) as speech:
        app = create_app(engine=engine, server=server, speech=speech)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn_serve, app, hypercorn_config("127.0.0.1", 0, 1.0, server))
            client = openai.AsyncOpenAI(base_url=binds[0] + "/v1", api_key="unused", max_retries=0)
            try:
                yield client, speech
            finally:
                await client.close()
                nursery.cancel_scope.cancel()


async def upload_tokens(client, wav: bytes) -> tuple[list[int], float]:
    verbose = await client.audio.transcriptions.create(model="stt", file=("a.wav", wav),
                                                       response_format="verbose_json")
    return sum((segment.tokens for segment in verbose.segments), []), verbose.duration


async def test_kyutai_hears_a_24khz_upload_as_sent_and_a_44khz_one_in_one_resample(llm_dir, kyutai_dir):
    x24 = synthetic_audio(SECONDS, seed=5, rate=KYUTAI_RATE)
    x44 = synthetic_audio(SECONDS, seed=6, rate=44_100)
    expected24 = kyutai_tokens(kyutai_dir, x24)
    expected44 = kyutai_tokens(kyutai_dir, soxr.resample(x44, 44_100, KYUTAI_RATE))
    via_16k = soxr.resample(soxr.resample(x44, 44_100, 16_000), 16_000, KYUTAI_RATE)
    assert kyutai_tokens(kyutai_dir, via_16k) != expected44  # the old detour through 16 kHz is heard otherwise
    async with speech_server(llm_dir, kyutai_dir) as (client, speech):
        assert speech.input_rate == KYUTAI_RATE
        got24, duration24 = await upload_tokens(client, wav_bytes(x24, KYUTAI_RATE))
        got44, duration44 = await upload_tokens(client, wav_bytes(x44, 44_100))
        assert not speech.core.requests  # nothing left behind
    assert expected24 and got24 == expected24 and duration24 == pytest.approx(SECONDS)
    assert got44 == expected44 and duration44 == pytest.approx(SECONDS)


async def test_whisper_hears_a_16khz_upload_as_sent(llm_dir, tmp_path):
    whisper_dir = make_whisper_dir(tmp_path / "whisper", max_source_positions=100, max_target_positions=24)
    x16 = synthetic_audio(1.5, seed=7, rate=16_000)
    core = SpeechCore(str(whisper_dir))
    core.add_request("direct", x16, TranscribeParams(language="en"))
    expected = next(d.finished for _ in range(100) for d in core.step() if d.finished is not None)
    async with speech_server(llm_dir, whisper_dir) as (client, speech):
        assert speech.input_rate == 16_000
        wav = wav_bytes(x16, 16_000)
        verbose = await client.audio.transcriptions.create(model=str(whisper_dir), file=("a.wav", wav), language="en",
                                                           response_format="verbose_json")
    assert [s.tokens for s in verbose.segments] == [s.token_ids for s in expected.segments]
    assert verbose.text == expected.text


def test_decoding_to_another_rate_keeps_every_limit():
    x44 = synthetic_audio(2.0, seed=8, rate=44_100)  # more frames than one piece (PIECE_FRAMES)
    wav = wav_bytes(x44, 44_100)
    at_24k = load_audio(wav, rate=KYUTAI_RATE)
    np.testing.assert_array_equal(at_24k, soxr.resample(x44, 44_100, KYUTAI_RATE))  # pieces equal the whole
    assert load_audio(wav, rate=KYUTAI_RATE, max_seconds=2.0).size == at_24k.size  # at the limit
    with pytest.raises(AudioError, match="longer than the limit of 1.9 s"):  # past it
        load_audio(wav, rate=KYUTAI_RATE, max_seconds=1.9)
    with pytest.raises(AudioError, match="outside 1..192000 Hz"):
        load_audio(wav_bytes(synthetic_audio(0.01, rate=384_000), 384_000), rate=KYUTAI_RATE)
    with pytest.raises(AudioError, match="shorter than one sample at 24000 Hz"):
        load_audio(wav_bytes(np.zeros(1, np.float32), 96_000), rate=KYUTAI_RATE)
    with pytest.raises(AudioError, match="sample_rate must be in"):
        load_audio(wav, rate=0)


async def test_mode_b_chunks_at_24khz_reach_kyutai_as_sent(llm_dir, kyutai_dir):
    """Spoken chunks named 24 kHz: the causal stream opens at the model's rate and hears them unresampled,
    so the words in the prompt are a 24 kHz KyutaiStream's over the same samples (read back with echo)."""
    audio = synthetic_audio(SECONDS, seed=9, rate=KYUTAI_RATE)
    stream = KyutaiStream(load_kyutai(kyutai_dir), KYUTAI_RATE)
    wire = decode_pcm16(pcm16_b64(audio), len(audio))  # what the server decodes from the PCM16 sent
    expected = "Q: " + (stream.feed(wire).text + stream.finish().text).strip()
    async with voice_server(llm_dir, kyutai_dir) as server:
        text = await mode_b_echo(server, audio, KYUTAI_RATE, KYUTAI_RATE // 10)
    assert expected != "Q: " and text.startswith(expected), (text, expected)
