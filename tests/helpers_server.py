"""A real rill HTTP server for tests: hypercorn (trio worker) on 127.0.0.1, an ephemeral port,
the real engine on a random-weight model, inside the test's own trio run."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import torch
import trio
from hypercorn.trio import serve
from quart_trio import QuartTrio

from rill.config import EngineConfig
from rill.engine.async_engine import AsyncEngine, open_engine
from rill.openai.serving import Serving
from rill.server import hypercorn_config
from rill.transports.http import ServerConfig, create_app
from rill.transports.realtime.quart_route import realtime_hub
from rill.transports.realtime.ws_listener import serve_ws


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Import into a test module to use. On a busy CPU (these machines train models while tests
    run) torch's intra-op threads contend and a tiny model's step takes ~25x longer."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class RunningServer:
    url: str  # http://127.0.0.1:PORT
    engine: AsyncEngine
    app: QuartTrio
    ws_url: str | None = None  # the raw realtime listener, when ServerConfig.realtime.ws_port is set

    @property
    def serving(self) -> Serving:
        return self.app.extensions["rill"].serving

    @property
    def v1(self) -> str:
        return self.url + "/v1"

    @property
    def all_kv_free(self) -> bool:
        bm = self.engine.core.block_manager
        return bm.num_free_blocks == bm.num_blocks


@asynccontextmanager
async def running_server(model_dir, server: ServerConfig | None = None, **engine_kwargs):
    config = EngineConfig(model=str(model_dir), **{"num_kv_blocks": 256, **engine_kwargs})
    server = server or ServerConfig()
    hyper = hypercorn_config("127.0.0.1", 0, 1.0, server)  # as rill serve configures hypercorn
    async with open_engine(config) as engine:
        app = create_app(engine=engine, server=server)
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, app, hyper)
            ws_url = None
            if app.extensions["rill"].server.realtime.ws_port is not None:  # any port asks for one: 0 is used
                ws_url = await nursery.start(serve_ws, realtime_hub(app), "127.0.0.1", 0)
            try:
                yield RunningServer(binds[0], engine, app, ws_url)
            finally:
                nursery.cancel_scope.cancel()


async def wait_for(predicate, seconds: float = 10.0, poll_s: float = 0.01) -> None:
    """Poll a condition until it holds; fail after `seconds`."""
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(poll_s)


async def assert_nothing_left(server: RunningServer, seconds: float = 10.0) -> None:
    """Every KV block free, no engine request and no open streaming session (finished ones may stay
    readable). An abort frees KV by the end of the engine's next step, so this waits (with a
    deadline) rather than checking once."""
    sessions = server.app.extensions["rill"].sessions
    await wait_for(lambda: server.all_kv_free and not server.engine.core.requests and sessions.num_open == 0, seconds)


class SSEFrame:
    def __init__(self, event: str | None, data: str):
        self.event, self.data = event, data

    @property
    def json(self):
        return json.loads(self.data)

    def __repr__(self) -> str:
        return f"SSEFrame({self.event!r}, {self.data!r})"


def parse_sse(raw: str) -> list[SSEFrame]:
    """Frames of an SSE body, strictly: each frame ends with a blank line, fields are `event:`/`data:`."""
    assert raw.endswith("\n\n"), f"the stream must end with a complete frame: {raw[-80:]!r}"
    frames = []
    for block in raw[:-2].split("\n\n"):
        event, data = None, []
        for line in block.split("\n"):
            field, _, value = line.partition(": ")
            assert field in ("event", "data"), f"unexpected SSE line {line!r}"
            if field == "event":
                event = value
            else:
                data.append(value)
        frames.append(SSEFrame(event, "\n".join(data)))
    return frames


async def realtime_function_call(server: RunningServer, tools: list[dict], tool_choice, question: str) -> dict:
    """One /v1/realtime exchange: tools and tool_choice set, a user message, response.create;
    the one function_call item of the response.done that follows (no error event on the way)."""
    from trio_websocket import open_websocket_url

    async with open_websocket_url(server.url.replace("http", "ws") + "/v1/realtime") as ws:
        async def send(event: dict) -> None:
            await ws.send_message(json.dumps(event))

        with trio.fail_after(60):
            assert json.loads(await ws.get_message())["type"] == "session.created"
            await send({"type": "session.update", "session": {"tools": tools, "tool_choice": tool_choice,
                                                              "temperature": 0}})
            await send({"type": "conversation.item.create", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}})
            await send({"type": "response.create"})
            while (event := json.loads(await ws.get_message()))["type"] != "response.done":
                assert event["type"] != "error", event
    (call,) = [item for item in event["response"]["output"] if item["type"] == "function_call"]
    return call
