"""Stored responses, previous_response_id, background runs, resumable streams and cancel, on a real
server (hypercorn on 127.0.0.1) driven by the openai SDK and httpx.

rill-tiny answers where the answer matters (conversations, cached tokens). Runs that must still be
going when a test cancels or drops them use a random-weight model, which rarely samples its end
token, so that a run of a few hundred tokens is really in flight."""

from __future__ import annotations

import json
import random

import httpx
import openai
import pytest
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, running_server, wait_for  # noqa: F401
from rill.assets import RILL_TINY_DIR
from rill.openai.responses_api.config import ResponsesConfig
from rill.transports.http import ServerConfig

MODEL = "rill-tiny"  # the name served, whichever model answers
QUESTION = "What is 17 + 25?"
LONG = {"model": MODEL, "input": "hello", "max_output_tokens": 400, "temperature": 1.0}  # on the random model: a long run


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


def serve(model_dir, **limits):
    """A server whose model answers to MODEL, with the Responses API's limits given."""
    return running_server(model_dir, ServerConfig(served_model_names=[MODEL], responses=ResponsesConfig(**limits)))


def sdk(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)


def http(server) -> httpx.AsyncClient:
    """Raw HTTP as the SDK's client: the same key, so the same owner of stored responses."""
    return httpx.AsyncClient(base_url=server.url, timeout=60, limits=httpx.Limits(max_connections=200),
                             headers={"Authorization": "Bearer unused"})


def nothing_left(server) -> bool:
    """No engine request, every KV block free, no background run, nothing awaiting a first token."""
    runs = server.app.extensions["rill"].responses.runs
    return (server.all_kv_free and not server.engine.core.requests and runs.num_running == 0
            and server.serving.num_awaiting_first_token == 0)


async def wait_for_nothing_left(server, seconds: float) -> None:
    """nothing_left within `seconds`, or a failure that says what was left."""
    try:
        await wait_for(lambda: nothing_left(server), seconds=seconds)
    except trio.TooSlowError:
        bm, runs = server.engine.core.block_manager, server.app.extensions["rill"].responses.runs
        raise AssertionError(f"left after {seconds} s: engine requests {list(server.engine.core.requests)}, "
                             f"{bm.num_blocks - bm.num_free_blocks} KV blocks, {runs.num_running} runs, "
                             f"{server.serving.num_awaiting_first_token} awaiting a first token") from None


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return error


def frames(lines: list[str]) -> list[dict]:
    """Parsed events of SSE lines; each event's `event:` line must name its type."""
    events, kind = [], None
    for line in lines:
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: "):
            event = json.loads(line.removeprefix("data: "))
            assert event["type"] == kind
            events.append(event)
    return events


async def read_events(client: httpx.AsyncClient, method: str, path: str, *, limit: int | None = None,
                      **kwargs) -> list[dict]:
    """The events of an SSE response; with `limit`, the connection is dropped after that many."""
    lines = []
    async with client.stream(method, path, **kwargs) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            lines.append(line)
            if limit is not None and line.startswith("data: ") and len(frames(lines)) >= limit:
                break  # leaving the block drops the connection with the stream unread
    return frames(lines)


# -- stored responses --------------------------------------------------------------------------------------


async def test_retrieve_returns_the_stored_response_and_delete_makes_it_404():
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client:
        created = await client.responses.create(model=MODEL, input=QUESTION, temperature=0)
        assert created.output_text.strip().endswith("42")
        again = await client.responses.retrieve(created.id)
        assert again.id == created.id and again.status == "completed" and again.output_text == created.output_text
        await client.responses.delete(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.delete(created.id)


async def test_store_false_is_answered_but_not_kept():
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client:
        created = await client.responses.create(model=MODEL, input=QUESTION, temperature=0, store=False)
        assert created.status == "completed"
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(created.id)


async def test_input_items_lists_this_turns_items_with_ids_in_openais_list_shape():
    items = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}]
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client, http(server) as raw:
        created = await client.responses.create(model=MODEL, input=items, temperature=0, max_output_tokens=8)
        listed = await client.responses.input_items.list(created.id, order="asc")
        assert [(i.type, i.role) for i in listed.data] == [("message", "system"), ("message", "user")]
        assert all(i.id for i in listed.data)
        page = (await raw.get(f"/v1/responses/{created.id}/input_items", params={"limit": 1})).json()
        assert page["object"] == "list" and page["has_more"] is True
        assert page["data"][0]["role"] == "user" and page["first_id"] == page["last_id"] == page["data"][0]["id"]
        rest = (await raw.get(f"/v1/responses/{created.id}/input_items",
                              params={"limit": 1, "after": page["last_id"]})).json()
        assert rest["data"][0]["role"] == "system" and rest["has_more"] is False
        assert_openai_error(await raw.get(f"/v1/responses/{created.id}/input_items", params={"limit": 101}), 400)


