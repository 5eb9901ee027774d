"""Several models in one server (`rill serve --model A --model B`): a real hypercorn server on
127.0.0.1 in front of two real engines, rill-tiny (the default) and a random-weight Qwen2-VL named
"vision", each answering by name through the openai SDK, httpx and WebSockets: chat, completions,
/tokenize, the Responses API, Mode A and Mode B sessions, realtime by ?model= and session.update,
/v1/models, the 404 for a name no model has, /metrics labelled per model, KV freed on each engine,
one engine's death stopping the server with 1, and `rill serve` itself as a subprocess (two
--model flags; and the default model set with RILL_TINY_VISION_DIR)."""

from __future__ import annotations

import base64
import io
import itertools
import json
import logging
import os
import re
import subprocess
import sys
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import openai
import pytest
import trio
from hypercorn.trio import serve
from trio_websocket import ConnectionRejected, open_websocket_url

from helpers_live_video import FLASHES_QUESTION, light_clip, png_b64, whole_answer
from helpers_server import one_torch_thread, parse_sse, wait_for  # noqa: F401
from helpers_vision import circle_image, make_vl_model_dir
from rill.assets import RILL_TINY_DIR
from rill.config import EngineConfig
from rill.model_set import ModelSpec, ServedModel
from rill.sampling_params import SamplingParams
from rill.server import hypercorn_config, open_engines
from rill.transports.http import ServerConfig, create_app
from rill.transports.realtime.driver import RealtimeConfig
from rill.transports.realtime.quart_route import realtime_hub
from rill.transports.realtime.ws_listener import serve_ws

GREEDY = {"temperature": 0, "max_tokens": 6}
EXTRA = {"ignore_eos": True}
SUM = [{"role": "user", "content": "What is 17 + 25?"}]
SESSIONS = "/v1/streaming_input/sessions"


@pytest.fixture(scope="module")
def vl_dir(tmp_path_factory):
    return make_vl_model_dir(tmp_path_factory.mktemp("qwen2_vl"), "qwen2_vl")


@dataclass
class Servers:
    url: str
    ws_url: str
    app: object
    engines: dict  # served name -> AsyncEngine

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    def all_free(self) -> bool:
        """Every engine: no request, every KV block free."""
        return all(not e.core.requests and e.core.block_manager.num_free_blocks == e.core.block_manager.num_blocks
                   for e in self.engines.values())


@asynccontextmanager
async def two_models(vl_dir, server: ServerConfig | None = None):
    """rill-tiny (the default) and the Qwen2-VL served as "vision", each with its own engine."""
    names = [["rill-tiny"], ["vision"]]
    configs = [EngineConfig(model="rill-tiny", num_kv_blocks=96), EngineConfig(model=str(vl_dir), num_kv_blocks=96)]
    server = server or ServerConfig(realtime=RealtimeConfig(ws_port=0))
    async with open_engines(configs) as engines:
        app = create_app(server=server, models=list(zip(names, engines)))
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, app, hypercorn_config("127.0.0.1", 0, 1.0, server))
            ws_url = await nursery.start(serve_ws, realtime_hub(app), "127.0.0.1", 0)
            try:
                yield Servers(binds[0], ws_url, app, {"rill-tiny": engines[0], "vision": engines[1]})
            finally:
                nursery.cancel_scope.cancel()


