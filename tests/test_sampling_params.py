"""SamplingParams: vLLM defaults, every range checked at its limit and just past it."""

from __future__ import annotations

import math

import msgspec
import pytest

from rill.errors import ValidationError
from rill.sampling_params import SamplingParams


def test_defaults_match_vllm():
    params = SamplingParams()
    assert params.n == 1
    assert params.temperature == 1.0
    assert params.top_p == 1.0
    assert params.top_k is None
    assert params.min_p == 0.0
    assert params.presence_penalty == 0.0
    assert params.frequency_penalty == 0.0
    assert params.repetition_penalty == 1.0
    assert params.logit_bias is None
    assert params.seed is None
    assert params.stop == []
    assert params.stop_token_ids == []
    assert params.ignore_eos is False
    assert params.min_tokens == 0
    assert params.max_tokens == 16
    assert params.logprobs is None
    assert params.skip_special_tokens is True
    assert params.include_stop_str_in_output is False


def test_default_lists_are_not_shared_between_instances():
    first, second = SamplingParams(), SamplingParams()
    first.stop_token_ids.append(7)
    assert second.stop_token_ids == []


def test_fields_are_keyword_only():
    with pytest.raises(TypeError):
        SamplingParams(1)


# (field, values at or inside the limits, values just past them)
RANGES = [
    ("n", [1, 8], [0, -1, 1.5, True]),
    ("temperature", [0, 0.0, 1e-6, 2.0, 100.0], [-1e-9, -1.0, math.inf, math.nan, "1", True]),
    ("top_p", [1e-9, 0.5, 1.0, 1], [0.0, 0, -0.1, 1.0001, math.nan]),
    ("top_k", [None, 0, 1, 50], [-1, 1.5, "5"]),
    ("min_p", [0.0, 0.5, 1.0], [-0.0001, 1.0001, math.nan]),
    ("presence_penalty", [-2.0, 0.0, 2.0], [-2.0001, 2.0001, math.inf]),
    ("frequency_penalty", [-2.0, 0.0, 2.0], [-2.0001, 2.0001, math.nan]),
    ("repetition_penalty", [1e-9, 1.0, 2.0], [0.0, -1.0, math.inf]),
    ("seed", [None, 0, -5, 2**70], [1.5, "3", True]),
    ("min_tokens", [0, 16], [-1, 1.5]),
    ("max_tokens", [None, 1, 100_000], [0, -1, 2.5]),
    ("logprobs", [None, 0, 5, 20], [-1, 21, 2.0]),
]


@pytest.mark.parametrize("field,ok_values,bad_values", RANGES, ids=[r[0] for r in RANGES])
def test_each_numeric_field_accepts_its_limits_and_rejects_just_past_them(field, ok_values, bad_values):
    for value in ok_values:
        SamplingParams(**{field: value})
    for value in bad_values:
        with pytest.raises(ValidationError) as info:
            SamplingParams(**{field: value})
        assert info.value.param == field, value


def test_validation_error_is_a_value_error_with_invalid_value_code():
    with pytest.raises(ValueError) as info:
        SamplingParams(temperature=-1)
    assert info.value.code == "invalid_value"
    assert "temperature" in info.value.message


def test_top_k_zero_is_stored_as_off():
    assert SamplingParams(top_k=0).top_k is None
    assert SamplingParams(top_k=3).top_k == 3


def test_min_tokens_above_max_tokens_is_rejected():
    SamplingParams(min_tokens=16, max_tokens=16)
    with pytest.raises(ValidationError) as info:
        SamplingParams(min_tokens=17, max_tokens=16)
    assert info.value.param == "min_tokens"


def test_min_tokens_has_no_ceiling_when_max_tokens_is_none():
    assert SamplingParams(min_tokens=10_000, max_tokens=None).min_tokens == 10_000


def test_single_stop_string_becomes_a_list():
    assert SamplingParams(stop="\n").stop == ["\n"]
    assert SamplingParams(stop=["a", "b"]).stop == ["a", "b"]
    assert SamplingParams(stop=("a",)).stop == ["a"]


@pytest.mark.parametrize("stop", ["", ["ok", ""], [3], None])
def test_empty_or_non_string_stop_is_rejected(stop):
    with pytest.raises(ValidationError) as info:
        SamplingParams(stop=stop)
    assert info.value.param == "stop"


