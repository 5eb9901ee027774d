"""Mode B, REST streaming-input sessions, against a real server: the answer equals the whole
prompt's (greedy) whatever order chunks arrive in, every call's idempotence and errors (404,
409, 410, 413, 429 in OpenAI's shape), per-key visibility, the events stream before and after
finish and across reconnects, and no KV or session left behind by any error path."""

from __future__ import annotations

import httpx
import openai
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers_models import make_model_dir
from helpers_server import assert_nothing_left, one_torch_thread, parse_sse, running_server, wait_for  # noqa: F401
from rill.sessions import StreamingInputConfig
from rill.transports.http import ServerConfig

SESSIONS = "/v1/streaming_input/sessions"
WORDS = ["Tell me", " about the quick", " brown fox", " and the", " lazy dog", " today."]
GREEDY = {"temperature": 0, "max_tokens": 6, "ignore_eos": True}
SYSTEM = {"role": "system", "content": "Be brief."}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("mistral"), "mistral")


def limits(**fields) -> ServerConfig:
    return ServerConfig(streaming_input=StreamingInputConfig(**fields))


def manager(server):
    return server.app.extensions["rill"].sessions


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


async def create(client, **fields) -> str:
    body = {"messages": [SYSTEM], **GREEDY, **fields}
    response = await client.post(SESSIONS, json=body)
    assert response.status_code == 201, response.text
    assert response.headers["location"] == f"{SESSIONS}/{response.json()['session_id']}"
    return response.json()["session_id"]


async def send(client, session_id: str, sequence_id: int, payload, **fields) -> httpx.Response:
    return await client.post(f"{SESSIONS}/{session_id}/chunks",
                             json={"sequence_id": sequence_id, "payload": payload, **fields})


async def whole_answer(client, text: str) -> str:
    body = {"messages": [SYSTEM, {"role": "user", "content": text}], **GREEDY}
    response = await client.post("/v1/chat/completions", json=body)
    return response.json()["choices"][0]["message"]["content"]


def parse_events(raw: str):
    """The frames of an events stream, after checking each carries its index as its SSE id."""
    blocks = raw.split("\n\n")[:-1]
    assert [b.partition("\n")[0] for b in blocks] == [f"id: {i}" for i in range(len(blocks))], raw[:200]
    return parse_sse("".join(b.partition("\n")[2] + "\n\n" for b in blocks))


def content_of(frames) -> str:
    return "".join(f.json["choices"][0]["delta"].get("content", "") for f in frames
                   if f.data != "[DONE]" and f.json["choices"])


# -- the answer ---------------------------------------------------------------------------------------------


@settings(max_examples=6, deadline=None)
@given(order=st.permutations(range(len(WORDS))), repeats=st.lists(st.integers(0, len(WORDS) - 1), max_size=3))
async def test_chunks_in_any_order_with_repeats_answer_like_the_whole_prompt(model_dir, order, repeats):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        session_id = await create(client)
        for i in [*order, *repeats]:
            response = await send(client, session_id, i, WORDS[i])
            assert response.status_code == 202, response.text
        finish = await client.post(f"{SESSIONS}/{session_id}/finish")
        assert finish.status_code == 202 and finish.json()["state"] in ("finished", "closed")
        result = await client.get(f"{SESSIONS}/{session_id}/result")
        while result.status_code == 202:
            result = await client.get(f"{SESSIONS}/{session_id}/result")
        assert result.json()["choices"][0]["message"]["content"] == await whole_answer(client, "".join(WORDS))
        assert result.json()["usage"]["completion_tokens"] == GREEDY["max_tokens"]
        await assert_nothing_left(server)


async def test_the_events_stream_opened_before_finish_and_after_it_carry_the_same_answer(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        session_id = await create(client, chunk={"sequence_id": 0, "payload": WORDS[0]})
        early: list[str] = []

        async def read_early() -> None:
            async with client.stream("GET", f"{SESSIONS}/{session_id}/events") as response:
                assert response.status_code == 200
                early.append((await response.aread()).decode())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_early)
            for i, words in enumerate(WORDS[1:], 1):
                assert (await send(client, session_id, i, words)).status_code == 202
            assert (await client.post(f"{SESSIONS}/{session_id}/finish")).status_code == 202
        late = (await client.get(f"{SESSIONS}/{session_id}/events")).text
        assert early == [late]
        frames = parse_events(late)
        assert frames[-1].data == "[DONE]" and frames[0].json["choices"][0]["delta"] == {"role": "assistant"}
        assert content_of(frames) == await whole_answer(client, "".join(WORDS))
        await assert_nothing_left(server)