async def engine_answer(engine, messages: list[dict], max_tokens: int = 6, ignore_eos: bool = False) -> str:
    """The engine's own greedy answer to a text chat (the oracle for answers by name)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    text = ""
    async for delta in engine.generate(engine.tokenizer.encode_chat(messages), params):
        text += delta.text
    return text


def image_part(image) -> dict:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def question(*parts, text: str = "What colour is the circle?") -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    return error


# -- answers by name -----------------------------------------------------------------------------------------


async def test_each_model_answers_by_name_and_a_request_naming_none_goes_to_the_first(vl_dir):
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=60) as http:
        client = openai.AsyncOpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        tiny = await client.chat.completions.create(model="rill-tiny", messages=SUM, temperature=0, max_tokens=64)
        assert tiny.model == "rill-tiny" and tiny.choices[0].message.content.endswith("17 + 25 = 42")
        unnamed = (await http.post("/v1/chat/completions", json={"messages": SUM, "temperature": 0,
                                                                 "max_tokens": 64})).json()
        assert unnamed["choices"][0]["message"]["content"] == tiny.choices[0].message.content
        vision = await client.chat.completions.create(model="vision", messages=SUM, **GREEDY, extra_body=EXTRA)
        assert vision.model == "vision"
        assert vision.choices[0].message.content == await engine_answer(s.engines["vision"], SUM, ignore_eos=True)
        completion = await client.completions.create(model="vision", prompt="Once upon", **GREEDY, extra_body=EXTRA)
        assert completion.model == "vision" and completion.usage.completion_tokens == 6
        await client.close()
        await wait_for(s.all_free)


async def test_response_ids_are_unique_across_models_and_each_log_line_names_its_model(vl_dir, caplog):
    caplog.set_level(logging.INFO, logger="rill.server")
    async with two_models(vl_dir) as s:
        client = openai.AsyncOpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        ids = []
        for model in ("rill-tiny", "vision", "vision", "rill-tiny"):  # each engine's first request among them
            done = await client.chat.completions.create(model=model, messages=SUM, temperature=0, max_tokens=2)
            ids.append((done.id, model))
        await client.close()
    assert len({i for i, _ in ids}) == 4, ids  # one id sequence for both engines
    for response_id, model in ids:
        line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith(response_id + " "))
        assert line.endswith(f" model={model}"), line


async def test_an_image_goes_to_the_vision_model_and_is_refused_by_rill_tiny(vl_dir):
    messages = question(image_part(circle_image("red")))
    async with two_models(vl_dir) as s:
        client = openai.AsyncOpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        seen = await client.chat.completions.create(model="vision", messages=messages, **GREEDY, extra_body=EXTRA)
        assert seen.usage.prompt_tokens > 20 and seen.usage.completion_tokens == 6  # the image's placeholders
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="rill-tiny", messages=messages, **GREEDY)
        assert refused.value.body["code"] == "unsupported" and "text only" in refused.value.body["message"]
        await client.close()
        await wait_for(s.all_free)
        assert s.engines["vision"].core.scheduler.vision.cache.num_holders == 0


async def test_models_lists_both_and_an_unknown_name_is_404_everywhere(vl_dir):
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=30) as http:
        cards = (await http.get("/v1/models")).json()["data"]
        assert [c["id"] for c in cards] == ["rill-tiny", "vision"]
        assert cards[0]["root"] == "rill-tiny" and cards[1]["root"] == str(vl_dir)
        assert (await http.get("/v1/models/vision")).json()["id"] == "vision"
        assert_error(await http.get("/v1/models/nope"), 404, "model_not_found")
        body = {"model": "nope", "messages": SUM, "max_tokens": 2}
        error = assert_error(await http.post("/v1/chat/completions", json=body), 404, "model_not_found")
        assert "['rill-tiny', 'vision']" in error["message"] and error["param"] == "model"
        for path, fields in (("/v1/completions", {"prompt": "hi"}), ("/tokenize", {"prompt": "hi"}),
                             ("/detokenize", {"tokens": [1]}), ("/v1/responses", {"input": "hi"}),
                             (SESSIONS, {"messages": SUM})):
            assert_error(await http.post(path, json={"model": "nope", **fields}), 404, "model_not_found")
        ndjson = json.dumps({"model": "nope", "messages": SUM}) + "\n"
        assert_error(await http.post("/v1/chat/completions", content=ndjson,
                                     headers={"Content-Type": "application/x-ndjson"}), 404, "model_not_found")
        assert (await http.get("/health")).status_code == 200
        assert s.app.extensions["rill"].sessions.num_open == 0


async def test_tokenize_and_detokenize_use_the_named_models_tokenizer(vl_dir):
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=30) as http:
        for name, engine in s.engines.items():
            ids = (await http.post("/tokenize", json={"model": name, "prompt": "Hello there"})).json()["tokens"]
            assert ids == engine.tokenizer.encode("Hello there")
            text = (await http.post("/detokenize", json={"model": name, "tokens": ids})).json()["prompt"]
            assert text == "Hello there"
        assert (await http.post("/tokenize", json={"model": "rill-tiny", "prompt": "Hello there"})).json()["tokens"] \
            != (await http.post("/tokenize", json={"model": "vision", "prompt": "Hello there"})).json()["tokens"]


async def test_responses_api_runs_on_the_named_model(vl_dir):
    async with two_models(vl_dir) as s:
        client = openai.AsyncOpenAI(base_url=s.v1, api_key="unused", max_retries=0)
        response = await client.responses.create(model="vision", input="What is 17 + 25?", temperature=0,
                                                 max_output_tokens=6)
        assert response.model == "vision"
        assert response.output_text == await engine_answer(s.engines["vision"], SUM)
        await client.close()


# -- streaming input ------------------------------------------------------------------------------------------


async def test_mode_b_and_mode_a_sessions_run_on_the_named_model(vl_dir):
    words = ["What is", " 17 +", " 25?"]
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=60) as http:
        created = await http.post(SESSIONS, json={"model": "vision", "messages": [], **GREEDY, **EXTRA})
        assert created.status_code == 201, created.text
        session_id = created.json()["session_id"]
        for i, word in enumerate(words):
            assert (await http.post(f"{SESSIONS}/{session_id}/chunks",
                                    json={"sequence_id": i, "payload": word})).status_code == 202
        assert s.engines["vision"].core.requests and not s.engines["rill-tiny"].core.requests  # prefilling there
        assert (await http.post(f"{SESSIONS}/{session_id}/finish")).status_code == 202
        result = await http.get(f"{SESSIONS}/{session_id}/result")
        while result.status_code == 202:
            result = await http.get(f"{SESSIONS}/{session_id}/result")
        expected = await engine_answer(s.engines["vision"], SUM, ignore_eos=True)
        assert result.json()["model"] == "vision" and result.json()["choices"][0]["message"]["content"] == expected
        lines = [{"model": "vision", "messages": [], "stream": True, **GREEDY, **EXTRA}]
        lines += [{"sequence_id": i, "payload": w} for i, w in enumerate(words)]
        body = "".join(json.dumps(line) + "\n" for line in lines)
        async with http.stream("POST", "/v1/chat/completions", content=body,
                               headers={"Content-Type": "application/x-ndjson"}) as response:
            frames = parse_sse((await response.aread()).decode())
        text = "".join(f.json["choices"][0]["delta"].get("content", "") for f in frames[:-1] if f.json["choices"])
        assert text == expected and frames[0].json["model"] == "vision"
        await wait_for(s.all_free)


async def test_joining_a_session_as_a_response_names_the_sessions_model(vl_dir):
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=60) as http:
        created = await http.post(SESSIONS, json={"model": "vision", "messages": SUM, **GREEDY})
        session_id = created.json()["session_id"]
        join = {"streaming_input": {"session_id": session_id}}
        error = assert_error(await http.post("/v1/responses", json={"model": "rill-tiny", **join}), 400,
                             "invalid_value")
        assert "vision" in error["message"] and error["param"] == "model"
        joined = await http.post("/v1/responses", json={"model": "vision", **join})
        assert joined.status_code == 200, joined.text
        assert joined.json()["output"][0]["content"][0]["text"] == await engine_answer(s.engines["vision"], SUM)
        await wait_for(s.all_free)


async def test_live_video_frames_go_to_the_vision_model_and_rill_tiny_says_it_reads_text_only(vl_dir):
    frames = light_clip([False, True, True, False])
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=60) as http:
        tiny = (await http.post(SESSIONS, json={"model": "rill-tiny", "messages": []})).json()["session_id"]
        refused = await http.post(f"{SESSIONS}/{tiny}/chunks",
                                  json={"sequence_id": 0, "payload": png_b64(frames[0]), "modality": "image"})
        assert "text only" in assert_error(refused, 400, "unsupported_modality")["message"]
        await http.delete(f"{SESSIONS}/{tiny}")
        session_id = (await http.post(SESSIONS, json={"model": "vision", "messages": [], **GREEDY, **EXTRA})
                      ).json()["session_id"]
        for i, frame in enumerate(frames):
            chunk = {"sequence_id": i, "payload": png_b64(frame), "modality": "image", "timestamp_ms": 500 * i}
            assert (await http.post(f"{SESSIONS}/{session_id}/chunks", json=chunk)).status_code == 202
        await http.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": len(frames),
                                                                  "payload": FLASHES_QUESTION, "end_of_input": True})
        with trio.fail_after(60):
            while (result := await http.get(f"{SESSIONS}/{session_id}/result")).status_code == 202:
                await trio.sleep(0.02)
        vision = OneModel(s.app.extensions["rill"].models.serving_for("vision"))
        assert result.json()["choices"][0]["message"]["content"] == await whole_answer(vision, frames, FLASHES_QUESTION)
        metrics = (await http.get("/metrics")).text
        assert sample(metrics, "rill_live_video_frames_appended_total", "vision") == len(frames)
        assert sample(metrics, "rill_live_video_frames_appended_total", "rill-tiny") == 0
        await wait_for(lambda: s.all_free() and s.app.extensions["rill"].sessions.num_open == 0)


@dataclass
class OneModel:
    """One model of the server as helpers_live_video.whole_answer reads a server: its serving and engine."""

    serving: object

    @property
    def engine(self):
        return self.serving.engine


# -- realtime -------------------------------------------------------------------------------------------------


class Realtime:
    def __init__(self, ws):
        self.ws, self._ids = ws, itertools.count()

    async def send(self, type_: str, **fields) -> None:
        await self.ws.send_message(json.dumps({"type": type_, "event_id": f"c{next(self._ids)}", **fields}))

    async def until(self, type_: str) -> list[dict]:
        events = []
        with trio.fail_after(60):
            while not events or events[-1]["type"] != type_:
                events.append(json.loads(await self.ws.get_message()))
        return events

    async def ask(self, text: str) -> str:
        await self.send("conversation.item.create",
                        item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
        await self.send("response.create", response={"temperature": 0, "max_output_tokens": 6})
        events = await self.until("response.done")
        return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_realtime_with_model_on_the_url_talks_to_that_model(vl_dir, listener):
    async with two_models(vl_dir) as s:
        base = s.url.replace("http://", "ws://") + "/v1/realtime" if listener == "http" else s.ws_url
        async with open_websocket_url(base + "?model=vision") as ws:
            client = Realtime(ws)
            assert (await client.until("session.created"))[-1]["session"]["model"] == "vision"
            assert await client.ask("What is 17 + 25?") == await engine_answer(s.engines["vision"], SUM)
        with pytest.raises(ConnectionRejected) as refused:  # the handshake is refused with the OpenAI 404 body
            async with open_websocket_url(base + "?model=nope"):
                pass
        assert refused.value.status_code == 404 and b"model_not_found" in refused.value.body
        await wait_for(s.all_free)


async def test_realtime_session_update_picks_the_model_before_the_conversation_starts(vl_dir):
    async with two_models(vl_dir) as s:
        async with open_websocket_url(s.url.replace("http://", "ws://") + "/v1/realtime") as ws:
            client = Realtime(ws)
            assert (await client.until("session.created"))[-1]["session"]["model"] == "rill-tiny"
            await client.send("session.update", session={"type": "realtime", "model": "vision"})
            assert (await client.until("session.updated"))[-1]["session"]["model"] == "vision"
            assert await client.ask("What is 17 + 25?") == await engine_answer(s.engines["vision"], SUM)
            url = "data:image/png;base64," + png_b64(light_clip([True])[0])  # rill-tiny's connection refuses it
            await client.send("conversation.item.create", item={"type": "message", "role": "user",
                                                                "content": [{"type": "input_image", "image_url": url}]})
            assert (await client.until("conversation.item.added"))[-1]["item"]["content"][0]["type"] == "input_image"
            await client.send("session.update", session={"type": "realtime", "model": "rill-tiny"})
            error = (await client.until("error"))[-1]["error"]
            assert error["code"] == "invalid_value" and error["param"] == "session.model"
            await client.send("session.update", session={"type": "realtime", "model": "nope"})
            assert (await client.until("error"))[-1]["error"]["code"] == "model_not_found"
            await client.send("session.update", session={"type": "realtime", "model": "vision", "instructions": "x"})
            assert (await client.until("session.updated"))[-1]["session"]["instructions"] == "x"
        await wait_for(s.all_free)


# -- metrics and resources ------------------------------------------------------------------------------------


def sample(text: str, name: str, model: str) -> float:
    match = re.search(rf'^{re.escape(name)}\{{model_name="{model}"\}} (\S+)$', text, re.MULTILINE)
    assert match, f"{name} for {model} is not in /metrics"
    return float(match[1])


async def test_metrics_label_each_models_series_with_model_name(vl_dir):
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=60) as http:
        body = {"model": "vision", "messages": SUM, **GREEDY, **EXTRA}
        assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
        text = (await http.get("/metrics")).text
    assert sample(text, "rill_generation_tokens_total", "vision") == 6
    assert sample(text, "rill_generation_tokens_total", "rill-tiny") == 0
    assert sample(text, "rill_kv_cache_blocks", "rill-tiny") == sample(text, "rill_kv_cache_blocks", "vision") == 96
    assert sample(text, "rill_engine_alive", "vision") == 1
    assert sample(text, "rill_time_to_first_token_seconds_count", "vision") == 1
    assert sample(text, "rill_live_video_open_feeds", "rill-tiny") == 0
    assert not re.search(r"^rill_generation_tokens_total ", text, re.MULTILINE)  # no unlabelled twin
    assert text.count("# HELP rill_generation_tokens_total ") == 1  # one family, a sample per model
    assert re.search(r'^rill_http_requests_total\{endpoint="/v1/chat/completions",status="200"\} 1\.0$', text,
                     re.MULTILINE)


async def test_clients_that_leave_mid_stream_free_kv_on_each_engine(vl_dir):
    async with two_models(vl_dir) as s, httpx.AsyncClient(base_url=s.url, timeout=60) as http:

        async def leave_after_first_token(model: str) -> None:
            body = {"model": model, "messages": SUM, "max_tokens": 400, "stream": True, **EXTRA}
            async with http.stream("POST", "/v1/chat/completions", json=body) as response:
                async for text in response.aiter_text():
                    if '"content"' in text:
                        break

        async with trio.open_nursery() as nursery:
            for model in s.engines:
                nursery.start_soon(leave_after_first_token, model)
        await wait_for(s.all_free, 20)


class InjectedFault(RuntimeError):
    """Fault injection: the vision engine's model runner raises on purpose, to kill that engine."""


