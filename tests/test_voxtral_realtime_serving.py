"""POST /v1/audio/transcriptions served by a Voxtral Realtime directory (`rill serve --speech-model DIR`): the
speech worker picks the Voxtral core from config.json's model_type. A real hypercorn server on 127.0.0.1,
the openai SDK, a random-weight model: the tests pin equality with a VoxtralStream fed the same decoded
samples, never words."""

from __future__ import annotations

import io
from contextlib import asynccontextmanager

import httpx
import numpy as np
import openai
import pytest
import soundfile
import trio
from hypercorn.trio import serve as hypercorn_serve

from helpers_models import make_model_dir
from helpers_server import one_torch_thread  # noqa: F401
from helpers_voxtral import make_voxtral_dir, synthetic_audio
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.server import hypercorn_config
from rill.speech.async_speech import open_serving_speech
from rill.speech.audio import load_audio
from rill.speech.decoding import TranscribeParams
from rill.speech.voxtral_realtime import VoxtralStream, load_voxtral_realtime
from rill.speech.voxtral_realtime.core import VoxtralCore
from rill.transports.http import ServerConfig, create_app

if not hasattr(pytest.importorskip("transformers"), "VoxtralRealtimeConfig"):
    pytest.skip("transformers has no Voxtral Realtime (5.x needed)", allow_module_level=True)

URL = "/v1/audio/transcriptions"
SECONDS = 12.5  # two 10 s segments


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="module")
def voxtral_dir(tmp_path_factory):
    return make_voxtral_dir(tmp_path_factory.mktemp("voxtral") / "realtime", "small")


@pytest.fixture(scope="module")
def wav() -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, synthetic_audio(SECONDS, seed=3), 16_000, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def expected(voxtral_dir, wav):
    """One VoxtralStream over the samples the server decodes, with no thread and no socket."""
    stream = VoxtralStream(load_voxtral_realtime(voxtral_dir), 16_000)
    first, last = stream.feed(load_audio(wav)), stream.finish()
    return first.token_ids + last.token_ids, first.text + last.text


@asynccontextmanager
async def voxtral_server(llm_dir, voxtral_dir):
    server = ServerConfig()
    async with open_engine(EngineConfig(model=str(llm_dir), num_kv_blocks=64)) as engine, \
            open_serving_speech(str(voxtral_dir)) as speech:
        assert isinstance(speech.core, VoxtralCore)
        app = create_app(engine=engine, server=server, speech=speech)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn_serve, app, hypercorn_config("127.0.0.1", 0, 1.0, server))
            try:
                yield binds[0], speech
            finally:
                nursery.cancel_scope.cancel()


async def test_sdk_transcribes_a_file_as_the_stream_does_and_refuses_what_it_cannot(llm_dir, voxtral_dir, wav,
                                                                                    expected):
    token_ids, text = expected
    async with voxtral_server(llm_dir, voxtral_dir) as (url, speech):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        plain = await client.audio.transcriptions.create(model=str(voxtral_dir), file=("a.wav", wav))
        verbose = await client.audio.transcriptions.create(model="realtime", file=("a.wav", wav),
                                                           response_format="verbose_json")
        stream = await client.audio.transcriptions.create(model=str(voxtral_dir), file=("a.wav", wav), stream=True)
        events = [event async for event in stream]
        models = await client.models.list()
        await client.close()
        async with httpx.AsyncClient(base_url=url) as raw:
            for field, value in (("prompt", "hello"), ("temperature", "0.5")):
                r = await raw.post(URL, files={"file": ("a.wav", wav)}, data={"model": str(voxtral_dir), field: value})
                assert r.status_code == 400, r.text
                assert r.json()["error"]["param"] == field
        assert not speech.core.requests  # nothing left behind
    assert text.strip() and plain.text == text
    assert verbose.text == text and verbose.duration == pytest.approx(SECONDS)
    assert [(s.start, s.end) for s in verbose.segments] == [(0.0, 10.0), (10.0, SECONDS)]
    assert sum((s.tokens for s in verbose.segments), []) == token_ids
    *deltas, done = events
    assert len(deltas) >= 2 and "".join(e.delta for e in deltas) == text and done.text == text
    card = next(m for m in models.data if m.id == str(voxtral_dir))
    assert card.max_model_len == 12  # the decoder's sliding window: what one step attends


def test_requests_interleave_chunk_by_chunk_and_abort_frees_them(voxtral_dir):
    core = VoxtralCore(str(voxtral_dir), chunk_s=1.0)
    long, short = synthetic_audio(6.0, seed=1), synthetic_audio(1.5, seed=2)
    core.add_request("long", long, TranscribeParams())
    core.add_request("short", short, TranscribeParams())
    core.add_request("gone", long, TranscribeParams())
    core.abort("gone")
    finished = {}
    for _ in range(10):
        for delta in core.step():
            if delta.finished is not None:
                finished[delta.request_id] = core_steps = len(finished)
    assert list(finished) == ["short", "long"] and core_steps == 1 and not core.has_work()
    with pytest.raises(Exception, match="1-D"):
        core.add_request("bad", np.zeros((2, 5), np.float32), TranscribeParams())
    assert not core.requests


def test_the_delay_is_a_core_setting(voxtral_dir):
    runtime = load_voxtral_realtime(voxtral_dir)
    core = VoxtralCore(runtime, delay_ms=160)
    audio = synthetic_audio(1.0, seed=4)
    core.add_request("a", audio, TranscribeParams())
    while core.has_work():
        done = [d.finished for d in core.step() if d.finished is not None]
    stream = VoxtralStream(runtime, delay_ms=160)
    assert done[0].token_ids == stream.feed(audio).token_ids + stream.finish().token_ids
    with pytest.raises(ValueError, match="multiple of 80"):
        VoxtralCore(runtime, delay_ms=100)
