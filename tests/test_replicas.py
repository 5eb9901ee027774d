"""Two rill replicas behind nginx, all on 127.0.0.1: `rill serve --replica-id` processes on ephemeral
ports, and Debian's nginx running the configuration `rill nginx-config` prints.

Mode B sessions created through nginx land on both replicas and every later call reaches the owner;
stored responses are read back from their owner, and a `previous_response_id` of the other replica's
is redirected to it; a Mode A upload streams through (the answer's first frame arrives before the
upload ends) and a realtime conversation runs over nginx's WebSocket upgrade; when one replica stops,
its sessions get a clear 503 and new requests go to the other.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import trio
from trio_websocket import open_websocket_url

from rill.scaling import nginx as nginx_config
from rill.scaling.replica import ROUTED_HEADER, owner, redirect_for

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
needs_nginx = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (Debian: apt-get install nginx)")

START_TIMEOUT_S = 240  # two replicas load rill-tiny at once on a busy 2-core machine
GREEDY = {"temperature": 0, "max_tokens": 48}
SESSIONS = "/v1/streaming_input/sessions"


@dataclass
class Replica:
    name: str
    proc: subprocess.Popen
    log: Path
    address: str = ""

    def wait_listening(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if "serving " in line and " at http://" in line:
                    self.address = line.rsplit("http://", 1)[1].strip()
                    return
            assert self.proc.poll() is None, f"replica {self.name} exited:\n{self.log.read_text()[-3000:]}"
            time.sleep(0.2)
        raise TimeoutError(f"replica {self.name} did not start:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Cluster:
    url: str  # nginx
    replicas: dict[str, Replica]
    nginx: subprocess.Popen


def start_replica(name: str, tmp: Path) -> Replica:
    log = tmp / f"{name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "rill", "serve", "rill-tiny", "--host", "127.0.0.1", "--port", "0", "--replica-id",
           name, "--speech-model", "none", "--no-web-ui", "--num-kv-blocks", "256", "--shutdown-grace-s", "1"]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    return Replica(name, proc, log)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_nginx(tmp: Path, replicas: list[Replica]) -> tuple[str, subprocess.Popen]:
    listen = f"127.0.0.1:{free_port()}"
    args = ["--listen", listen] + [a for r in replicas for a in ("--replica", f"{r.name}={r.address}")]
    (tmp / "rill.conf").write_text(_rill_nginx_config(args))
    temp = [f"{kind}_temp_path {tmp}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")]
    (tmp / "nginx.conf").write_text("\n".join([
        "daemon off;", "master_process off;", f"pid {tmp}/nginx.pid;", f"error_log {tmp}/error.log info;",
        "events { worker_connections 256; }",
        "http {", f"access_log {tmp}/access.log;", *temp, f"include {tmp}/rill.conf;", "}", ""]))
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-e", str(tmp / "error.log"), "-c", str(tmp / "nginx.conf")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp / "error.log").read_text()
        try:
            socket.create_connection(tuple(listen.rsplit(":", 1)), timeout=1).close()
            return f"http://{listen}", proc
        except OSError:
            time.sleep(0.1)
    raise TimeoutError("nginx did not listen")


def _rill_nginx_config(args: list[str]) -> str:
    done = subprocess.run([sys.executable, "-m", "rill", "nginx-config", *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replicas")
    replicas = {name: start_replica(name, tmp) for name in ("a", "b")}
    nginx = None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for replica in replicas.values():
            replica.wait_listening(deadline)
        url, nginx = start_nginx(tmp, list(replicas.values()))
        yield Cluster(url, replicas, nginx)
    finally:
        for replica in replicas.values():
            replica.stop()
        if nginx is not None:
            nginx.terminate()
            nginx.wait(10)


def served_by(response: httpx.Response) -> str:
    return response.headers["x-rill-replica"]


def chat(text: str) -> dict:
    return {"messages": [{"role": "user", "content": text}], **GREEDY}


# -- Mode B sessions -----------------------------------------------------------------------------------------


async def run_session(client: httpx.AsyncClient, session_id: str, pieces: list[str]) -> str:
    """Append the pieces, finish, read the result: every call checked to reach the owner."""
    for i, piece in enumerate(pieces):
        added = await client.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": i, "payload": piece})
        assert added.status_code == 202 and served_by(added) == owner(session_id), added.text
    finished = await client.post(f"{SESSIONS}/{session_id}/finish")
    assert finished.status_code == 202 and served_by(finished) == owner(session_id), finished.text
    with trio.fail_after(60):
        while (result := await client.get(f"{SESSIONS}/{session_id}/result")).status_code == 202:
            await trio.sleep(0.1)
    assert result.status_code == 200 and served_by(result) == owner(session_id), result.text
    return result.json()["choices"][0]["message"]["content"]


async def create_session(client: httpx.AsyncClient) -> str:
    created = await client.post(SESSIONS, json={"messages": [], **GREEDY})  # the chunks are the user's turn
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    assert owner(session_id) == served_by(created)
    return session_id


@needs_nginx
async def test_sessions_created_through_nginx_land_on_both_replicas_and_each_completes(cluster):
    async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
        ids = [await create_session(client) for _ in range(4)]
        assert {owner(i) for i in ids} == {"a", "b"}
        answers = [await run_session(client, i, ["What is 3", "47 + ", "58?"]) for i in ids]
    assert all(answer.endswith("347 + 58 = 405") for answer in answers), answers


# -- stored responses ------------------------------------------------------------------------------------------


@needs_nginx
async def test_stored_responses_are_read_from_their_owner_and_continued_there(cluster):
    sdk = openai.AsyncOpenAI(base_url=cluster.url + "/v1", api_key="key-1")  # a response is its key's
    first = [await sdk.responses.create(model="rill-tiny", input="What is 347 + 58?", temperature=0,
                                        max_output_tokens=40) for _ in range(2)]
    assert {owner(r.id) for r in first} == {"a", "b"}
    auth = {"Authorization": "Bearer key-1"}
    async with httpx.AsyncClient(base_url=cluster.url, timeout=60, follow_redirects=True, headers=auth) as client:
        for response in first:
            for _ in range(3):  # least_conn alone would miss the owner about half the time
                got = await client.get(f"/v1/responses/{response.id}")
                assert got.status_code == 200 and got.json()["id"] == response.id
        b_id = next(r.id for r in first if owner(r.id) == "b")
        continued = [await client.post("/v1/responses", json={
            "model": "rill-tiny", "input": "Uppercase: hello world", "previous_response_id": b_id,
            "temperature": 0, "max_output_tokens": 20}) for _ in range(4)]
    assert all(c.status_code == 200 and served_by(c) == "b" for c in continued), [c.text for c in continued]
    redirected = [c for c in continued if c.history]
    assert redirected and all(h.status_code == 307 and served_by(h) == "a" for c in redirected for h in c.history)
    assert all(owner(c.json()["id"]) == "b" and c.json()["previous_response_id"] == b_id for c in continued)


# -- Mode A and realtime -------------------------------------------------------------------------------------------


async def chunks_received(cluster: Cluster) -> int:
    """Streaming-input chunks the replicas have taken in, from each one's /metrics (not through nginx)."""
    total = 0
    async with httpx.AsyncClient(timeout=30) as client:
        for replica in cluster.replicas.values():
            text = (await client.get(f"http://{replica.address}/metrics")).text
            total += sum(int(float(line.split()[-1])) for line in text.splitlines()
                         if line.startswith("rill_streaming_input_chunks_total "))
    return total