async def test_previous_response_id_continues_the_conversation_from_the_prefix_cache():
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client:
        first = await client.responses.create(model=MODEL, input=QUESTION, temperature=0)
        second = await client.responses.create(model=MODEL, input="What is 3 + 4?", temperature=0,
                                               previous_response_id=first.id)
        assert second.output_text.strip().endswith("7") and second.previous_response_id == first.id
        block_size = server.engine.core.config.block_size
        # The second prompt starts with the first's prompt and answer: their whole blocks are cached.
        assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
        cached = second.usage.input_tokens_details.cached_tokens
        assert cached >= first.usage.input_tokens // block_size * block_size > 0
        listed = await client.responses.input_items.list(second.id)
        assert len(listed.data) == 1  # this turn's input only; the earlier turn is the previous response's


async def test_unknown_ids_are_404_in_openais_shape():
    async with serve(RILL_TINY_DIR) as server, http(server) as raw:
        for method, path in [("GET", "/v1/responses/resp_nope"), ("DELETE", "/v1/responses/resp_nope"),
                             ("POST", "/v1/responses/resp_nope/cancel"),
                             ("GET", "/v1/responses/resp_nope/input_items"),
                             ("GET", "/v1/responses/resp_nope?stream=true")]:
            assert_openai_error(await raw.request(method, path), 404, "response_not_found")
        error = assert_openai_error(await raw.post("/v1/responses", json={
            "input": QUESTION, "previous_response_id": "resp_nope"}), 404)
        assert error["param"] == "previous_response_id"


async def test_responses_of_another_api_key_are_404():
    async with serve(RILL_TINY_DIR) as server, http(server) as raw:
        created = (await raw.post("/v1/responses", json={"input": QUESTION, "max_output_tokens": 4},
                                  headers={"Authorization": "Bearer one"})).json()
        assert (await raw.get(f"/v1/responses/{created['id']}", headers={"Authorization": "Bearer one"})).is_success
        assert_openai_error(await raw.get(f"/v1/responses/{created['id']}", headers={"Authorization": "Bearer two"}),
                            404)


async def test_the_store_keeps_at_most_max_stored_and_evicted_ids_are_404():
    async with serve(RILL_TINY_DIR, max_stored=2) as server, sdk(server) as client:
        ids = [(await client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=2)).id for _ in range(3)]
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(ids[0])
        assert (await client.responses.retrieve(ids[2])).id == ids[2]


# -- background runs ---------------------------------------------------------------------------------------


async def test_background_returns_at_once_and_retrieve_polls_it_to_completed():
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client:
        created = await client.responses.create(model=MODEL, input=QUESTION, temperature=0, background=True)
        assert created.status in ("queued", "in_progress") and created.background
        with trio.fail_after(60):
            while (polled := await client.responses.retrieve(created.id)).status in ("queued", "in_progress"):
                await trio.sleep(0.05)
        assert polled.status == "completed" and polled.output_text.strip().endswith("42")


async def test_background_needs_store():
    async with serve(RILL_TINY_DIR) as server, http(server) as raw:
        error = assert_openai_error(await raw.post("/v1/responses", json={
            "input": QUESTION, "background": True, "store": False}), 400)
        assert error["param"] == "store"


