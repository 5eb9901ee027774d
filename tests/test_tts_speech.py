"""Speech out through the wire: POST /v1/audio/speech with the openai SDK for every response_format and both
stream formats (each output decoded and measured), GET /v1/audio/voices, /v1/models, every bad input and
limit at and past, a client leaving mid-answer, and the round trip: the default voice speaks a question and
rill's own /v1/audio/transcriptions (rill-tiny-speech) gives it back."""

from __future__ import annotations

import base64
import io
import json

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import trio

from helpers_server import one_torch_thread, wait_for  # noqa: F401 (a fixture)
from helpers_voice_out import needs_voice, running_voice_server
from rill.assets import RILL_TINY_DIR
from rill.tts.audio_out import FORMATS, encode, open_encoder
from rill.tts.backend import UnknownVoice, Utterance

pytestmark = needs_voice
TEXT = "Hello there. The weather is fine today, and the sun is out."
RATE = 24_000


def decode(data: bytes, fmt: str) -> tuple[int, float]:
    """(sample rate, seconds) of an encoded clip, read back by libsndfile or FFmpeg."""
    if fmt == "pcm":
        return RATE, len(data) / 2 / RATE
    if fmt == "aac":
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.audio[0]
            return stream.rate, sum(frame.samples for frame in container.decode(stream)) / stream.rate
    samples, rate = sf.read(io.BytesIO(data))
    return rate, len(samples) / rate


@pytest.fixture(scope="module")
def espeak():
    from rill.tts.espeak import EspeakBackend

    return EspeakBackend()


@pytest.fixture(scope="module")
def clip(espeak):
    return espeak.synthesize([Utterance(TEXT, "alloy")])[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_streams_in_pieces_and_decodes_to_the_clip(clip, fmt):
    encoder = open_encoder(fmt, RATE)
    pieces = [encoder.write(clip[i:i + 4800]) for i in range(0, clip.size, 4800)] + [encoder.close()]
    rate, seconds = decode(b"".join(pieces), fmt)
    assert rate == RATE
    assert seconds == pytest.approx(clip.size / RATE, abs=0.15)  # mp3/aac add or trim an encoder delay
    if fmt != "flac":  # flac's header carries the length: it comes whole at close (rill.tts.audio_out)
        assert sum(1 for p in pieces[:-1] if p) >= 2, "no bytes before the end: not streamed"


def test_a_whole_wav_has_its_real_length(clip):
    info = sf.info(io.BytesIO(encode(clip, "wav")))
    assert info.frames == clip.size and info.samplerate == RATE


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="response_format"):
        open_encoder("ogg", RATE)


def test_voices_are_distinct_and_speed_changes_the_length(espeak):
    say = lambda voice, speed=1.0: espeak.synthesize([Utterance("What is twelve plus thirty?", voice, speed)])[0]
    alloy, echo, nova = say("alloy"), say("echo"), say("nova")
    assert not np.array_equal(alloy[:2000], echo[:2000]) and not np.array_equal(echo[:2000], nova[:2000])
    base = alloy.size
    assert say("alloy", 2.0).size == pytest.approx(base / 2, rel=0.2)
    assert say("alloy", 4.0).size == pytest.approx(base / 4, rel=0.25)
    assert say("alloy", 0.5).size == pytest.approx(base * 2, rel=0.2)
    assert say("alloy", 0.25).size == pytest.approx(base * 4, rel=0.2)  # below espeak-ng's floor: word gaps
    assert espeak.resolve_voice("en-gb+m3") == "en-gb+m3"
    with pytest.raises(UnknownVoice):
        espeak.resolve_voice("nobody")
    ids = [v.id for v in espeak.voices()]
    assert {"alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer", "verse"} <= set(ids)


def test_phonemize_gives_ipa():
    from rill.tts.libespeak import phonemize

    assert phonemize("Hello there.") == "həlˈoʊ ðˈɛɹ"


@pytest.fixture
async def server():
    async with running_voice_server(RILL_TINY_DIR) as running:
        yield running


def client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=60)


async def test_every_format_through_the_openai_sdk(server):
    api = client(server)
    for fmt in FORMATS:
        response = await api.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt)
        rate, seconds = decode(response.content, fmt)
        assert rate == RATE and 2.0 < seconds < 8.0, (fmt, rate, seconds)
    async with api.audio.speech.with_streaming_response.create(model="rill-espeak", voice={"id": "echo"}, input=TEXT,
                                                               response_format="wav", speed=1.5) as streamed:
        assert streamed.headers["content-type"] == "audio/wav"
        chunks = [chunk async for chunk in streamed.iter_bytes()]
    rate, seconds = decode(b"".join(chunks), "wav")
    assert rate == RATE and 1.0 < seconds < 5.0


