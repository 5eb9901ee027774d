"""Web pages against the keyless server (issue 52, item 7): a hostile client on 127.0.0.1 plays the
browser of a page at http://evil.example, rebound by DNS to 127.0.0.1 (its Host) or calling across
sites (its Origin), on HTTP and on both WebSocket listeners. On the old code each of these answered
200 or upgraded (101) and the server generated; now each is a 403 in OpenAI's shape and the engine
sees no request. What must keep working: IP literals and localhost with any port, the server's own
page (same origin), clients that send no Origin, --allowed-hosts, --allowed-origins with CORS, and a
server with --api-key, where the key decides."""

from __future__ import annotations

import json

import httpx
import pytest
import trio
from trio_websocket import ConnectionRejected, open_websocket_url

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server  # noqa: F401
from rill.transports.cross_site import ANY, CrossSitePolicy, hosts_for_bind
from rill.transports.http import ServerConfig
from rill.transports.realtime.driver import RealtimeConfig

EVIL = "http://evil.example"
REBOUND = "rebound.evil.example"
PROMPT = {"model": "m", "prompt": "hi", "max_tokens": 4}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


def config(**kwargs) -> ServerConfig:
    return ServerConfig(realtime=RealtimeConfig(ws_port=0), served_model_names=["m"], **kwargs)


def num_served(server) -> int:
    """Generation requests the server finished, whatever their status (rill_requests' counter)."""
    counter = server.app.extensions["rill"].metrics.requests
    return int(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))


