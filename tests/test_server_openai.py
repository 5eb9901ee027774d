"""The OpenAI-compatible server, end to end: a real hypercorn server on 127.0.0.1 (ephemeral
port) in front of the real engine on a random-weight Qwen2 model, driven by the official
`openai` SDK (sync in a thread, and async) and by raw httpx with a strict SSE reader."""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
import trio

from helpers_models import make_model_dir
from helpers_server import one_torch_thread, parse_sse, running_server  # noqa: F401
from rill.transports.http import ServerConfig

HI = [{"role": "user", "content": "What is 17 + 25?"}]
GREEDY = {"temperature": 0, "max_tokens": 8, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("qwen2"), "qwen2")


def chat_body(model_dir, **kw):
    return {"model": str(model_dir), "messages": HI, **GREEDY, **kw}


async def post_sse(client: httpx.AsyncClient, path: str, body: dict):
    async with client.stream("POST", path, json=body) as response:
        raw = (await response.aread()).decode()
    assert response.status_code == 200, raw
    assert response.headers["content-type"].startswith("text/event-stream")
    return parse_sse(raw)


# -- the SDK ------------------------------------------------------------------------------------------------


async def test_sync_sdk_chat_completion_in_a_thread(model_dir):
    async with running_server(model_dir) as server:
        def call():
            client = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0)
            return client.chat.completions.create(model=str(model_dir), messages=HI, temperature=0, max_tokens=8,
                                                  extra_body={"ignore_eos": True})
        out = await trio.to_thread.run_sync(call)
    assert out.object == "chat.completion" and out.model == str(model_dir)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert out.usage.completion_tokens == 8 and out.usage.prompt_tokens > 5
    assert out.usage.total_tokens == out.usage.prompt_tokens + 8


async def test_async_sdk_stream_joins_to_the_non_streamed_answer(model_dir):
    async with running_server(model_dir) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        whole = await client.chat.completions.create(model=str(model_dir), messages=HI, temperature=0, max_tokens=12,
                                                     extra_body={"ignore_eos": True})
        stream = await client.chat.completions.create(model=str(model_dir), messages=HI, temperature=0,
                                                      max_tokens=12, stream=True, extra_body={"ignore_eos": True},
                                                      stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
        await client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].choices == []


async def test_sdk_completions_with_text_and_token_prompts(model_dir):
    async with running_server(model_dir) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        one = await client.completions.create(model=str(model_dir), prompt="Hello world", temperature=0,
                                              max_tokens=6, extra_body={"ignore_eos": True})
        ids = server.engine.tokenizer.encode("Hello world")
        many = await client.completions.create(model=str(model_dir), prompt=[ids, ids[:3]], temperature=0, n=2,
                                               max_tokens=6, extra_body={"ignore_eos": True})
        await client.close()
    assert one.object == "text_completion" and one.choices[0].finish_reason == "length"
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == one.choices[0].text  # greedy: same prompt, same text
    assert many.usage.completion_tokens == 24 and many.usage.prompt_tokens == len(ids) + 3


# -- the SSE contract -----------------------------------------------------------------------------------------