async def test_sse_stream_format(server):
    async with httpx.AsyncClient(timeout=60) as http:
        response = await http.post(server.v1 + "/audio/speech", json={
            "model": "gpt-4o-mini-tts", "voice": "nova", "input": TEXT, "response_format": "pcm",
            "stream_format": "sse", "instructions": "Speak cheerfully."})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    seconds = sum(len(base64.b64decode(e["audio"])) for e in deltas) / 2 / RATE
    assert 2.0 < seconds < 8.0
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == len(TEXT) and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


async def test_voices_and_models_list_the_voice(server):
    async with httpx.AsyncClient(timeout=30) as http:
        voices = (await http.get(server.v1 + "/audio/voices")).json()
        models = (await http.get(server.v1 + "/models")).json()
        card = (await http.get(server.v1 + "/models/rill-espeak")).json()
    assert voices["data"][0]["model"] == "rill-espeak"
    assert "alloy" in [v["id"] for v in voices["data"][0]["voices"]]
    assert {"id": "rill-espeak", "task": "speech"}.items() <= next(m for m in models["data"]
                                                                   if m["id"] == "rill-espeak").items()
    assert card["id"] == "rill-espeak"


@pytest.mark.parametrize(("change", "status", "param"), [
    ({"input": ""}, 400, "input"),
    ({"input": "   "}, 400, "input"),
    ({"input": "a" * 4097}, 400, "input"),
    ({"voice": "nobody"}, 400, "voice"),
    ({"voice": {"name": "alloy"}}, 400, "voice"),
    ({"model": "no-such-model"}, 404, "model"),
    ({"response_format": "ogg"}, 400, "response_format"),
    ({"speed": 0.24}, 400, "speed"),
    ({"speed": 4.01}, 400, "speed"),
    ({"stream_format": "chunks"}, 400, "stream_format"),
    ({"input": 5}, 400, "input"),
])
async def test_bad_input_gets_openai_errors(server, change, status, param):
    body = {"model": "tts-1", "voice": "alloy", "input": "Hi.", **change}
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.post(server.v1 + "/audio/speech", json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["message"]
    assert error["code"] == ("model_not_found" if status == 404 else error["code"])


@pytest.mark.parametrize("change", [{"input": "a " * 2048}, {"speed": 0.25}, {"speed": 4.0}])
async def test_limits_are_taken_at_the_limit(server, change):
    body = {"model": "tts-1", "voice": "alloy", "input": "Hi there.", "response_format": "pcm", **change}
    assert len(body["input"]) <= 4096
    async with httpx.AsyncClient(timeout=120) as http:
        response = await http.post(server.v1 + "/audio/speech", json=body)
    assert response.status_code == 200 and len(response.content) > 0


async def test_a_client_leaving_mid_answer_frees_the_request(server):
    out = server.app.extensions["rill"].speech_out
    long_text = " ".join(f"This is sentence number {i} of a long answer." for i in range(60))
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream("POST", server.v1 + "/audio/speech", json={
                "model": "tts-1", "voice": "alloy", "input": long_text, "response_format": "pcm"}) as response:
            async for _ in response.aiter_bytes():
                break  # the first audio: leave
    await wait_for(lambda: out.num_requests == 0 and out.num_queued == 0, 10)


async def test_no_voice_is_a_404(tmp_path):
    from helpers_server import running_server

    async with running_server(RILL_TINY_DIR) as running, httpx.AsyncClient(timeout=30) as http:
        response = await http.post(running.v1 + "/audio/speech", json={"model": "tts-1", "voice": "alloy", "input": "Hi"})
        voices = (await http.get(running.v1 + "/audio/voices")).json()
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert voices["data"] == []


async def test_round_trip_rill_hears_what_it_said():
    """The default voice speaks a question from rill-tiny-speech's arithmetic family; rill's own
    /v1/audio/transcriptions gives it back (rill-tiny-speech learnt from espeak-ng voices)."""
    from rill.speech.async_speech import open_speech_engine
    from rill.transports.http import ServerConfig, create_app
    from rill.tts.espeak import EspeakBackend
    from rill.tts.worker import open_speech_out
    from rill.engine.async_engine import open_engine
    from rill.config import EngineConfig
    from rill.server import hypercorn_config
    from hypercorn.trio import serve

    async with (open_engine(EngineConfig(model=str(RILL_TINY_DIR), num_kv_blocks=64)) as engine,
                open_speech_engine("rill-tiny-speech") as speech, open_speech_out(EspeakBackend()) as out):
        app = create_app(engine=engine, server=ServerConfig(), speech=speech, speech_out=out)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, app, hypercorn_config("127.0.0.1", 0, 1.0, ServerConfig()))
            api = openai.AsyncOpenAI(base_url=binds[0] + "/v1", api_key="unused", max_retries=0, timeout=120)
            spoken = await api.audio.speech.create(model="tts-1", voice="echo", input="What is twelve plus thirty?",
                                                   response_format="wav")
            heard = await api.audio.transcriptions.create(model="rill-tiny-speech",
                                                          file=("question.wav", spoken.content, "audio/wav"))
            nursery.cancel_scope.cancel()
    assert heard.text.strip() == "What is 12 + 30?"