@needs_nginx
async def test_a_mode_a_upload_reaches_the_replica_line_by_line_through_nginx(cluster):
    before = await chunks_received(cluster)

    async def body():
        yield (json.dumps({**chat(""), "stream": True}) + "\n").encode()
        yield (json.dumps({"payload": "What is 347 + 58?"}) + "\n").encode()
        with trio.fail_after(60):  # no request buffering: the replica has the chunk while the upload goes on
            while await chunks_received(cluster) == before:
                await trio.sleep(0.1)
        yield (json.dumps({"payload": "", "end_of_input": True}) + "\n").encode()

    async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
        headers = {"content-type": "application/x-ndjson"}
        response = await client.post("/v1/chat/completions", content=body(), headers=headers)
    assert response.status_code == 200, response.text
    frames = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    content = "".join(json.loads(f)["choices"][0]["delta"].get("content") or "" for f in frames[:-1]
                      if json.loads(f)["choices"])
    assert content.endswith("347 + 58 = 405"), content


@needs_nginx
async def test_a_realtime_conversation_runs_through_nginx(cluster):
    ws_url = cluster.url.replace("http://", "ws://") + "/v1/realtime"
    async with open_websocket_url(ws_url) as ws:
        async def recv() -> dict:
            with trio.fail_after(60):
                return json.loads(await ws.get_message())

        assert (await recv())["type"] == "session.created"
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Uppercase: hello world"}]}
        await ws.send_message(json.dumps({"type": "conversation.item.create", "item": item}))
        assert (await recv())["type"] == "conversation.item.added"
        assert (await recv())["type"] == "conversation.item.done"
        await ws.send_message(json.dumps({"type": "response.create", "response": {"temperature": 0}}))
        events = [await recv()]
        while events[-1]["type"] != "response.done":
            events.append(await recv())
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "HELLO WORLD"


