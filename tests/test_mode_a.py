"""Mode A, one NDJSON request, against a real server: the answer equals the whole prompt's
(greedy, chat and completions, SSE and JSON), prefill runs while a slow body still arrives, bad
lines are errors naming the line, and an upload that is aborted or goes idle leaves no KV and no
session behind."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import assert_nothing_left, one_torch_thread, parse_sse, running_server, wait_for  # noqa: F401
from rill.sessions import StreamingInputConfig
from rill.transports.http import ServerConfig

NDJSON = {"content-type": "application/x-ndjson"}
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Translate: "}]
PIECES = ["the quick", " brown f", "ox jumps over", " the lazy dog", "."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


def ndjson(*lines) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def chunks(pieces, end: bool = False) -> list[dict]:
    out = [{"payload": p} for p in pieces]
    if end:
        out[-1]["end_of_input"] = True
    return out


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if code is not None:
        assert error["code"] == code, error
    return error


def sse_content(text: str) -> str:
    frames = parse_sse(text)
    assert frames[-1].data == "[DONE]", text[-300:]
    return "".join(f.json["choices"][0].get("delta", {}).get("content") or f.json["choices"][0].get("text", "")
                   for f in frames[:-1] if f.json["choices"])


async def test_an_ndjson_chat_answers_like_the_whole_prompt_as_sse_and_as_json(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        whole = {"messages": [MESSAGES[0], {"role": "user", "content": "Translate: " + "".join(PIECES)}], **GREEDY}
        expected = (await client.post("/v1/chat/completions", json=whole)).json()
        first = {"messages": MESSAGES, "stream": True, **GREEDY, "stream_options": {"include_usage": True}}
        response = await client.post("/v1/chat/completions", content=ndjson(first, *chunks(PIECES)), headers=NDJSON)
        assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
        assert sse_content(response.text) == expected["choices"][0]["message"]["content"]
        usage = parse_sse(response.text)[-2].json["usage"]
        assert usage["prompt_tokens"] == expected["usage"]["prompt_tokens"]
        response = await client.post("/v1/chat/completions", headers=NDJSON,
                                     content=ndjson({**first, "stream": False}, *chunks(PIECES, end=True)))
        assert response.json()["choices"] == expected["choices"]
        await assert_nothing_left(server)


async def test_without_a_user_message_the_streamed_text_is_one(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        whole = {"messages": [MESSAGES[0], {"role": "user", "content": "".join(PIECES)}], **GREEDY}
        expected = (await client.post("/v1/chat/completions", json=whole)).json()
        first = {"messages": MESSAGES[:1], **GREEDY}
        response = await client.post("/v1/chat/completions", content=ndjson(first, *chunks(PIECES)), headers=NDJSON)
        assert response.json()["choices"] == expected["choices"]


async def test_an_ndjson_completion_extends_the_prompt_text_or_ids(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        text = "Once upon a time " + "".join(PIECES)
        expected = (await client.post("/v1/completions", json={"prompt": text, **GREEDY})).json()
        first = {"prompt": "Once upon a time ", **GREEDY}
        response = await client.post("/v1/completions", content=ndjson(first, *chunks(PIECES)), headers=NDJSON)
        assert response.json()["choices"] == expected["choices"]
        ids = server.engine.tokenizer.encode("Once upon a time ")
        token_lines = [{"modality": "tokens", "payload": ids}, *chunks(PIECES)]
        response = await client.post("/v1/completions", headers=NDJSON,
                                     content=ndjson({"prompt": [], **GREEDY, "stream": True}, *token_lines))
        assert response.status_code == 200 and sse_content(response.text)
        await assert_nothing_left(server)


async def test_prefill_runs_while_a_slow_body_is_still_arriving(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        def computed() -> int:
            seqs = list(server.engine.core.requests.values())
            return seqs[0][0].num_computed_tokens if seqs else 0

        async def body():
            yield ndjson({"messages": MESSAGES, **GREEDY})
            for piece in PIECES[:-1]:
                yield ndjson({"payload": piece})
            await wait_for(lambda: computed() > 20)  # the prompt so far is in the KV cache
            yield ndjson({"payload": PIECES[-1], "end_of_input": True})

        response = await client.post("/v1/chat/completions", content=body(), headers=NDJSON)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] == GREEDY["max_tokens"]


BAD_LINES = [
    ([b"{not json"], 1, 400, "invalid_json"),
    ([b'{"messages": [], "temperature": "hot"}'], 1, 400, "invalid_type"),
    ([b'{"messages": []}', b'{"payload": "ok"}', b'{"payload": '], 3, 400, "invalid_json"),
    ([b'{"messages": []}', b'{"payload": "ok", "colour": 1}'], 2, 400, None),
    ([b'{"messages": []}', b'{"modality": "audio", "payload": "AAAA"}'], 2, 400, "unsupported_modality"),
    ([b'{"messages": []}', b'{"sequence_id": 1, "payload": "x"}'], 2, 409, "missing_chunks"),
    ([b'{"messages": []}', b'{"sequence_id": 0, "payload": "a"}', b'{"sequence_id": 0, "payload": "b"}'], 3, 409,
     "sequence_id_conflict"),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_bad_line_is_an_error_naming_its_line_and_leaves_nothing(model_dir, stream):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        for lines, number, status, code in BAD_LINES:
            first = json.loads(lines[0]) if lines[0].startswith(b'{"') else None
            if first is not None and "temperature" not in first:
                lines = [json.dumps({**first, "stream": stream}).encode(), *lines[1:]]
            response = await client.post("/v1/chat/completions", content=b"\n".join(lines), headers=NDJSON)
            if status == 409 and number == 2:  # the gap shows once the body has ended
                assert "[0]" in assert_error(response, status, code)["message"]
                continue
            assert f"line {number}:" in assert_error(response, status, code)["message"]
        assert_error(await client.post("/v1/chat/completions", content=b"", headers=NDJSON), 400)
        await assert_nothing_left(server)


async def test_aborting_mid_upload_aborts_the_session_and_frees_kv(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        async def body():
            yield ndjson({"messages": MESSAGES, **GREEDY}, *chunks(PIECES))
            await wait_for(lambda: not server.all_kv_free)  # prefill has started
            raise RuntimeError("the uploader crashed")

        with pytest.raises(RuntimeError, match="uploader crashed"):
            await client.post("/v1/chat/completions", content=body(), headers=NDJSON)
        await wait_for(lambda: server.all_kv_free and not server.app.extensions["rill"].sessions.sessions)
        await assert_nothing_left(server)
        assert server.engine.core.stats.num_aborted == 1


async def test_an_upload_idle_past_the_session_timeout_is_408(model_dir):
    config = ServerConfig(streaming_input=StreamingInputConfig(session_timeout_s=0.3))
    async with running_server(model_dir, config) as server, httpx.AsyncClient(base_url=server.url) as client:
        manager = server.app.extensions["rill"].sessions

        async def body():
            yield ndjson({"messages": MESSAGES, **GREEDY}, *chunks(PIECES[:2]))
            await wait_for(lambda: manager.num_expired == 1)

        response = await client.post("/v1/chat/completions", content=body(), headers=NDJSON)
        assert_error(response, 408, "session_expired")
        await assert_nothing_left(server)


async def test_too_many_open_sessions_is_429_before_reading_chunks(model_dir):
    config = ServerConfig(streaming_input=StreamingInputConfig(max_open_sessions=1))
    async with running_server(model_dir, config) as server, httpx.AsyncClient(base_url=server.url) as client:
        held = trio.Event()

        async def slow_body():
            yield ndjson({"messages": MESSAGES, **GREEDY})
            await held.wait()

        async def hold_one() -> None:
            await client.post("/v1/chat/completions", content=slow_body(), headers=NDJSON)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold_one)
            await wait_for(lambda: server.app.extensions["rill"].sessions.num_open == 1)
            response = await client.post("/v1/chat/completions", content=ndjson({"messages": []}), headers=NDJSON)
            assert_error(response, 429, "too_many_sessions")
            held.set()
        await assert_nothing_left(server)


async def test_respond_per_chunk_answers_each_chunk_and_marks_where_each_answer_ends(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        first = {"prompt": "Captions:", "max_tokens": 3, "temperature": 0, "ignore_eos": True, "stream": True,
                 "streaming_input": {"output_mode": "respond_per_chunk"}}
        server_turns = []

        async def body():
            yield ndjson(first, {"payload": " hello there"})
            await wait_for(lambda: server.engine.core.stats.num_generation_tokens >= 3)
            server_turns.append(server.engine.core.stats.num_generation_tokens)
            yield ndjson({"payload": " and more", "end_of_input": True})

        response = await client.post("/v1/completions", content=body(), headers=NDJSON)
        frames = parse_sse(response.text)
        turn_ends = [f.json["choices"][0] for f in frames[:-1] if "turn_finish_reason" in f.json["choices"][0]]
        assert [c["turn_finish_reason"] for c in turn_ends] == ["length"]
        assert frames[-2].json["choices"][0]["finish_reason"] == "length" and frames[-1].data == "[DONE]"
        assert server_turns == [3]
        await assert_nothing_left(server)