async def test_serve_exits_1_when_one_of_its_engines_dies(vl_dir, monkeypatch):
    from rill.engine.model_runner import ModelRunner
    from rill.server import serve as rill_serve

    real_execute, fail = ModelRunner.execute, threading.Event()

    def execute_with_injected_fault(self, *args, **kwargs):
        if fail.is_set() and "VL" in self.model.config.architecture:  # Qwen2VLForConditionalGeneration
            raise InjectedFault("injected fault in the vision engine's model runner")
        return real_execute(self, *args, **kwargs)

    monkeypatch.setattr(ModelRunner, "execute", execute_with_injected_fault)
    models = [ServedModel(["rill-tiny"], EngineConfig(model="rill-tiny", num_kv_blocks=64)),
              ServedModel(["vision"], EngineConfig(model=str(vl_dir), num_kv_blocks=64))]
    status = []
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:

            async def run_server(task_status=trio.TASK_STATUS_IGNORED) -> None:
                status.append(await rill_serve(models, ServerConfig(), "127.0.0.1", 0, 30.0,
                                               shutdown_trigger=trio.sleep_forever, task_status=task_status))

            binds = await nursery.start(run_server)
            async with httpx.AsyncClient(base_url=binds[0], timeout=60) as http:
                fail.set()
                response = await http.post("/v1/chat/completions", json={"model": "vision", "messages": SUM,
                                                                         "max_tokens": 4})
                assert response.status_code >= 500
    assert status == [1]