async def test_background_stream_resumed_after_a_dropped_connection_misses_and_repeats_nothing(model_dir):
    async with serve(model_dir) as server, http(server) as raw:
        body = {**LONG, "background": True, "stream": True}
        head = await read_events(raw, "POST", "/v1/responses", json=body, limit=5)
        response_id = head[0]["response"]["id"]
        last = head[-1]["sequence_number"]
        tail = await read_events(raw, "GET", f"/v1/responses/{response_id}",
                                 params={"stream": "true", "starting_after": last})
        union = [e["sequence_number"] for e in head + tail]
        assert union == list(range(len(union)))  # every event once, in order
        assert tail[-1]["type"] in ("response.completed", "response.incomplete")
        replay = await read_events(raw, "GET", f"/v1/responses/{response_id}", params={"stream": "true"})
        assert replay == head + tail  # a reader from the start sees the very same events
        stored = (await raw.get(f"/v1/responses/{response_id}")).json()
        assert stored == tail[-1]["response"]


async def test_stream_of_a_response_that_was_not_background_is_400_and_bad_cursors_too():
    async with serve(RILL_TINY_DIR) as server, http(server) as raw:
        created = (await raw.post("/v1/responses", json={"input": QUESTION, "max_output_tokens": 2})).json()
        assert_openai_error(await raw.get(f"/v1/responses/{created['id']}", params={"stream": "true"}), 400)
        bg = (await raw.post("/v1/responses", json={"input": QUESTION, "max_output_tokens": 2,
                                                    "background": True})).json()
        for cursor in ("-1", "x"):
            assert_openai_error(await raw.get(f"/v1/responses/{bg['id']}",
                                              params={"stream": "true", "starting_after": cursor}), 400)


async def test_cancel_stops_the_run_frees_its_kv_and_stores_cancelled(model_dir):
    async with serve(model_dir) as server, sdk(server) as client, http(server) as raw:
        created = await client.responses.create(**LONG, background=True)
        await wait_for(lambda: server.engine.core.requests, seconds=30)  # generating
        cancelled = await client.responses.cancel(created.id)
        assert cancelled.status == "cancelled"
        await wait_for_nothing_left(server, seconds=5)
        assert (await client.responses.retrieve(created.id)).status == "cancelled"
        assert (await client.responses.cancel(created.id)).status == "cancelled"  # idempotent
        metrics = (await raw.get("/metrics")).text
        assert "rill_num_requests_running 0.0" in metrics
        free, total = (float(line.split()[-1]) for line in metrics.splitlines()
                       if line.startswith(("rill_kv_cache_free_blocks ", "rill_kv_cache_blocks ")))
        assert free == total


async def test_cancel_of_a_response_that_was_not_background_is_400():
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client:
        created = await client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=2)
        with pytest.raises(openai.BadRequestError):
            await client.responses.cancel(created.id)


async def test_background_runs_past_the_bound_get_a_429_in_openais_shape(model_dir):
    async with serve(model_dir, max_background=1) as server, http(server) as raw:
        first = (await raw.post("/v1/responses", json={**LONG, "background": True})).json()
        second = await raw.post("/v1/responses", json={**LONG, "background": True})
        assert_openai_error(second, 429, "too_many_background_responses")
        assert second.headers["Retry-After"] == "1"
        assert (await raw.post(f"/v1/responses/{first['id']}/cancel")).json()["status"] == "cancelled"
        await wait_for_nothing_left(server, seconds=5)


async def test_delete_of_a_running_background_response_aborts_it(model_dir):
    async with serve(model_dir) as server, http(server) as raw:
        created = (await raw.post("/v1/responses", json={**LONG, "background": True})).json()
        await wait_for(lambda: server.engine.core.requests, seconds=30)
        assert (await raw.delete(f"/v1/responses/{created['id']}")).json() == {
            "id": created["id"], "object": "response", "deleted": True}
        await wait_for_nothing_left(server, seconds=5)
        assert_openai_error(await raw.get(f"/v1/responses/{created['id']}"), 404)