async def test_a_reconnect_with_last_event_id_resumes_after_it(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        session_id = await create(client, chunk={"sequence_id": 0, "payload": "hi", "end_of_input": True})
        whole = (await client.get(f"{SESSIONS}/{session_id}/events")).text
        blocks = whole.split("\n\n")[:-1]
        assert len(parse_events(whole)) == len(blocks) > 3
        resumed = await client.get(f"{SESSIONS}/{session_id}/events", headers={"Last-Event-ID": "2"})
        assert resumed.text == "\n\n".join(blocks[3:]) + "\n\n"
        bad = await client.get(f"{SESSIONS}/{session_id}/events", headers={"Last-Event-ID": "x"})
        assert_error(bad, 400)


async def test_the_openai_sdk_reads_the_events_stream_as_chat_chunks(model_dir):
    async with running_server(model_dir) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="k", max_retries=0)
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer k"}) as http:
            session_id = await create(http, chunk={"sequence_id": 0, "payload": "hi", "end_of_input": True})
        stream = await client.get(f"/streaming_input/sessions/{session_id}/events", cast_to=openai.types.chat.
                                  ChatCompletionChunk, stream=True,
                                  stream_cls=openai.AsyncStream[openai.types.chat.ChatCompletionChunk])
        chunks = [chunk async for chunk in stream]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].choices[0].finish_reason == "length"
        await client.close()


async def test_result_is_202_while_running_and_the_state_shows_progress(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client, streaming_input={"start_policy": "on_min_length:4"})
        response = await client.get(f"{SESSIONS}/{session_id}/result")
        assert response.status_code == 202 and response.json()["state"] == "open"
        response = await send(client, session_id, 0, "one two three four five six seven")
        assert response.json() == {"started": True, "next_sequence_id": 1, "state": "started"}
        state = (await client.get(f"{SESSIONS}/{session_id}")).json()
        assert state["num_payload_bytes"] == 33 and 0 < state["expires_in"] <= 300
        assert state["close_reason"] is None and state["object"] == "streaming_input.session"


async def test_respond_per_chunk_chat_answers_each_chunk_as_its_own_user_turn(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        session_id = await create(client, max_tokens=3, streaming_input={"output_mode": "respond_per_chunk"},
                                  chunk={"sequence_id": 0, "payload": "first caption"})
        engine = server.engine.core
        await wait_for(lambda: engine.stats.num_generation_tokens >= 3)  # the first chunk's answer
        await send(client, session_id, 1, "second caption", end_of_input=True)
        frames = parse_events((await client.get(f"{SESSIONS}/{session_id}/events")).text)
        turns = [f.json["choices"][0].get("turn_finish_reason") for f in frames[:-1] if f.json["choices"]]
        assert turns.count("length") == 1 and frames[-2].json["choices"][0]["finish_reason"] == "length"
        run = manager(server).sessions[session_id].run
        text = server.engine.tokenizer.decode(run.ids, skip_special_tokens=False)
        # ChatML: the answer is closed and the next chunk opens a user turn of its own.
        assert "first caption<|im_end|>\n<|im_start|>assistant\n" in text
        assert text.endswith("<|im_end|>\n<|im_start|>user\nsecond caption<|im_end|>\n<|im_start|>assistant\n")
        await assert_nothing_left(server)


# -- idempotence ------------------------------------------------------------------------------------------


async def test_finish_and_delete_are_idempotent_and_delete_frees_kv(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client, max_tokens=200)
        await send(client, session_id, 0, "a long enough input to hold some KV blocks " * 3)
        first = await client.post(f"{SESSIONS}/{session_id}/finish")
        again = await client.post(f"{SESSIONS}/{session_id}/finish")
        assert first.status_code == again.status_code == 202
        await wait_for(lambda: not server.all_kv_free)
        for _ in range(2):
            assert (await client.delete(f"{SESSIONS}/{session_id}")).status_code == 204
        await wait_for(lambda: server.all_kv_free)
        assert_error(await client.get(f"{SESSIONS}/{session_id}"), 410, "session_deleted")
        assert_error(await send(client, session_id, 1, "x"), 410, "session_deleted")
        await assert_nothing_left(server)
        assert not manager(server).sessions


# -- errors -------------------------------------------------------------------------------------------------


async def test_unknown_ids_are_404_and_a_session_is_invisible_to_other_keys(model_dir):
    async with running_server(model_dir) as server:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer alice"}) as alice, \
                httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer bob"}) as bob:
            session_id = await create(alice)
            for method, path in (("GET", ""), ("GET", "/events"), ("GET", "/result"), ("POST", "/finish"),
                                 ("DELETE", "")):
                response = await bob.request(method, f"{SESSIONS}/{session_id}{path}")
                assert_error(response, 404, "session_not_found")
            assert_error(await send(bob, session_id, 0, "x"), 404)
            assert_error(await alice.get(f"{SESSIONS}/sess_nope"), 404)
            assert (await alice.get(f"{SESSIONS}/{session_id}")).status_code == 200


async def test_with_server_keys_sessions_need_a_valid_key(model_dir):
    async with running_server(model_dir, ServerConfig(api_key="secret")) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        assert_error(await client.post(SESSIONS, json={"messages": []}), 401, "invalid_api_key")
        client.headers["Authorization"] = "Bearer secret"
        await create(client)


