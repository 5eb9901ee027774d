"""POST /v1/audio/transcriptions on a real hypercorn server (127.0.0.1, an ephemeral port) with the
speech worker on a random-weight Whisper model beside the LLM engine: the openai SDK for every
response format and for stream=True, httpx for bad input and the byte limit, a client that leaves
mid-stream, /v1/models, /metrics, and `rill serve`'s handling of the speech worker.

Random weights transcribe speech into gibberish, so the tests pin shapes, formats and equality with
the SpeechCore driven directly on the same audio, never words."""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import openai
import pytest
import trio
from hypercorn.trio import serve as hypercorn_serve
from quart_trio import QuartTrio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, parse_sse, wait_for  # noqa: F401
from helpers_whisper import make_whisper_dir
from rill.config import EngineConfig
from rill.engine.async_engine import open_engine
from rill.openai.transcriptions import srt, vtt
from rill.server import hypercorn_config
from rill.speech.async_speech import AsyncSpeechEngine, open_serving_speech
from rill.speech.audio import load_audio
from rill.speech.core import SpeechCore
from rill.transports.http import ServerConfig, create_app

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None,
                                reason="espeak-ng makes the test speech (apt-get install espeak-ng)")
URL = "/v1/audio/transcriptions"


# -- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="module")
def speech_dir(tmp_path_factory):
    """2-second windows, so that a few seconds of speech make several segments."""
    return make_whisper_dir(tmp_path_factory.mktemp("whisper"), multilingual=True, max_source_positions=100,
                            max_target_positions=48)


def espeak(path, text: str) -> bytes:
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True, timeout=60)
    return path.read_bytes()


@pytest.fixture(scope="module")
def wav(tmp_path_factory) -> bytes:
    """About 3 s of speech: two windows of the test model."""
    return espeak(tmp_path_factory.mktemp("wav") / "question.wav", "What is 347 plus 58? Reverse the word stream.")


@pytest.fixture(scope="module")
def expected(speech_dir, wav):
    """The SpeechCore's own transcription of the same audio, driven with no thread and no socket."""
    core = SpeechCore(str(speech_dir))
    core.add_request("direct", load_audio(wav), _params())
    while True:
        for delta in core.step():
            if delta.finished is not None:
                return delta.finished


def _params(**kwargs):
    from rill.speech.decoding import TranscribeParams

    return TranscribeParams(**kwargs)


@dataclass
class SpeechServer:
    url: str
    speech: AsyncSpeechEngine | None
    app: QuartTrio

    @property
    def v1(self) -> str:
        return self.url + "/v1"


@asynccontextmanager
async def speech_server(llm_dir, speech_dir, server: ServerConfig | None = None, **speech_kwargs):
    """rill's app with both engines, as `rill serve` runs them, on an ephemeral port."""
    server = server or ServerConfig()
    hyper = hypercorn_config("127.0.0.1", 0, 1.0, server)
    async with open_engine(EngineConfig(model=str(llm_dir), num_kv_blocks=64)) as engine, \
            open_serving_speech(None if speech_dir is None else str(speech_dir), **speech_kwargs) as speech:
        app = create_app(engine=engine, server=server, speech=speech)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(hypercorn_serve, app, hyper)
            try:
                yield SpeechServer(binds[0], speech, app)
            finally:
                nursery.cancel_scope.cancel()