async def test_chat_stream_frames_in_exact_order(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        body = chat_body(model_dir, stream=True, stream_options={"include_usage": True})
        frames = await post_sse(client, "/v1/chat/completions", body)
    assert all(f.event is None for f in frames)
    assert frames[-1].data == "[DONE]"
    chunks = [f.json for f in frames[:-1]]
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    first, *content, terminal, usage = chunks
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}]
    assert content and all(set(c["choices"][0]["delta"]) == {"content"} for c in content)
    assert all(c["choices"][0]["finish_reason"] is None for c in content)
    assert terminal["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert "usage" not in first and "usage" not in terminal


async def test_chat_stream_without_usage_ends_terminal_then_done(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        frames = await post_sse(client, "/v1/chat/completions", chat_body(model_dir, stream=True, n=2))
    assert frames[-1].data == "[DONE]"
    chunks = [f.json for f in frames[:-1]]
    roles = [c for c in chunks if c["choices"][0]["delta"].get("role")]
    assert [c["choices"][0]["index"] for c in roles] == [0, 1] and chunks[:2] == roles
    terminals = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(t["index"] for t in terminals) == [0, 1] and all(t["delta"] == {} for t in terminals)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_chat_stream_with_logprobs(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        body = chat_body(model_dir, stream=True, logprobs=True, top_logprobs=3)
        frames = await post_sse(client, "/v1/chat/completions", body)
        whole = (await client.post("/v1/chat/completions", json=chat_body(model_dir, logprobs=True,
                                                                            top_logprobs=3))).json()
    choices = [f.json["choices"][0] for f in frames[:-1]]
    assert all(c["delta"] or c["finish_reason"] for c in choices), "only the terminal frame has an empty delta"
    streamed = [lp for c in choices for lp in ((c["logprobs"] or {}).get("content") or [])]
    full = whole["choices"][0]["logprobs"]["content"]
    assert len(streamed) == len(full) == 8
    assert [e["token"] for e in streamed] == [e["token"] for e in full]
    for entry in full:
        assert len(entry["top_logprobs"]) == 3 and entry["logprob"] <= 0
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][-1]["logprob"]
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"], abs=1e-4)  # greedy


async def test_completion_stream_text_deltas_and_logprob_columns(model_dir):
    body = {"model": str(model_dir), "prompt": "Hello world", "stream": True, "logprobs": 2, **GREEDY}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        frames = await post_sse(client, "/v1/completions", body)
        whole = (await client.post("/v1/completions", json={**body, "stream": False})).json()
    assert frames[-1].data == "[DONE]"
    choices = [f.json["choices"][0] for f in frames[:-1]]
    assert all(f.json["object"] == "text_completion" for f in frames[:-1])
    assert "".join(c["text"] for c in choices) == whole["choices"][0]["text"]
    assert choices[-1]["finish_reason"] == "length"
    lp = whole["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(lp["top_logprobs"]) == 8
    assert lp["text_offset"][0] == 0 and all(1 <= len(top) <= 3 for top in lp["top_logprobs"])
    # The chosen token is among the top logprobs, as OpenAI and vLLM send them (up to logprobs + 1).
    assert all(top[token] == value for token, value, top in zip(lp["tokens"], lp["token_logprobs"],
                                                                 lp["top_logprobs"]))
    streamed_tokens = [t for c in choices if c["logprobs"] for t in c["logprobs"]["tokens"]]
    assert streamed_tokens == lp["tokens"]


async def test_completion_echo_prepends_the_prompt(model_dir):
    body = {"model": str(model_dir), "prompt": "Hello world", "echo": True, **GREEDY}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        echoed = (await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
        plain = (await client.post("/v1/completions", json={**body, "echo": False})).json()["choices"][0]["text"]
    assert echoed == "Hello world" + plain


# -- tool calls and reasoning, through the server ----------------------------------------------------------
# A random model writes no tool calls, so the assistant's own final message supplies one: with
# continue_final_message the model continues it, and echo puts it in front of the output, where
# the parsers read it as if the model had written it.

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def continued(model_dir, assistant_text: str, **kw) -> dict:
    messages = [*HI, {"role": "assistant", "content": assistant_text}]
    return {"model": str(model_dir), "messages": messages, "echo": True, "continue_final_message": True,
            "add_generation_prompt": False, **GREEDY, **kw}


async def test_tool_call_in_the_output_is_parsed_streamed_and_whole(model_dir):
    body = continued(model_dir, "Checking. " + CALL, tools=[WEATHER])
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        frames = await post_sse(client, "/v1/chat/completions", {**body, "stream": True})
        plain = (await client.post("/v1/chat/completions", json={**body, "tools": None})).json()
    message = whole["choices"][0]["message"]
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert message["content"].startswith("Checking.") and "<tool_call>" not in message["content"]
    deltas = [f.json["choices"][0]["delta"] for f in frames[:-1]]
    streamed_calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert streamed_calls[0]["function"]["name"] == "get_weather"
    assert "".join(c["function"].get("arguments", "") for c in streamed_calls) == '{"city": "Tokyo"}'
    assert "".join(d.get("content", "") for d in deltas).strip() == message["content"]
    assert CALL in plain["choices"][0]["message"]["content"]  # no tools: no parsing


async def test_reasoning_parser_splits_reasoning_content(model_dir):
    body = continued(model_dir, "<think>17 + 25 is 42.</think>")
    async with running_server(model_dir, ServerConfig(reasoning_parser="qwen3")) as server, \
            httpx.AsyncClient(base_url=server.url) as client:
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        frames = await post_sse(client, "/v1/chat/completions", {**body, "stream": True})
    message = whole["choices"][0]["message"]
    assert message["reasoning_content"] == "17 + 25 is 42." and "think>" not in message["content"]
    deltas = [f.json["choices"][0]["delta"] for f in frames[:-1]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "17 + 25 is 42."
    assert "".join(d.get("content", "") for d in deltas) == message["content"]


async def test_continuous_usage_stats_on_every_chunk(model_dir):
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        frames = await post_sse(client, "/v1/chat/completions", chat_body(model_dir, stream=True,
                                                                         stream_options=options))
    chunks = [f.json for f in frames[1:-1]]
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 8


# -- issue 29: nulls the spec allows, message.refusal, model retrieval, echo with logprobs -------------------


async def test_sdk_none_arguments_arrive_as_null_and_take_the_defaults(model_dir):
    async with running_server(model_dir) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        chat = await client.chat.completions.create(model=str(model_dir), messages=HI, n=None, stream=None,
                                                    logprobs=None, temperature=0, max_tokens=4)
        text = await client.completions.create(model=str(model_dir), prompt="Hi", n=None, stream=None, echo=None,
                                               temperature=0, max_tokens=4)
        await client.close()
    assert len(chat.choices) == 1 and chat.choices[0].logprobs is None
    assert len(text.choices) == 1 and not text.choices[0].text.startswith("Hi")


async def test_chat_message_and_logprobs_carry_refusal_null(model_dir):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        body = (await client.post("/v1/chat/completions", json=chat_body(model_dir, logprobs=True))).json()
    choice = body["choices"][0]
    assert "refusal" in choice["message"] and choice["message"]["refusal"] is None
    assert choice["logprobs"]["refusal"] is None and len(choice["logprobs"]["content"]) == 8


async def test_sdk_models_retrieve_returns_the_listed_card_and_404_model_not_found(model_dir):
    names = ["rill-test", "org/rill-test"]
    async with running_server(model_dir, ServerConfig(served_model_names=names)) as server:
        client = openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0)
        listed = (await client.models.list()).data
        retrieved = [await client.models.retrieve(name) for name in names]
        with pytest.raises(openai.NotFoundError) as info:
            await client.models.retrieve("no-such-model")
        await client.close()
    assert retrieved == listed and [m.id for m in retrieved] == names
    assert info.value.body == {"message": info.value.body["message"], "type": "invalid_request_error",
                               "param": "model", "code": "model_not_found"}


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_logprobs(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: row t is log p(. | ids[:t]); row 0 unused."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.cat([torch.zeros_like(logits[:1]), logits[:-1].log_softmax(-1)])


async def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(model_dir, hf_model):
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        ids = server.engine.tokenizer.encode("The quick brown fox jumps over the lazy dog")
        body = {"model": str(model_dir), "prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 1,
                "temperature": 0, "n": 2}
        choice, second = (await client.post("/v1/completions", json=body)).json()["choices"]
    assert second["logprobs"] == choice["logprobs"]  # each of the n samples scores the prompt
    lp, expected = choice["logprobs"], hf_logprobs(hf_model, ids)
    assert len(lp["tokens"]) == len(ids) + 1  # the prompt's tokens, then the one generated
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:len(ids)] == pytest.approx([expected[t, ids[t]].item() for t in range(1, len(ids))],
                                                            abs=1e-4)
    assert all(1 <= len(top) <= 3 for top in lp["top_logprobs"][1:])
    assert choice["text"] == "".join(lp["tokens"]) and lp["text_offset"][:3] == [0, len(lp["tokens"][0]),
                                                                                 len(lp["tokens"][0] + lp["tokens"][1])]


async def test_echo_with_max_tokens_0_returns_the_scored_prompt_alone(model_dir):
    body = {"model": str(model_dir), "prompt": "Hello world", "echo": True, "logprobs": 0, "max_tokens": 0}
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        answer = (await client.post("/v1/completions", json=body)).json()
        frames = await post_sse(client, "/v1/completions", {**body, "stream": True})
        refused = await client.post("/v1/completions", json={**body, "echo": False})
        ids = server.engine.tokenizer.encode("Hello world")
    choice = answer["choices"][0]
    assert choice["text"] == "Hello world" and choice["finish_reason"] == "length"
    assert len(choice["logprobs"]["tokens"]) == len(ids) and answer["usage"]["completion_tokens"] == 0
    streamed = [f.json["choices"][0] for f in frames[:-1]]
    assert "".join(c["text"] for c in streamed) == "Hello world"
    assert [t for c in streamed if c["logprobs"] for t in c["logprobs"]["token_logprobs"]] == \
        choice["logprobs"]["token_logprobs"]
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


async def test_echo_with_logprobs_after_a_cached_prefix_still_scores_it(model_dir):
    prompt = "A prompt long enough to fill a few KV blocks of the cache, " * 4
    body = {"model": str(model_dir), "prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1,
            "temperature": 0}
    async with running_server(model_dir, block_size=16) as server, httpx.AsyncClient(base_url=server.url) as client:
        first = (await client.post("/v1/completions", json=body)).json()
        second = (await client.post("/v1/completions", json=body)).json()
    assert first["choices"][0]["logprobs"] == second["choices"][0]["logprobs"]


async def test_lm_eval_loglikelihood_request_is_answered_as_it_parses_it(model_dir, hf_model):
    # lm-evaluation-harness's local-completions model (models/openai_completions.py) sends this body
    # for a loglikelihood request and reads token_logprobs[ctxlen:-1]: every column but the one for
    # the token generated after the prompt.
    async with running_server(model_dir) as server, httpx.AsyncClient(base_url=server.url) as client:
        context = server.engine.tokenizer.encode("Question: what is 2 + 2? Answer:")
        continuation = server.engine.tokenizer.encode(" four")
        ids = context + continuation
        body = {"model": str(model_dir), "prompt": [ids], "temperature": 0, "max_tokens": 1, "logprobs": 1,
                "seed": 1234, "echo": True}
        choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
    scored = choice["logprobs"]["token_logprobs"][len(context):-1]
    tops = choice["logprobs"]["top_logprobs"][len(context):-1]
    expected = hf_logprobs(hf_model, ids)
    assert sum(scored) == pytest.approx(sum(expected[t, ids[t]].item() for t in range(len(context), len(ids))),
                                        abs=1e-3)
    # is_greedy compares each logprob with max(top.values()): the top logprobs must hold a value.
    assert all(1 <= len(top) <= 2 for top in tops)
