"""The official openai SDK's realtime client, pointed at rill: it targets a custom server with
`base_url` (/v1/realtime on the HTTP port; the beta client needs `websocket_base_url`, as it
always derives wss://) or `websocket_base_url` (the raw listener), sends the
API key as `Authorization: Bearer`, and parses every event rill sends in text mode. The SDK's
client is sync or asyncio (websockets), so it runs in a worker thread beside the trio server."""

from __future__ import annotations

import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig

openai = pytest.importorskip("openai")
pytest.importorskip("websockets")  # openai[realtime]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


def converse(client, model: str, beta: bool) -> list:
    """One text turn with the SDK (blocking): every event up to response.done, parsed by the SDK."""
    realtime = client.beta.realtime if beta else client.realtime
    events = []
    with realtime.connect(model=model) as conn:
        session = {"modalities": ["text"]} if beta else {"type": "realtime", "output_modalities": ["text"]}
        conn.session.update(session={**session, "instructions": "Be brief."})
        conn.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "Say hello!"}]})
        conn.response.create(response={"max_output_tokens": 5} if not beta else {"max_response_output_tokens": 5})
        for event in conn:
            events.append(event)
            if event.type in ("response.done", "error"):
                break
    return events


async def run_sdk(server, listener: str, beta: bool = False) -> list:
    ws_base = server.ws_url + "/v1" if listener == "raw" else None  # None: derived from base_url
    if beta and ws_base is None:  # the beta client derives wss:// from any base_url: name ws:// outright
        ws_base = server.url.replace("http://", "ws://") + "/v1"
    client = openai.OpenAI(api_key="sekret", base_url=server.v1, websocket_base_url=ws_base, max_retries=0)
    with trio.fail_after(60):
        return await trio.to_thread.run_sync(converse, client, server.serving.model_names[0], beta,
                                             abandon_on_cancel=True)


@pytest.mark.parametrize("listener", ["http", "raw"])
async def test_openai_sdk_realtime_client_holds_a_text_conversation(model_dir, listener):
    config = ServerConfig(api_key="sekret", realtime=RealtimeConfig(ws_port=0))
    async with running_server(model_dir, config) as server:
        events = await run_sdk(server, listener)
    types = [e.type for e in events]
    assert types[0] == "session.created" and types[-1] == "response.done", types
    assert "error" not in types
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1].response
    assert done.output[0].content[0].text == text
    assert done.usage.output_tokens == 5 and done.status == "incomplete"
    assert type(events[-1]).__name__ == "ResponseDoneEvent"  # parsed into the SDK's own model


async def test_openai_sdk_beta_realtime_client_gets_beta_event_names(model_dir):
    config = ServerConfig(api_key="sekret", realtime=RealtimeConfig(ws_port=0))
    async with running_server(model_dir, config) as server:
        events = await run_sdk(server, "http", beta=True)
    types = [e.type for e in events]
    assert "response.text.delta" in types and "error" not in types and types[-1] == "response.done"