# -- a replica that stops (last: it stops one) -----------------------------------------------------------------


@needs_nginx
async def test_a_stopped_replica_is_taken_out_its_sessions_get_a_clear_error(cluster):
    async with httpx.AsyncClient(base_url=cluster.url, timeout=60) as client:
        ids = [await create_session(client) for _ in range(2)]
        on_b = next(i for i in ids if owner(i) == "b")
        await trio.to_thread.run_sync(cluster.replicas["b"].stop)
        lost = await client.post(f"{SESSIONS}/{on_b}/chunks", json={"sequence_id": 0, "payload": "hi"})
        assert lost.status_code == 503, lost.text
        error = lost.json()["error"]
        assert error["code"] == "replica_unreachable" and "replica b" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        fresh = [await create_session(client) for _ in range(3)]
        assert {owner(i) for i in fresh} == {"a"}
        answers = [await run_session(client, i, ["Uppercase: ", "hello world"]) for i in fresh]
        assert answers == ["HELLO WORLD"] * 3
        completions = [await client.post("/v1/chat/completions", json=chat("What is 347 + 58?")) for _ in range(3)]
        assert all(c.status_code == 200 and served_by(c) == "a" for c in completions)
    assert cluster.replicas["b"].proc.returncode == 0  # it stopped as asked, not crashed


def test_nginx_config_refuses_bad_replicas_and_names_each_route():
    text = nginx_config.render("127.0.0.1:8080", [nginx_config.Replica("a", "10.0.0.1:8000"),
                                                   nginx_config.Replica("web-1", "10.0.0.2:8000")])
    assert '"~^/v1/streaming_input/sessions/web-1\\." web-1;' in text and "upstream rill_replica_web_1" in text
    assert "proxy_request_buffering off;" in text and "proxy_buffering off;" in text and "least_conn;" in text
    for bad in (["--replica", "a.b=1.2.3.4:5"], ["--replica", "a=1.2.3.4"], ["--replica", "a=1.2.3.4:0"],
                ["--replica", "a"], ["--replica", "a=h:1;x"]):
        with pytest.raises(SystemExit):
            nginx_config.main(["--listen", "127.0.0.1:8080", *bad])
    with pytest.raises(SystemExit):  # two replicas of one name
        nginx_config.main(["--listen", "127.0.0.1:8080", "--replica", "a=h:1", "--replica", "a=h:2"])


def test_a_body_naming_another_replicas_state_is_sent_to_that_replica_once():
    def body(**fields) -> bytes:
        return json.dumps({"model": "m", "input": "hi", **fields}).encode()

    path = "/v1/responses"
    assert redirect_for("a", body(previous_response_id="b.resp_1"), path) == "/_rill/replica/b/v1/responses"
    assert redirect_for("a", body(streaming_input={"session_id": "web-2.sess_9"}), path) == \
        "/_rill/replica/web-2/v1/responses"
    assert redirect_for("a", body(previous_response_id="a.resp_1"), path) is None  # its own
    assert redirect_for("a", body(previous_response_id="resp_1"), path) is None  # no replica named
    assert redirect_for("a", body(previous_response_id="b.resp_1"), path, routed=True) is None  # came via b's path
    assert redirect_for(None, body(previous_response_id="b.resp_1"), path) is None  # not behind a router
    two = body(previous_response_id="b.resp_1", streaming_input={"session_id": "c.sess_2"})
    assert redirect_for("a", two, path) is None  # names two owners: the replica answers (404) itself
    for bad in (b"{not json", b'{"previous_response_id": 5}', b"[]"):
        assert redirect_for("a", bad, path) is None  # the handler reports what is wrong with it
    assert owner("b.resp_1") == "b" and owner("b..x") == "b" and owner(".x") is None and owner("a b.x") is None
    assert ROUTED_HEADER == "X-Rill-Routed"
