"""Request bodies -> SamplingParams, and decode errors -> the field they name (no server)."""

import msgspec
import pytest

from rill.openai.errors import ApiError, from_decode_error
from rill.openai.params import COMPLETION_MAX_TOKENS, chat_sampling_params, completion_sampling_params
from rill.openai.requests import ChatCompletionRequest, CompletionRequest
from rill.openai.sse import DONE, data_frame, error_frame

HI = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return msgspec.json.decode(msgspec.json.encode({"messages": HI, **fields}), type=ChatCompletionRequest)


def completion(**fields) -> CompletionRequest:
    return msgspec.json.decode(msgspec.json.encode({"prompt": "x", **fields}), type=CompletionRequest)


def test_fields_left_out_take_generation_config_then_defaults():
    params = chat_sampling_params(chat(), {"temperature": 0.6, "top_p": 0.9, "max_new_tokens": 50})
    assert (params.temperature, params.top_p, params.max_tokens) == (0.6, 0.9, 50)
    assert chat_sampling_params(chat(), {}).max_tokens is None  # chat: the room left in the context
    assert completion_sampling_params(completion(), {}).max_tokens == COMPLETION_MAX_TOKENS


def test_request_fields_win_over_generation_config():
    req = chat(temperature=0, top_p=0.5, max_tokens=7, seed=3, stop="x", top_k=-1, ignore_eos=True, min_tokens=2)
    params = chat_sampling_params(req, {"temperature": 0.6, "top_k": 20, "max_new_tokens": 50})
    assert (params.temperature, params.top_p, params.max_tokens, params.seed) == (0, 0.5, 7, 3)
    assert params.stop == ["x"] and params.top_k is None and params.ignore_eos and params.min_tokens == 2


def test_max_completion_tokens_wins_over_max_tokens():
    assert chat_sampling_params(chat(max_tokens=5, max_completion_tokens=9), {}).max_tokens == 9


def test_logprobs_map_to_the_number_of_top_tokens():
    assert chat_sampling_params(chat(logprobs=True, top_logprobs=4), {}).logprobs == 4
    assert chat_sampling_params(chat(logprobs=True), {}).logprobs == 0
    assert chat_sampling_params(chat(), {}).logprobs is None
    assert completion_sampling_params(completion(logprobs=2), {}).logprobs == 2


def test_logit_bias_keys_become_token_ids():
    assert chat_sampling_params(chat(logit_bias={"17": -5}), {}).logit_bias == {17: -5}


@pytest.mark.parametrize("body, param", [
    (b'{"messages": [], "temperature": "x"}', "temperature"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}', "messages[0].content[0].text"),
    (b'{"messages": [{"content": "hi"}]}', "messages[0].role"),
    (b'{"temperature": 1}', "messages"),
    (b'{"messages": [], "stream_options": {"include_usage": 1}}', "stream_options.include_usage"),
    (b'[]', None),
])
def test_decode_errors_name_the_field(body, param):
    with pytest.raises(msgspec.ValidationError) as info:
        msgspec.json.decode(body, type=ChatCompletionRequest)
    error = from_decode_error(info.value)
    assert (error.status, error.param) == (400, param)


def test_malformed_json_is_its_own_code():
    with pytest.raises(msgspec.DecodeError) as info:
        msgspec.json.decode(b'{"messages": [', type=ChatCompletionRequest)
    assert from_decode_error(info.value).code == "invalid_json"


def test_sse_frames_are_exact_bytes():
    assert data_frame({"a": 1}) == b'data: {"a":1}\n\n'
    assert DONE == b"data: [DONE]\n\n"
    frame = error_frame(ApiError(500, "boom", code="engine_error"))
    assert frame == (b'event: error\ndata: {"error":{"message":"boom","type":"server_error","param":null,'
                     b'"code":"engine_error"}}\n\n')


def test_explicit_nulls_the_spec_allows_take_the_defaults():
    # The openai SDK sends null for an argument passed as None (issue 29).
    req = chat(n=None, stream=None, logprobs=None)
    params = chat_sampling_params(req, {})
    assert (params.n, params.logprobs, bool(req.stream)) == (1, None, False)
    req = completion(n=None, stream=None, echo=None)
    params = completion_sampling_params(req, {})
    assert (params.n, params.prompt_logprobs, bool(req.stream), bool(req.echo)) == (1, None, False, False)


def test_echo_with_logprobs_asks_the_engine_for_prompt_logprobs():
    assert completion_sampling_params(completion(echo=True, logprobs=3), {}).prompt_logprobs == 3
    assert completion_sampling_params(completion(logprobs=3), {}).prompt_logprobs is None
    # max_tokens 0 with echo: the engine samples one token, which the answer leaves out.
    assert completion_sampling_params(completion(echo=True, logprobs=0, max_tokens=0), {}).max_tokens == 1