async def test_storm_of_background_runs_cancelled_dropped_deleted_and_abandoned_leaves_nothing(model_dir):
    """60 background runs: a quarter cancelled, a quarter followed and dropped, a quarter deleted, a
    quarter abandoned (never read again). Afterwards no engine request, no KV block, no run."""
    rng = random.Random(0)
    async with serve(model_dir) as server, http(server) as raw:

        async def one(i: int, rng: random.Random) -> None:
            body = {"input": "hello", "max_output_tokens": rng.randrange(20, 120), "temperature": 1.0,
                    "background": True, "stream": i % 4 == 1}
            if i % 4 == 1:  # followed, then dropped mid-stream; the run goes on
                await read_events(raw, "POST", "/v1/responses", json=body, limit=rng.randrange(1, 20))
                return
            created = (await raw.post("/v1/responses", json=body)).json()
            await trio.sleep(rng.random() * 0.5)
            if i % 4 == 0:
                assert (await raw.post(f"/v1/responses/{created['id']}/cancel")).status_code == 200
            elif i % 4 == 2:
                assert (await raw.delete(f"/v1/responses/{created['id']}")).status_code == 200

        with trio.fail_after(180):  # bounded in time; generous for a 2-core machine running other suites
            async with trio.open_nursery() as nursery:
                for i in range(60):
                    nursery.start_soon(one, i, random.Random(rng.random()))
        await wait_for_nothing_left(server, seconds=90)
        metrics = (await raw.get("/metrics")).text
        assert "rill_responses_background_running 0.0" in metrics and "rill_num_requests_running 0.0" in metrics
        assert "rill_responses_background_started_total 60.0" in metrics
        assert (await raw.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2})).status_code == 200


# -- a response joining a Mode B streaming-input session (item 5) ----------------------------------------------

SESSIONS = "/v1/streaming_input/sessions"


async def typed_session(raw: httpx.AsyncClient, pieces: list[str]) -> str:
    """A Mode B chat session whose user text arrives in pieces, as if typed; its input left open."""
    created = await raw.post(SESSIONS, json={"model": MODEL, "messages": [{"role": "user", "content": ""}],
                                             "temperature": 0})
    assert created.status_code == 201, created.text
    session_id = created.json()["session_id"]
    for sequence_id, piece in enumerate(pieces):
        sent = await raw.post(f"{SESSIONS}/{session_id}/chunks", json={"sequence_id": sequence_id, "payload": piece})
        assert sent.status_code == 202, sent.text
    return session_id


async def test_a_response_joining_a_typed_session_answers_its_streamed_prompt_and_is_stored():
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client, http(server) as raw:
        session_id = await typed_session(raw, ["What is ", "17 + ", "25?"])
        answer = await client.responses.create(model=MODEL, extra_body={"streaming_input": {"session_id": session_id}})
        assert answer.status == "completed" and answer.output_text.strip().endswith("42")
        assert answer.usage.input_tokens > 0 and answer.usage.output_tokens > 0
        (item,) = (await client.responses.input_items.list(answer.id)).data
        assert (item.role, item.content[0].text) == ("user", "What is 17 + 25?")
        follow_up = await client.responses.create(model=MODEL, input="What is 3 + 4?", temperature=0,
                                                  previous_response_id=answer.id)
        assert follow_up.output_text.strip().endswith("7")
        await wait_for_nothing_left(server, seconds=10)


async def test_a_streamed_response_joining_a_session_sends_the_responses_event_sequence():
    async with serve(RILL_TINY_DIR) as server, sdk(server) as client, http(server) as raw:
        session_id = await typed_session(raw, ["What is ", "17 + 25?"])
        async with client.responses.stream(model=MODEL, extra_body={"streaming_input": {"session_id": session_id}}
                                           ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        assert final.output_text.strip().endswith("42")


async def test_joining_a_session_refuses_fields_the_session_fixed_and_unknown_sessions():
    async with serve(RILL_TINY_DIR) as server, http(server) as raw:
        session_id = await typed_session(raw, ["hi"])
        error = assert_openai_error(await raw.post("/v1/responses", json={
            "input": "other", "streaming_input": {"session_id": session_id}}), 400)
        assert error["param"] == "input"
        assert_openai_error(await raw.post("/v1/responses", json={"streaming_input": {"session_id": "sess_nope"}}),
                            404)
        assert_openai_error(await raw.post("/v1/responses", json={"streaming_input": {"nope": 1}}), 400)
        assert (await raw.delete(f"{SESSIONS}/{session_id}")).status_code == 204
        await wait_for_nothing_left(server, seconds=10)