def sdk(server: SpeechServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def form(model, **fields) -> dict:
    return {"model": str(model), **{k: str(v) for k, v in fields.items()}}


# -- the openai SDK ---------------------------------------------------------------------------------------


async def test_sdk_json_text_and_verbose_json_equal_the_core(llm_dir, speech_dir, wav, expected):
    async with speech_server(llm_dir, speech_dir) as server:
        client = sdk(server)
        plain = await client.audio.transcriptions.create(model=str(speech_dir), file=("q.wav", wav))
        text = await client.audio.transcriptions.create(model=str(speech_dir), file=("q.wav", wav),
                                                        response_format="text")
        verbose = await client.audio.transcriptions.create(model=str(speech_dir), file=("q.wav", wav),
                                                           response_format="verbose_json")
        await client.close()
    assert plain.text == expected.text
    assert plain.usage.type == "duration" and plain.usage.seconds >= expected.duration_s
    assert text == expected.text + "\n"
    assert verbose.text == expected.text and verbose.duration == pytest.approx(expected.duration_s)
    assert len(verbose.segments) == len(expected.segments) >= 2  # ~3 s of speech in 2 s windows
    for got, want in zip(verbose.segments, expected.segments):
        assert (got.id, got.start, got.end, got.text, got.tokens) == (want.id, want.start, want.end, want.text,
                                                                      want.token_ids)
    assert sum((s.tokens for s in verbose.segments), []) == expected.token_ids


async def test_sdk_srt_and_vtt_have_one_cue_per_segment(llm_dir, speech_dir, wav, expected):
    async with speech_server(llm_dir, speech_dir) as server:
        client = sdk(server)
        got_srt = await client.audio.transcriptions.create(model=str(speech_dir), file=("q.wav", wav),
                                                           response_format="srt")
        got_vtt = await client.audio.transcriptions.create(model=str(speech_dir), file=("q.wav", wav),
                                                           response_format="vtt")
        await client.close()
    assert got_srt == srt(expected.segments) and got_vtt == vtt(expected.segments)
    assert got_srt.startswith("1\n00:00:00,000 --> 00:00:02,000\n")
    assert got_vtt.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:02.000\n")
    assert got_srt.count(" --> ") == got_vtt.count(" --> ") == len(expected.segments)


async def test_sdk_stream_deltas_then_done_with_usage(llm_dir, speech_dir, wav, expected):
    async with speech_server(llm_dir, speech_dir) as server:
        client = sdk(server)
        stream = await client.audio.transcriptions.create(model=str(speech_dir), file=("q.wav", wav), stream=True)
        events = [event async for event in stream]
        await client.close()
    *deltas, done = events
    assert deltas and all(e.type == "transcript.text.delta" for e in deltas)
    assert done.type == "transcript.text.done" and done.text == expected.text
    assert "".join(e.delta for e in deltas).strip() == expected.text.strip()
    usage = done.usage
    assert usage.type == "tokens" and usage.output_tokens == len(expected.token_ids)
    assert usage.input_token_details.audio_tokens == math.ceil(expected.duration_s * 50)  # encoder positions
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


async def test_stream_wire_is_data_frames_and_done(llm_dir, speech_dir, wav):
    """OpenAI's framing: `data:` lines only (no `event:`), the done event, then [DONE]."""
    async with speech_server(llm_dir, speech_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        response = await client.post(URL, data=form(speech_dir, stream="true"), files={"file": ("q.wav", wav)},
                                     timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    frames = parse_sse(response.text)
    assert all(f.event is None for f in frames) and frames[-1].data == "[DONE]"
    assert frames[-2].json["type"] == "transcript.text.done"
    assert {f.json["type"] for f in frames[:-2]} == {"transcript.text.delta"}


# -- bad input ---------------------------------------------------------------------------------------------


async def post(server, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        return await client.post(URL, **kwargs)


def assert_error(response: httpx.Response, status: int, code: str, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    assert error["type"] == ("invalid_request_error" if status < 500 else error["type"])
    if param is not None:
        assert error["param"] == param
    return error


async def test_bad_requests_get_openai_errors(llm_dir, speech_dir, wav):
    async with speech_server(llm_dir, speech_dir) as server:
        files = {"file": ("q.wav", wav)}
        assert_error(await post(server, data=form(speech_dir), files={"file": ("e.wav", b"")}), 400,
                     "invalid_audio", "file")
        assert_error(await post(server, data=form(speech_dir), files={"file": ("g.wav", b"\x00garbage" * 100)}),
                     400, "invalid_audio", "file")
        assert_error(await post(server, data=form(speech_dir)), 400, "missing_required_parameter", "file")
        assert_error(await post(server, data=form("whisper-9"), files=files), 404, "model_not_found", "model")
        assert_error(await post(server, data=form(llm_dir), files=files), 404, "model_not_found", "model")
        assert_error(await post(server, data=form(speech_dir, response_format="xml"), files=files), 400,
                     "invalid_value", "response_format")
        assert_error(await post(server, data=form(speech_dir, temperature="hot"), files=files), 400,
                     "invalid_type", "temperature")
        assert_error(await post(server, data=form(speech_dir, language="xx"), files=files), 400,
                     "invalid_value", "language")
        # The worker refused the language; the stream had not started, so this is an HTTP error too.
        assert_error(await post(server, data=form(speech_dir, language="xx", stream="true"), files=files), 400,
                     "invalid_value", "language")
        assert server.speech.is_alive


async def test_a_server_without_speech_answers_404_model_not_found(llm_dir, wav):
    async with speech_server(llm_dir, None) as server:
        error = assert_error(await post(server, data=form("rill-tiny-speech"), files={"file": ("q.wav", wav)}),
                             404, "model_not_found", "model")
        async with httpx.AsyncClient(base_url=server.url) as client:
            ids = [card["id"] for card in (await client.get("/v1/models")).json()["data"]]
    assert "no speech model" in error["message"] and ids == [str(llm_dir)]


# -- the byte limit ---------------------------------------------------------------------------------------


async def test_a_file_at_the_limit_is_read_and_one_byte_past_it_is_413(llm_dir, speech_dir, wav):
    for limit, status in ((len(wav), 200), (len(wav) - 1, 413)):
        async with speech_server(llm_dir, speech_dir, ServerConfig(max_audio_bytes=limit)) as server:
            response = await post(server, data=form(speech_dir), files={"file": ("q.wav", wav)})
        assert response.status_code == status, response.text
    assert_error(response, 413, "request_entity_too_large", "file")


async def test_a_body_past_the_limit_is_refused_by_content_length_or_while_read(llm_dir, speech_dir, wav):
    """Content-Length past the limit: 413 with the body unread. A chunked body (no Content-Length):
    413 as soon as the limit is passed, while the client is still sending (it would send 64 MB)."""
    limit = 10_000
    async with speech_server(llm_dir, speech_dir, ServerConfig(max_audio_bytes=limit)) as server:
        big = await post(server, data=form(speech_dir), files={"file": ("big.wav", wav * 40)})
        status_line, num_sent = await endless_chunked_upload(server.url, max_bytes=64 << 20)
    assert_error(big, 413, "request_entity_too_large", "file")
    assert status_line.startswith(b"HTTP/1.1 413")
    assert num_sent < 16 << 20  # the answer came long before the end: socket buffers hold a few MB at most


async def endless_chunked_upload(url: str, max_bytes: int) -> tuple[bytes, int]:
    """A raw HTTP/1.1 client that streams a chunked multipart body and stops once the answer's status
    line arrives (httpx would send the whole body before reading). Returns it and the bytes sent."""
    host, port = url.removeprefix("http://").split(":")
    stream = await trio.open_tcp_stream(host, int(port))
    answered, status = trio.Event(), []
    num_sent = 0

    async def read_status():
        data = b""
        while b"\r\n" not in data:
            data += await stream.receive_some(4096)
        status.append(data.split(b"\r\n")[0])
        answered.set()

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    with trio.fail_after(60):
        async with stream, trio.open_nursery() as nursery:
            nursery.start_soon(read_status)
            await stream.send_all(b"POST " + URL.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                                  b"Content-Type: multipart/form-data; boundary=b\r\n\r\n")
            await stream.send_all(chunk(b'--b\r\nContent-Disposition: form-data; name="file"; filename="q.wav"\r\n\r\n'))
            try:
                while not answered.is_set() and num_sent < max_bytes:
                    await stream.send_all(chunk(b"\0" * (16 << 10)))
                    num_sent += 16 << 10
            except trio.BrokenResourceError:
                pass  # the server closed the connection under the upload: the answer is in
            await answered.wait()
    return status[0], num_sent


# -- cancellation, models, metrics -----------------------------------------------------------------------------


async def test_disconnect_mid_stream_frees_the_core_row(llm_dir, speech_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rill.server")
    long_wav = espeak(tmp_path / "long.wav", "What's the weather in Tokyo? " * 6)  # ~10 s: several windows
    async with speech_server(llm_dir, speech_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        async with client.stream("POST", URL, data=form(speech_dir, stream="true"),
                                 files={"file": ("long.wav", long_wav)}, timeout=60) as response:
            lines = response.aiter_lines()
            while "transcript.text.delta" not in await anext(lines):
                pass
            assert server.speech.core.has_work()
        # Leaving the block closes the connection with the stream unread.
        await wait_for(lambda: not server.speech.core.has_work() and server.speech.num_requests == 0, seconds=10)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "rill.server" and URL in r.getMessage()]
    assert "status=499" in line  # aborted, not finished


async def test_models_lists_the_llm_and_the_speech_model(llm_dir, speech_dir):
    async with speech_server(llm_dir, speech_dir, model_name="whisper-test") as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        listed = (await client.get("/v1/models")).json()["data"]
        one = await client.get("/v1/models/whisper-test")
        missing = await client.get("/v1/models/whisper-9")
    assert [card["id"] for card in listed] == [str(llm_dir), "whisper-test"]
    assert [card["task"] for card in listed] == ["generate", "transcription"]  # what the web page's picker reads
    assert one.status_code == 200 and one.json() == listed[1]
    assert one.json()["root"] == str(speech_dir) and one.json()["max_model_len"] == 48  # max_target_positions
    assert_error(missing, 404, "model_not_found")


async def test_metrics_count_requests_audio_seconds_and_real_time_factor(llm_dir, speech_dir, wav, expected):
    async with speech_server(llm_dir, speech_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        ok = await client.post(URL, data=form(speech_dir), files={"file": ("q.wav", wav)}, timeout=60)
        bad = await client.post(URL, data=form(speech_dir), files={"file": ("e.wav", b"")})
        text = (await client.get("/metrics")).text
    assert (ok.status_code, bad.status_code) == (200, 400)
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("rill_transcription")}
    assert values['rill_transcription_requests_total{status="200"}'] == 1
    assert values['rill_transcription_requests_total{status="400"}'] == 1
    assert values["rill_transcription_audio_seconds_total"] == pytest.approx(expected.duration_s)
    assert values["rill_transcription_real_time_factor_count"] == 1


# -- rill serve ----------------------------------------------------------------------------------------------


async def test_serve_without_the_rill_tiny_speech_asset_logs_one_line_and_serves_no_speech(monkeypatch, caplog,
                                                                                            tmp_path):
    import rill.speech.async_speech as async_speech

    monkeypatch.setattr(async_speech, "resolve_speech_model", lambda name: tmp_path / "absent")  # a build without it
    caplog.set_level(logging.INFO, logger="rill.speech")
    async with open_serving_speech("rill-tiny-speech") as speech:
        assert speech is None
    (line,) = [r.getMessage() for r in caplog.records if r.name == "rill.speech"]
    assert "rill-tiny-speech" in line and "without speech" in line


async def test_speech_worker_death_fails_the_request_and_stops_serve_fault_injected(llm_dir, speech_dir, wav,
                                                                                     monkeypatch):
    """Fault injection: the core's step raises. The request in flight gets an error (503), and
    rill.server.serve stops and returns 1, as when the LLM engine dies."""
    from rill.server import serve

    def broken_step(self):
        raise RuntimeError("injected fault")

    monkeypatch.setattr(SpeechCore, "step", broken_step)
    async with trio.open_nursery() as nursery:
        config = EngineConfig(model=str(llm_dir), num_kv_blocks=64)
        result = {}

        async def run_serve(task_status=trio.TASK_STATUS_IGNORED):
            result["status"] = await serve(config, ServerConfig(), "127.0.0.1", 0, 1.0, speech_model=str(speech_dir),
                                           shutdown_trigger=trio.sleep_forever, task_status=task_status)

        (url,) = await nursery.start(run_serve)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            response = await client.post(URL, data=form(speech_dir), files={"file": ("q.wav", wav)})
        with trio.fail_after(30):
            while "status" not in result:
                await trio.sleep(0.05)
    assert_error(response, 503, "engine_dead")
    assert result["status"] == 1


async def test_two_concurrent_requests_each_equal_the_core(llm_dir, speech_dir, wav, expected):
    async with speech_server(llm_dir, speech_dir) as server:
        client = sdk(server)
        results = [None, None]

        async def one(i):
            results[i] = await client.audio.transcriptions.create(model=str(speech_dir), file=("q.wav", wav))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, 0)
            nursery.start_soon(one, 1)
        await client.close()
    assert [r.text for r in results] == [expected.text, expected.text]


def test_json_body_is_one_line_of_openai_shape(expected):
    from rill.openai.transcriptions import render

    body, content_type = render(expected, "json")
    assert content_type == "application/json" and json.loads(body) == {
        "text": expected.text, "usage": {"type": "duration", "seconds": float(-(-expected.duration_s // 1))}}