async def test_conflicting_repeats_far_early_chunks_and_finishing_with_gaps_are_409(model_dir):
    async with running_server(model_dir, limits(max_pending_chunks=2)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        assert (await send(client, session_id, 0, "a")).status_code == 202
        assert_error(await send(client, session_id, 0, "b"), 409, "sequence_id_conflict")
        assert (await send(client, session_id, 0, "a")).json()["next_sequence_id"] == 1  # repeat: acknowledged
        assert (await send(client, session_id, 3, "d")).status_code == 202  # 2 ahead: at max_pending_chunks
        assert_error(await send(client, session_id, 4, "e"), 409, "too_far_ahead")
        error = assert_error(await client.post(f"{SESSIONS}/{session_id}/finish"), 409, "missing_chunks")
        assert "[1, 2]" in error["message"]
        error = assert_error(await client.post(f"{SESSIONS}/{session_id}/finish", json={"last_sequence_id": 4}),
                             409, "missing_chunks")
        assert "[1, 2, 4]" in error["message"]
        for i in (1, 2):
            await send(client, session_id, i, "x")
        assert (await client.post(f"{SESSIONS}/{session_id}/finish")).status_code == 202
        assert_error(await send(client, session_id, 4, "late"), 409, "input_finished")
        await client.get(f"{SESSIONS}/{session_id}/events")
        await assert_nothing_left(server)


async def test_audio_and_bad_token_ids_are_400(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        response = await send(client, session_id, 0, "AAAA", modality="audio")
        assert_error(response, 400, "unsupported_modality")
        assert_error(await send(client, session_id, 0, [1, 10**6], modality="tokens"), 400)
        assert_error(await client.post(SESSIONS, json={"messages": [], "n": 2}), 400)
        assert_error(await client.post(SESSIONS, json={"messages": [], "streaming_input": {"api": "x"}}), 400)
        assert_error(await client.post(SESSIONS, json={"streaming_input": {"start_policy": "later"}}), 400)
        await assert_nothing_left(server)


async def test_chunk_and_session_payload_limits_take_the_limit_and_refuse_past_it(model_dir):
    config = limits(max_chunk_bytes=8, max_payload_bytes_per_session=12)
    async with running_server(model_dir, config) as server, httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        assert_error(await send(client, session_id, 0, "123456789"), 413, "chunk_too_large")
        assert (await send(client, session_id, 0, "12345678")).status_code == 202  # chunk at its limit
        assert (await send(client, session_id, 1, "abcd")).status_code == 202  # session at its limit: 12
        assert_error(await send(client, session_id, 2, "z"), 413, "session_payload_too_large")
        await wait_for(lambda: server.all_kv_free)
        assert_error(await send(client, session_id, 3, "z"), 410, "session_payload_too_large")
        events = parse_events((await client.get(f"{SESSIONS}/{session_id}/events")).text)
        assert events[-1].event == "error" and events[-1].json["error"]["code"] == "session_payload_too_large"
        await assert_nothing_left(server)


async def test_max_open_sessions_global_and_per_key_take_the_limit_and_429_past_it(model_dir):
    config = limits(max_open_sessions=3, max_open_sessions_per_key=2)
    async with running_server(model_dir, config) as server:
        async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer a"}) as a, \
                httpx.AsyncClient(base_url=server.url, headers={"Authorization": "Bearer b"}) as b:
            first = await create(a)
            await create(a)
            assert_error(await a.post(SESSIONS, json={"messages": []}), 429, "too_many_sessions")
            await create(b)
            assert_error(await b.post(SESSIONS, json={"messages": []}), 429, "too_many_sessions")
            await a.delete(f"{SESSIONS}/{first}")
            await create(b)
        assert manager(server).num_open == 3


async def test_an_idle_session_expires_its_stream_gets_an_error_and_later_calls_410(model_dir):
    async with running_server(model_dir, limits(session_timeout_s=0.5)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client, chunk={"sequence_id": 0, "payload": "some words to prefill now"})
        await wait_for(lambda: not server.all_kv_free)
        events = await client.get(f"{SESSIONS}/{session_id}/events")  # waits for the expiry
        frames = parse_events(events.text)
        assert frames[-1].event == "error" and frames[-1].json["error"]["code"] == "session_expired"
        for response in (await send(client, session_id, 1, "x"), await client.get(f"{SESSIONS}/{session_id}"),
                         await client.post(f"{SESSIONS}/{session_id}/finish")):
            assert_error(response, 410, "session_expired")
        assert (await client.delete(f"{SESSIONS}/{session_id}")).status_code == 204
        await assert_nothing_left(server)
        assert manager(server).num_expired == 1
        metrics = (await client.get("/metrics")).text
        assert "rill_streaming_sessions_expired_total 1.0" in metrics
        assert "rill_streaming_input_chunks_total 1.0" in metrics


async def test_a_body_past_the_server_limit_is_413_not_a_crash(model_dir):
    async with running_server(model_dir, ServerConfig(max_body_bytes=200)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        session_id = await create(client)
        assert_error(await send(client, session_id, 0, "x" * 300), 413)
        assert_error(await client.post(SESSIONS, json={"messages": [SYSTEM] * 20}), 413)
        assert (await send(client, session_id, 0, "fits")).status_code == 202


async def test_streaming_input_can_be_turned_off(model_dir):
    async with running_server(model_dir, limits(enabled=False)) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        assert_error(await client.post(SESSIONS, json={"messages": []}), 404, "streaming_input_disabled")