@pytest.mark.parametrize("stop_token_ids", [[-1], [1.0], None, [True]])
def test_bad_stop_token_ids_are_rejected(stop_token_ids):
    with pytest.raises(ValidationError) as info:
        SamplingParams(stop_token_ids=stop_token_ids)
    assert info.value.param == "stop_token_ids"


def test_logit_bias_accepts_limits_and_string_token_ids():
    params = SamplingParams(logit_bias={"50256": -100, 7: 100.0, 0: 0.5})
    assert params.logit_bias == {50256: -100, 7: 100.0, 0: 0.5}


def test_empty_logit_bias_is_stored_as_none():
    assert SamplingParams(logit_bias={}).logit_bias is None


@pytest.mark.parametrize(
    "logit_bias",
    [{1: 100.0001}, {1: -100.0001}, {1: math.nan}, {-1: 1.0}, {"x": 1.0}, {1.5: 1.0}, [1, 2]],
)
def test_bad_logit_bias_is_rejected(logit_bias):
    with pytest.raises(ValidationError) as info:
        SamplingParams(logit_bias=logit_bias)
    assert info.value.param == "logit_bias"


def test_check_vocab_rejects_token_ids_outside_the_vocabulary():
    SamplingParams(logit_bias={99: 1.0}, stop_token_ids=[99]).check_vocab(100)
    with pytest.raises(ValidationError) as info:
        SamplingParams(logit_bias={100: 1.0}).check_vocab(100)
    assert info.value.param == "logit_bias"
    with pytest.raises(ValidationError) as info:
        SamplingParams(stop_token_ids=[100]).check_vocab(100)
    assert info.value.param == "stop_token_ids"


@pytest.mark.parametrize("temperature,greedy", [(0, True), (0.0, True), (9e-6, True), (1e-5, False), (0.7, False)])
def test_greedy_means_temperature_below_1e_minus_5(temperature, greedy):
    assert SamplingParams(temperature=temperature).greedy is greedy


GENERATION_CONFIG = {
    "bos_token_id": 1,
    "eos_token_id": [2, 3],
    "do_sample": True,
    "temperature": 0.6,
    "top_p": 0.9,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "transformers_version": "4.45.0",
}


def test_generation_config_supplies_defaults():
    params = SamplingParams.from_generation_config(GENERATION_CONFIG)
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.9, 20)
    assert params.repetition_penalty == 1.05
    assert params.max_tokens == 16  # no max_new_tokens in the file: our default stands


def test_generation_config_max_new_tokens_becomes_max_tokens():
    params = SamplingParams.from_generation_config({"max_new_tokens": 256, "min_p": 0.1})
    assert params.max_tokens == 256
    assert params.min_p == 0.1


def test_explicit_values_override_generation_config():
    params = SamplingParams.from_generation_config(
        {**GENERATION_CONFIG, "max_new_tokens": 256}, temperature=0.0, max_tokens=None, seed=3
    )
    assert params.temperature == 0.0
    assert params.greedy
    assert params.max_tokens is None
    assert params.top_p == 0.9
    assert params.seed == 3


def test_generation_config_null_entries_are_skipped():
    params = SamplingParams.from_generation_config({"temperature": None, "top_k": None})
    assert params.temperature == 1.0
    assert params.top_k is None


def test_generation_config_with_unknown_override_raises_type_error():
    with pytest.raises(TypeError):
        SamplingParams.from_generation_config({}, temprature=0.5)


def test_overrides_are_validated():
    with pytest.raises(ValidationError) as info:
        SamplingParams.from_generation_config(GENERATION_CONFIG, top_p=0)
    assert info.value.param == "top_p"


def test_decoding_from_json_normalises_stop():
    params = msgspec.json.decode(b'{"stop": "END", "logit_bias": {"5": 2.0}, "top_k": 0}', type=SamplingParams)
    assert params.stop == ["END"]
    assert params.logit_bias == {5: 2.0}
    assert params.top_k is None


def test_decoding_from_json_still_validates():
    # msgspec wraps errors raised in __post_init__ during decoding in its own ValidationError.
    with pytest.raises(msgspec.ValidationError, match="top_p"):
        msgspec.json.decode(b'{"top_p": 0}', type=SamplingParams)