def assert_refused(response: httpx.Response, code: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", code)


async def raw_upgrade(url: str, host: str) -> bytes:
    """A WebSocket handshake written by hand (a client library sets Host itself): the status line back."""
    hostport, _, path = url.removeprefix("ws://").partition("/")
    ip, port = hostport.rsplit(":", 1)
    stream = await trio.open_tcp_stream(ip, int(port))
    lines = [f"GET /{path} HTTP/1.1", f"Host: {host}", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13"]
    await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
    with trio.fail_after(10):
        head = await stream.receive_some(4096)
    await stream.aclose()
    return head.split(b"\r\n", 1)[0]


def ws_urls(server) -> list[str]:
    return [server.url.replace("http://", "ws://") + "/v1/realtime", server.ws_url + "/"]


async def test_rebound_host_is_403_on_http_and_both_websocket_listeners(model_dir):
    async with running_server(model_dir, config()) as server, httpx.AsyncClient(base_url=server.url) as client:
        port = server.url.rsplit(":", 1)[1]
        for host in (REBOUND, f"{REBOUND}:{port}", f"{REBOUND.upper()}.:{port}"):
            assert_refused(await client.get("/v1/models", headers={"Host": host}), "host_not_allowed")
            assert_refused(await client.post("/v1/completions", json=PROMPT, headers={"Host": host}),
                           "host_not_allowed")
        for url in ws_urls(server):
            assert (await raw_upgrade(url, f"{REBOUND}:{port}")).startswith(b"HTTP/1.1 403")
        # names this server is reached by: IP literals, localhost, with or without a port
        for host in (f"127.0.0.1:{port}", "127.0.0.1", f"[::1]:{port}", f"localhost:{port}", "app.localhost"):
            assert (await client.get("/v1/models", headers={"Host": host})).status_code == 200, host
        for url in ws_urls(server):
            assert (await raw_upgrade(url, f"localhost:{port}")).startswith(b"HTTP/1.1 101")
        # liveness probes name the pod or service: /health answers any Host
        assert (await client.get("/health", headers={"Host": REBOUND})).status_code == 200
        assert not server.engine.core.requests


async def test_cross_site_simple_post_and_websocket_are_403_and_nothing_generates(model_dir):
    async with running_server(model_dir, config()) as server, httpx.AsyncClient(base_url=server.url) as client:
        simple = {"Origin": EVIL, "Content-Type": "text/plain"}  # what a page may POST with no preflight
        for path in ("/v1/completions", "/v1/chat/completions"):
            assert_refused(await client.post(path, content=json.dumps(PROMPT), headers=simple), "origin_not_allowed")
        assert_refused(await client.post("/v1/completions", content=json.dumps(PROMPT),
                                         headers={"Origin": "null", "Content-Type": "text/plain"}),
                       "origin_not_allowed")  # a sandboxed frame or a file:// page
        assert num_served(server) == 0 and not server.engine.core.requests  # old code: 3 answers generated
        for url in ws_urls(server):
            with pytest.raises(ConnectionRejected) as rejected:
                async with open_websocket_url(url, extra_headers=[(b"origin", EVIL.encode())]):
                    pass
            assert rejected.value.status_code == 403
            assert json.loads(rejected.value.body)["error"]["code"] == "origin_not_allowed"
        # the server's own page (same origin) and clients that send no Origin go on working
        own = {"Origin": server.url, "Content-Type": "text/plain"}
        assert (await client.post("/v1/completions", content=json.dumps(PROMPT), headers=own)).status_code == 200
        assert (await client.post("/v1/completions", json=PROMPT)).status_code == 200
        async with open_websocket_url(ws_urls(server)[0], extra_headers=[(b"origin", server.url.encode())]) as ws:
            assert json.loads(await ws.get_message())["type"] == "session.created"
        assert (await client.get("/", headers={"Origin": server.url})).status_code == 200
        # CORS is off by default: no Access-Control-* header, and a foreign preflight is refused
        answer = await client.get("/v1/models", headers={"Origin": server.url})
        assert not [h for h in answer.headers if h.lower().startswith("access-control-")]
        preflight = await client.options("/v1/completions", headers={"Origin": EVIL,
                                                                     "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 403 and "access-control-allow-origin" not in preflight.headers


async def test_allowed_hosts_and_allowed_origins_with_cors(model_dir):
    app_origin = "https://app.example"
    cfg = config(allowed_hosts=(REBOUND,), allowed_origins=(app_origin,))
    async with running_server(model_dir, cfg) as server, httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/v1/models", headers={"Host": REBOUND})).status_code == 200
        preflight = await client.options("/v1/chat/completions", headers={
            "Origin": app_origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == app_origin
        assert "POST" in preflight.headers["access-control-allow-methods"]
        assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
        answer = await client.post("/v1/completions", json=PROMPT, headers={"Origin": app_origin})
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == app_origin
        assert answer.headers["vary"] == "Origin"
        assert_refused(await client.post("/v1/completions", json=PROMPT, headers={"Origin": EVIL}),
                       "origin_not_allowed")
        async with open_websocket_url(ws_urls(server)[1], extra_headers=[(b"origin", app_origin.encode())]) as ws:
            assert json.loads(await ws.get_message())["type"] == "session.created"


async def test_with_an_api_key_the_key_decides(model_dir):
    """A rebound or cross-site page cannot send the key (browsers send no bearer header on their own)."""
    app_origin = "https://app.example"
    async with running_server(model_dir, config(api_key="sekret", allowed_origins=(app_origin,))) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        key = {"Authorization": "Bearer sekret"}
        assert (await client.get("/v1/models", headers={"Host": REBOUND})).status_code == 401
        assert (await client.get("/v1/models", headers={"Host": REBOUND, **key})).status_code == 200
        keyless_page = {"Origin": EVIL, "Content-Type": "text/plain"}
        assert (await client.post("/v1/completions", content=json.dumps(PROMPT),
                                  headers=keyless_page)).status_code == 401
        assert (await client.post("/v1/completions", json=PROMPT, headers={"Origin": EVIL, **key})).status_code == 200
        with pytest.raises(ConnectionRejected) as rejected:
            async with open_websocket_url(ws_urls(server)[1], extra_headers=[(b"origin", EVIL.encode())]):
                pass
        assert rejected.value.status_code == 401
        # CORS still follows --allowed-origins; a preflight carries no key and is answered before the key check
        preflight = await client.options("/v1/completions", headers={"Origin": app_origin,
                                                                     "Access-Control-Request-Method": "POST"})
        assert preflight.status_code == 204 and preflight.headers["access-control-allow-origin"] == app_origin
        answer = await client.post("/v1/completions", json=PROMPT, headers={"Origin": app_origin, **key})
        assert answer.headers["access-control-allow-origin"] == app_origin
        answer = await client.post("/v1/completions", json=PROMPT, headers={"Origin": EVIL, **key})
        assert answer.status_code == 200 and "access-control-allow-origin" not in answer.headers


def test_host_checks_follow_the_bind_address_as_ollama_and_vllm_do():
    """On by default for a loopback bind or a bind to a name; a bind to every interface or to another
    address is reached by names rill cannot know (container, service and LAN names): off unless
    --allowed-hosts is given."""
    assert hosts_for_bind("127.0.0.1") == hosts_for_bind("[::1]") == hosts_for_bind("localhost") == ()
    assert hosts_for_bind("127.0.0.1", ["a.example"]) == ("a.example",)
    assert hosts_for_bind("rill.internal") == ("rill.internal",)
    assert hosts_for_bind("0.0.0.0") == hosts_for_bind("::") == hosts_for_bind("192.168.1.5") == (ANY,)
    assert hosts_for_bind("0.0.0.0", ["rill"]) == ("rill",)
    policy = CrossSitePolicy.make(api_key=None, allowed_hosts=hosts_for_bind("rill.internal"))
    assert policy.host_allowed("rill.internal:8000") and policy.host_allowed("RILL.internal.")
    assert not policy.host_allowed("rill.internal.evil.example")
    assert CrossSitePolicy.make(api_key=None, allowed_hosts=hosts_for_bind("0.0.0.0")).host_allowed("rill:8000")
    assert CrossSitePolicy.make(api_key=None, allowed_origins=["*"]).origin_allowed(EVIL, "127.0.0.1")