# -- rill serve -----------------------------------------------------------------------------------------------


@asynccontextmanager
async def rill_serve(tmp_path, args: list[str], env: dict[str, str] | None = None):
    """`rill serve ARGS` as a subprocess on a free port: yields its URL; killed after."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **(env or {})}
    command = [sys.executable, "-m", "rill", "serve", *args, "--port", "0", "--num-kv-blocks", "48",
               "--speech-model", "none", "--tts-model", "none", "--no-web-ui"]
    stderr_path = tmp_path / "stderr.txt"
    with open(stderr_path, "wb") as stderr:
        process = await trio.lowlevel.open_process(command, stderr=stderr, stdout=subprocess.DEVNULL, cwd=tmp_path,
                                                   env=env)
        try:
            with trio.fail_after(120):
                while not (match := re.search(r"serving .* at (http://127\.0\.0\.1:\d+)", stderr_path.read_text())):
                    assert process.returncode is None, stderr_path.read_text()
                    await trio.sleep(0.1)
            yield match[1]
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def ask_each(url: str, names: list[str]) -> dict[str, str]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        assert [c["id"] for c in (await http.get("/v1/models")).json()["data"]] == names
        answers = {}
        for name in names:
            body = {"model": name, "messages": SUM, "temperature": 0, "max_tokens": 64}
            answer = (await http.post("/v1/chat/completions", json=body)).json()
            assert answer["model"] == name, answer
            answers[name] = answer["choices"][0]["message"]["content"]
        return answers


async def test_rill_serve_with_two_model_flags_answers_both(vl_dir, tmp_path):
    async with rill_serve(tmp_path, ["--model", "rill-tiny", "--model", f"vis={vl_dir}"]) as url:
        answers = await ask_each(url, ["rill-tiny", "vis"])
    assert answers["rill-tiny"].endswith("17 + 25 = 42") and answers["vis"]


async def test_rill_serve_with_no_model_serves_rill_tiny_vision_beside_rill_tiny_when_present(vl_dir, tmp_path):
    async with rill_serve(tmp_path, [], env={"RILL_TINY_VISION_DIR": str(vl_dir), "RILL_MODEL": ""}) as url:
        answers = await ask_each(url, ["rill-tiny", "rill-tiny-vision"])
    assert answers["rill-tiny"].endswith("17 + 25 = 42") and answers["rill-tiny-vision"]


# -- which models, named how (rill.model_set) -----------------------------------------------------------------


def test_model_arguments_name_their_models():
    from rill.model_set import model_specs

    assert ModelSpec.parse("vis=/models/qwen") == ModelSpec("/models/qwen", "vis")
    assert ModelSpec.parse("/data/a=b/model") == ModelSpec("/data/a=b/model", "/data/a=b/model")
    assert ModelSpec.parse("rill-tiny") == ModelSpec("rill-tiny", "rill-tiny")
    assert model_specs("/m/a", ["b=/m/b"], "ignored") == [ModelSpec("/m/a", "/m/a"), ModelSpec("/m/b", "b")]
    assert model_specs(None, None, "/m/env") == [ModelSpec("/m/env", "/m/env")]


def test_shipped_models_add_rill_tiny_vision_only_when_its_directory_exists(tmp_path, monkeypatch):
    from rill.model_set import shipped_models

    monkeypatch.setenv("RILL_TINY_VISION_DIR", str(tmp_path / "absent"))
    assert [s.name for s in shipped_models()] == ["rill-tiny"]
    monkeypatch.setenv("RILL_TINY_VISION_DIR", str(tmp_path))
    assert [s.name for s in shipped_models()] == ["rill-tiny", "rill-tiny-vision"]


def test_the_kv_budget_in_bytes_is_split_and_blocks_are_per_model():
    from rill.errors import RillError
    from rill.model_set import served_models

    specs = [ModelSpec("rill-tiny", "rill-tiny"), ModelSpec("/m/b", "b")]
    split = served_models(EngineConfig(kv_cache_bytes=1 << 30, chat_template="T"), specs, ["tiny", "t"])
    assert [m.names for m in split] == [["tiny", "t"], ["b"]]
    assert [m.config.kv_cache_bytes for m in split] == [1 << 29, 1 << 29]
    assert [m.config.chat_template for m in split] == ["T", None] and split[1].config.model == "/m/b"
    blocks = served_models(EngineConfig(num_kv_blocks=64), specs)
    assert [(m.config.num_kv_blocks, m.config.kv_cache_bytes) for m in blocks] == [(64, None), (64, None)]
    one = served_models(EngineConfig(), specs[:1])
    assert one[0].config.kv_cache_bytes is None and one[0].names == ["rill-tiny"]
    with pytest.raises(RillError, match="two models are served as 'b'"):
        served_models(EngineConfig(), [*specs, ModelSpec("/m/c", "b")])
    with pytest.raises(RillError, match="tensor-parallel"):
        served_models(EngineConfig(tensor_parallel_size=2), specs)


def test_rill_tiny_vision_resolves_to_its_directory(tmp_path, monkeypatch):
    from rill.errors import ModelLoadError
    from rill.models.loader import resolve_model_dir

    monkeypatch.setenv("RILL_TINY_VISION_DIR", str(tmp_path))
    assert resolve_model_dir("rill-tiny-vision") == tmp_path
    monkeypatch.setenv("RILL_TINY_VISION_DIR", str(tmp_path / "absent"))
    with pytest.raises(ModelLoadError):
        resolve_model_dir("rill-tiny-vision")
    assert resolve_model_dir("rill-tiny") == RILL_TINY_DIR
