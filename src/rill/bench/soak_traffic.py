"""The traffic of `rill bench soak`: one coroutine per kind of request, each returning its outcome.

An outcome is "2xx", a 4xx status as a string ("400", "404", "413"), "5xx", "dropped" (the client
left on purpose before an answer), "timeout" or "connection_error". A stream that starts with 200
and then carries an error counts by the error's type: server_error is a 5xx, anything else a 400.
Every 5xx also goes into Traffic.samples (what was sent, what came back) so that a soak that fails
says which request failed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

SESSIONS = "/v1/streaming_input/sessions"
NDJSON = {"content-type": "application/x-ndjson"}
PROMPTS = ["What is 12 + 7?", "Reverse the word river.", "Say hello to the team.", "What is 40 - 13?",
           "Spell cat backwards.", "Tell me about the quick brown fox and the lazy dog."]
MAX_SAMPLES = 20


@dataclass
class Traffic:
    """What every kind needs: the HTTP client (base URL set), the realtime URL, limits, 5xx samples."""

    client: object  # httpx.AsyncClient
    ws_url: str
    model: str
    max_body_bytes: int
    samples: list[dict] = field(default_factory=list)

    def outcome(self, response, what: str) -> str:
        """The outcome of a read response; a 5xx (status, or an error inside a 200 stream) is sampled."""
        status = response.status_code
        error = _stream_error(response.text) if status == 200 else None
        if status >= 500 or (error is not None and error.get("type") == "server_error"):
            self.sample(what, status, response.text)
            return "5xx"
        if error is not None:
            return "400"
        return "2xx" if 200 <= status < 300 else str(status)

    def sample(self, what: str, status, body: str) -> None:
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append({"request": what, "status": status, "body": body[:500]})


def _stream_error(text: str) -> dict | None:
    """The error object of an SSE `event: error` frame in text, if any."""
    marker = "event: error\ndata: "
    at = text.find(marker)
    if at < 0:
        return None
    line = text[at + len(marker):].partition("\n")[0]
    try:
        return json.loads(line).get("error") or {}
    except ValueError:
        return {"type": "server_error", "message": "unparseable error frame"}


def _sampling(rng: random.Random, max_tokens: int = 24) -> dict:
    return {"max_tokens": rng.randint(1, max_tokens), "temperature": rng.choice([0, 0.7, 1.0])}


def _messages(rng: random.Random) -> list[dict]:
    return [{"role": "user", "content": rng.choice(PROMPTS)}]


def _pieces(rng: random.Random) -> list[str]:
    """A prompt cut at random places into 1-6 non-empty pieces."""
    text = rng.choice(PROMPTS)
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 5))))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def ndjson(*lines) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


# -- chat and completions ------------------------------------------------------------------------


async def chat(t: Traffic, rng: random.Random) -> str:
    body = {"model": t.model, "messages": _messages(rng), **_sampling(rng)}
    return t.outcome(await t.client.post("/v1/chat/completions", json=body), "chat")


async def chat_stream(t: Traffic, rng: random.Random) -> str:
    body = {"model": t.model, "messages": _messages(rng), "stream": True,
            "stream_options": {"include_usage": True}, **_sampling(rng)}
    return t.outcome(await t.client.post("/v1/chat/completions", json=body), "chat stream")


async def completion(t: Traffic, rng: random.Random) -> str:
    body = {"model": t.model, "prompt": rng.choice(PROMPTS), "stream": rng.random() < 0.5, **_sampling(rng)}
    if rng.random() < 0.3:
        body.update(logprobs=2, echo=rng.random() < 0.5)
    return t.outcome(await t.client.post("/v1/completions", json=body), "completion")


async def disconnect(t: Traffic, rng: random.Random) -> str:
    """A streaming request the client abandons after its first frames (the server must abort it)."""
    body = {"model": t.model, "messages": _messages(rng), "stream": True, "max_tokens": 200, "ignore_eos": True}
    async with t.client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return t.outcome(response, "disconnect")
        frames = rng.randint(1, 4)
        async for line in response.aiter_lines():
            frames -= line.startswith("data: ")
            if frames <= 0:
                return "dropped"  # leaving the block closes the connection mid-stream
    return "2xx"  # the stream ended first


# -- streaming input: Mode A (one NDJSON request) and Mode B (REST sessions) ---------------------


def _mode_a_lines(t: Traffic, rng: random.Random) -> list[dict]:
    first = {"model": t.model, "stream": rng.random() < 0.5, **_sampling(rng)}
    first.update({"messages": [{"role": "user", "content": ""}]} if rng.random() < 0.5 else {"prompt": ""})
    chunks = [{"sequence_id": i, "payload": p} for i, p in enumerate(_pieces(rng))]
    if rng.random() < 0.5:
        chunks[-1]["end_of_input"] = True
    return [first, *chunks]


async def mode_a(t: Traffic, rng: random.Random) -> str:
    lines = _mode_a_lines(t, rng)
    path = "/v1/chat/completions" if "messages" in lines[0] else "/v1/completions"
    return t.outcome(await t.client.post(path, content=ndjson(*lines), headers=NDJSON), f"mode A {path}")


async def mode_a_drop(t: Traffic, rng: random.Random) -> str:
    """A Mode A upload whose connection goes away before its end (the session must be closed)."""
    import trio

    lines = _mode_a_lines(t, rng)

    async def body():
        yield ndjson(*lines[:2])
        await trio.sleep_forever()

    path = "/v1/chat/completions" if "messages" in lines[0] else "/v1/completions"
    with trio.move_on_after(rng.uniform(0.05, 0.5)):
        return t.outcome(await t.client.post(path, content=body(), headers=NDJSON), f"mode A drop {path}")
    return "dropped"


async def _open_session(t: Traffic, rng: random.Random):
    body = {"model": t.model, "messages": [{"role": "system", "content": "Be brief."}], **_sampling(rng)}
    response = await t.client.post(SESSIONS, json=body)
    return response, (response.json()["session_id"] if response.status_code == 201 else None)


async def _send_chunks(t: Traffic, session_id: str, pieces: list[str], order: list[int]):
    """Post the chunks in `order`; the first response that is not a 202, or None."""
    for i in order:
        response = await t.client.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": i, "payload": pieces[i]})
        if response.status_code != 202:
            return response
    return None


async def mode_b(t: Traffic, rng: random.Random) -> str:
    """Create, chunks (sometimes out of order), finish, then the events stream or the result."""
    response, session_id = await _open_session(t, rng)
    if session_id is None:
        return t.outcome(response, "mode B create")
    pieces = _pieces(rng)
    order = rng.sample(range(len(pieces)), len(pieces)) if rng.random() < 0.3 else list(range(len(pieces)))
    failed = await _send_chunks(t, session_id, pieces, order)
    if failed is not None:
        return t.outcome(failed, "mode B chunk")
    response = await t.client.post(f"{SESSIONS}/{session_id}/finish")
    if response.status_code != 202:
        return t.outcome(response, "mode B finish")
    if rng.random() < 0.5:
        return t.outcome(await t.client.get(f"{SESSIONS}/{session_id}/events"), "mode B events")
    return await _poll_result(t, session_id)


async def _poll_result(t: Traffic, session_id: str) -> str:
    import trio

    while True:  # bounded by the caller's per-request timeout
        response = await t.client.get(f"{SESSIONS}/{session_id}/result")
        if response.status_code != 202:
            return t.outcome(response, "mode B result")
        await trio.sleep(0.05)


async def mode_b_abandon(t: Traffic, rng: random.Random) -> str:
    """Create and send some input, then delete the session or just walk away (it must expire)."""
    response, session_id = await _open_session(t, rng)
    if session_id is None:
        return t.outcome(response, "mode B create")
    pieces = _pieces(rng)
    failed = await _send_chunks(t, session_id, pieces, list(range(rng.randint(0, len(pieces)))))
    if failed is not None:
        return t.outcome(failed, "mode B chunk")
    if rng.random() < 0.5:
        return t.outcome(await t.client.delete(f"{SESSIONS}/{session_id}"), "mode B delete")
    return "dropped"


# -- realtime over WebSocket ---------------------------------------------------------------------


async def _realtime(t: Traffic, rng: random.Random, ending: str) -> str:
    """One response on /v1/realtime, read to response.done, cancelled at its first delta, or
    dropped there (the connection closes mid-response)."""
    from trio_websocket import open_websocket_url

    async with open_websocket_url(t.ws_url) as ws:
        async def send(type_: str, **fields) -> None:
            await ws.send_message(json.dumps({"type": type_, **fields}))

        await send("session.update", session={"max_response_output_tokens": 64 if ending != "done" else 16,
                                              "temperature": rng.choice([0, 0.8])})
        text = rng.choice(PROMPTS)
        if rng.random() < 0.5:
            await send("conversation.item.create", item={"type": "message", "role": "user",
                                                         "content": [{"type": "input_text", "text": text}]})
        else:
            await send("input_text_buffer.append", delta=text)
            await send("input_text_buffer.commit")
        await send("response.create")
        return await _read_response(t, ws, send, ending)


async def _read_response(t: Traffic, ws, send, ending: str) -> str:
    response_id, cancelled = None, False
    while True:  # bounded by the caller's per-request timeout
        event = json.loads(await ws.get_message())
        kind = event["type"]
        if kind == "error":
            if event["error"].get("type") == "server_error":
                t.sample(f"realtime {ending}", "error event", json.dumps(event))
                return "5xx"
            return "400"
        if kind == "response.created":
            response_id = event["response"]["id"]
        elif kind == "response.output_text.delta" and ending == "drop":
            return "dropped"
        elif kind == "response.output_text.delta" and ending == "cancel" and not cancelled:
            await send("response.cancel", response_id=response_id)
            cancelled = True
        elif kind == "response.done":
            if event["response"]["status"] == "failed":
                t.sample(f"realtime {ending}", "failed", json.dumps(event))
                return "5xx"
            return "2xx"


async def realtime(t: Traffic, rng: random.Random) -> str:
    return await _realtime(t, rng, "done")


async def realtime_cancel(t: Traffic, rng: random.Random) -> str:
    return await _realtime(t, rng, "cancel")


async def realtime_drop(t: Traffic, rng: random.Random) -> str:
    return await _realtime(t, rng, "drop")


# -- bad inputs ----------------------------------------------------------------------------------


def _bad_requests(t: Traffic) -> dict[str, tuple[str, str, dict]]:
    """name -> (method, path, httpx keyword arguments); each must be answered with a 4xx."""
    json_type = {"content-type": "application/json"}
    oversized = b'{"messages": "' + b"x" * (t.max_body_bytes + 1024) + b'"}'
    return {
        "invalid_json": ("POST", "/v1/chat/completions", {"content": b'{"messages": [', "headers": json_type}),
        "wrong_types": ("POST", "/v1/chat/completions", {"json": {"messages": "hi", "max_tokens": "many"}}),
        "wrong_types_completion": ("POST", "/v1/completions", {"json": {"prompt": 7.5, "temperature": "hot"}}),
        "negative_max_tokens": ("POST", "/v1/completions", {"json": {"prompt": "hi", "max_tokens": -3}}),
        "token_id_out_of_vocab": ("POST", "/v1/completions", {"json": {"prompt": [10**9], "max_tokens": 2}}),
        "unknown_route": ("GET", "/v1/nowhere", {}),
        "wrong_method": ("GET", "/v1/chat/completions", {}),
        "oversized_body": ("POST", "/v1/chat/completions", {"content": oversized, "headers": json_type}),
        "mode_a_bad_line": ("POST", "/v1/chat/completions", {
            "content": ndjson({"messages": []}) + b'{"payload": \n', "headers": NDJSON}),
        "mode_b_unknown_session": ("POST", f"{SESSIONS}/no-such-session/chunks",
                                   {"json": {"sequence_id": 0, "payload": "x"}}),
        "mode_b_bad_chunk": ("POST", SESSIONS, {"json": {"messages": [], "max_tokens": "x"}}),
    }


async def bad_input(t: Traffic, rng: random.Random) -> str:
    requests = _bad_requests(t)
    name = rng.choice([*requests, "realtime_bad_event"])
    if name == "realtime_bad_event":
        return await _realtime_bad_event(t, rng)
    method, path, kwargs = requests[name]
    return t.outcome(await t.client.request(method, path, **kwargs), f"bad input {name}")


async def _realtime_bad_event(t: Traffic, rng: random.Random) -> str:
    from trio_websocket import open_websocket_url

    bad = rng.choice(['{"type": "no.such.event"}', "{not json", '{"type": "input_text_buffer.append", "delta": 7}',
                      '{"type": "response.cancel"}'])
    async with open_websocket_url(t.ws_url) as ws:
        await ws.send_message(bad)
        while True:  # bounded by the caller's per-request timeout
            event = json.loads(await ws.get_message())
            if event["type"] == "error":
                server = event["error"].get("type") == "server_error"
                if server:
                    t.sample("realtime bad event", "error event", json.dumps(event))
                return "5xx" if server else "400"


KINDS = {  # name -> (coroutine, weight)
    "chat": (chat, 3), "chat_stream": (chat_stream, 3), "completion": (completion, 3),
    "mode_a": (mode_a, 2), "mode_a_drop": (mode_a_drop, 1), "mode_b": (mode_b, 2),
    "mode_b_abandon": (mode_b_abandon, 1), "realtime": (realtime, 2), "realtime_cancel": (realtime_cancel, 1),
    "realtime_drop": (realtime_drop, 1), "disconnect": (disconnect, 2), "bad_input": (bad_input, 3),
}
