"""POST /v1/embeddings: decoder models as embedders, on a real server driven by the openai SDK and
httpx. The model is a random-weight Qwen3 saved as Qwen3-Embedding ships (config.json names
Qwen3ForCausalLM; the weights are Qwen3Model's, no `model.` prefix, no lm_head; the tokenizer
appends <|endoftext|>); transformers' last hidden state on the same weights is the oracle."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
from tokenizers import processors

from helpers_server import assert_nothing_left, one_torch_thread, running_server  # noqa: F401
from helpers_tokenizers import byte_level_bpe, qwen_config, save_dir
from rill.openai.embeddings import MAX_INPUTS
from rill.transports.http import ServerConfig

HIDDEN = 64
MAX_LEN = 128
TEXTS = ["What is the capital of China?", "Explain gravity", "the quick brown fox"]


def save_qwen3_embedding(path: Path, pooling: str = "lasttoken", seed: int = 0, tied: bool = False) -> Path:
    """A random Qwen3 decoder saved as Qwen3-Embedding ships; pooling as 1_Pooling/config.json says."""
    from transformers import Qwen3Config, Qwen3Model

    backend = byte_level_bpe()
    eot = backend.token_to_id("<|endoftext|>")
    backend.post_processor = processors.Sequence([  # Qwen3-Embedding's tokenizer.json appends <|endoftext|>
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="$A <|endoftext|>", pair="$A <|endoftext|> $B:1 <|endoftext|>:1",
                                      special_tokens=[("<|endoftext|>", eot)]),
    ])
    save_dir(path, backend, qwen_config())
    cfg = Qwen3Config(vocab_size=backend.get_vocab_size(), hidden_size=HIDDEN, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=MAX_LEN, initializer_range=0.2, tie_word_embeddings=tied,
                      eos_token_id=eot, bos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    Qwen3Model(cfg).save_pretrained(path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "architectures": ["Qwen3ForCausalLM"]}))
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": HIDDEN, "pooling_mode_lasttoken": pooling == "lasttoken",
        "pooling_mode_mean_tokens": pooling == "mean"}))
    return path


@pytest.fixture(scope="module")
def embedder(tmp_path_factory) -> Path:
    return save_qwen3_embedding(tmp_path_factory.mktemp("qwen3-embedding"))


@pytest.fixture(scope="module")
def mean_embedder(tmp_path_factory) -> Path:
    return save_qwen3_embedding(tmp_path_factory.mktemp("mean-embedding"), pooling="mean", seed=1)


def hf_embeddings(model_dir: Path, texts: list[str], pooling: str = "last") -> np.ndarray:
    """transformers' Qwen3Model over each text (tokenized by transformers), pooled, normalized."""
    from transformers import AutoModel, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text)["input_ids"]
            assert ids[-1] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
            hidden = model(torch.tensor([ids])).last_hidden_state[0]
            vector = hidden[-1] if pooling == "last" else hidden.mean(dim=0)
            out.append(torch.nn.functional.normalize(vector, dim=-1).numpy())
    return np.stack(out)


def sdk(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


async def post(server, body: dict) -> httpx.Response:
    async with httpx.AsyncClient(timeout=60) as client:
        return await client.post(server.v1 + "/embeddings", json=body)


# -- the openai SDK ----------------------------------------------------------------------------------------------


async def test_sdk_embeddings_match_transformers_last_hidden_state(embedder):
    """A Qwen3-Embedding directory as shipped loads; last-token vectors equal transformers' (float and
    the SDK's default base64), batched inputs in order, usage counting the appended <|endoftext|>."""
    expected = hf_embeddings(embedder, TEXTS)
    async with running_server(embedder, ServerConfig(served_model_names=["emb"]), max_num_batched_tokens=8) as server:
        client = sdk(server)
        floats = await client.embeddings.create(model="emb", input=TEXTS, encoding_format="float")
        default = await client.embeddings.create(model="emb", input=TEXTS)  # the SDK asks for base64
        one = await client.embeddings.create(model="emb", input=TEXTS[0], encoding_format="float")
        await assert_nothing_left(server)
        tokenizer = server.engine.tokenizer
    got = np.array([d.embedding for d in floats.data])
    assert [d.index for d in floats.data] == [0, 1, 2] and floats.model == "emb" and floats.object == "list"
    np.testing.assert_allclose(got, expected, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.array([d.embedding for d in default.data]), got, atol=1e-6)
    np.testing.assert_allclose(one.data[0].embedding, got[0], atol=1e-6)
    num_tokens = [len(tokenizer.encode(t, add_special_tokens=False)) + 1 for t in TEXTS]  # + <|endoftext|>
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(num_tokens)
    assert one.usage.prompt_tokens == num_tokens[0]


async def test_mean_pooling_where_the_pooling_config_says(mean_embedder):
    expected = hf_embeddings(mean_embedder, TEXTS, pooling="mean")
    async with running_server(mean_embedder, max_num_batched_tokens=8) as server:  # chunked prefill
        result = await sdk(server).embeddings.create(model=str(mean_embedder), input=TEXTS, encoding_format="float")
        again = await sdk(server).embeddings.create(model=str(mean_embedder), input=TEXTS[:1], encoding_format="float")
        await assert_nothing_left(server)
    np.testing.assert_allclose(np.array([d.embedding for d in result.data]), expected, atol=2e-5)
    np.testing.assert_allclose(again.data[0].embedding, expected[0], atol=2e-5)  # no prefix-cache hit skews it


async def test_input_forms_dimensions_and_base64(embedder):
    """Token ids and lists of them embed as the same texts do; `dimensions` truncates then normalizes
    (Matryoshka); base64 is little-endian float32."""
    async with running_server(embedder, ServerConfig(max_sequences_per_request=3)) as server:
        ids = [server.engine.tokenizer.encode(t) for t in TEXTS]
        fan_out = await post(server, {"input": TEXTS + ["one more"]})  # one engine request per input
        texts = (await post(server, {"input": TEXTS})).json()
        one_ids = (await post(server, {"input": ids[0]})).json()
        many_ids = (await post(server, {"input": ids})).json()
        short = (await post(server, {"input": TEXTS, "dimensions": 16, "encoding_format": "base64"})).json()
    assert fan_out.status_code == 400 and fan_out.json()["error"]["code"] == "too_many_sequences"
    full = np.array([d["embedding"] for d in texts["data"]])
    np.testing.assert_allclose(one_ids["data"][0]["embedding"], full[0], atol=1e-6)
    np.testing.assert_allclose(np.array([d["embedding"] for d in many_ids["data"]]), full, atol=1e-6)
    assert many_ids["usage"]["prompt_tokens"] == texts["usage"]["prompt_tokens"] == sum(map(len, ids))
    decoded = np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in short["data"]])
    truncated = full[:, :16] / np.linalg.norm(full[:, :16], axis=1, keepdims=True)
    np.testing.assert_allclose(decoded, truncated, atol=1e-5)


async def test_limits_and_bad_input_are_400s_naming_the_field(embedder):
    async with running_server(embedder, ServerConfig(max_sequences_per_request=MAX_INPUTS)) as server:
        at_limit = [1] * MAX_LEN  # a pooling input may fill the whole context
        ok = await post(server, {"input": at_limit})
        past = await post(server, {"input": [1] * (MAX_LEN + 1)})
        long_text = await post(server, {"input": ["short", "word " * MAX_LEN]})
        huge_text = await post(server, {"input": "x" * 2_000_000})  # refused before it is tokenized
        inputs_ok = await post(server, {"input": [[5]] * MAX_INPUTS})
        too_many = await post(server, {"input": [[5]] * (MAX_INPUTS + 1)})
        dims_past = await post(server, {"input": "x", "dimensions": HIDDEN + 1})
        dims_zero = await post(server, {"input": "x", "dimensions": 0})
        dims_ok = await post(server, {"input": "x", "dimensions": HIDDEN})
        bad_format = await post(server, {"input": "x", "encoding_format": "int8"})
        mixed = await post(server, {"input": ["x", 5]})
        empty = await post(server, {"input": []})
        outside = await post(server, {"input": [server.serving.vocab_size]})
        wrong_model = await post(server, {"input": "x", "model": "nope"})
        await assert_nothing_left(server)
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == MAX_LEN
    assert past.status_code == 400 and past.json()["error"]["code"] == "context_length_exceeded"
    assert f"{MAX_LEN} tokens" in past.json()["error"]["message"] and past.json()["error"]["param"] == "input"
    assert long_text.status_code == 400 and long_text.json()["error"]["param"] == "input[1]"
    assert huge_text.status_code == 400 and huge_text.json()["error"]["code"] == "context_length_exceeded"
    assert inputs_ok.status_code == 200 and len(inputs_ok.json()["data"]) == MAX_INPUTS
    assert too_many.status_code == 400 and str(MAX_INPUTS) in too_many.json()["error"]["message"]
    for response in (dims_past, dims_zero, bad_format, mixed, empty, outside):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] in ("dimensions", "encoding_format", "input", "input[0]")
    assert dims_ok.status_code == 200 and len(dims_ok.json()["data"][0]["embedding"]) == HIDDEN
    assert wrong_model.status_code == 404


async def test_dimensions_refused_for_a_model_not_trained_for_it(tmp_path):
    """rill-tiny (a causal LM with no Matryoshka config) embeds, but cannot truncate."""
    from rill.assets import RILL_TINY_DIR

    async with running_server(RILL_TINY_DIR) as server:
        plain = await post(server, {"input": "hello"})
        short = await post(server, {"input": "hello", "dimensions": 8})
    assert plain.status_code == 200 and len(plain.json()["data"][0]["embedding"]) == 192
    assert short.status_code == 400 and short.json()["error"]["param"] == "dimensions"


# -- the model directory, read alone -------------------------------------------------------------------------------


def test_a_tied_qwen3_embedding_loads_bare_and_allows_dimensions(tmp_path):
    """Qwen3-Embedding-0.6B ties its embeddings: loaded bare all the same, and known as an embedder."""
    from rill.models.loader import load
    from rill.openai.embedding_model import read_embedding_model

    path = save_qwen3_embedding(tmp_path / "tied", tied=True)
    model_dir, cfg, _, model = load(path)
    assert model.embedding_only and model.lm_head.weight is model.embed_tokens.weight
    info = read_embedding_model(model_dir, cfg, model.embedding_only)
    assert info.pooling == "last" and info.matryoshka and info.hidden_size == HIDDEN


def test_pooling_and_matryoshka_read_from_the_directory(tmp_path):
    from types import SimpleNamespace

    from rill.openai.embedding_model import read_embedding_model

    cfg = SimpleNamespace(architecture="LlamaForCausalLM", hidden_size=64)
    plain = read_embedding_model(tmp_path, cfg, False)
    assert plain.pooling == "last" and not plain.matryoshka
    (tmp_path / "config.json").write_text(json.dumps({"matryoshka_dimensions": [64, 16, 32]}))
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Pooling",
                                                        "path": "pool"}]))
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    listed = read_embedding_model(tmp_path, cfg, False)
    assert listed.pooling == "mean" and listed.matryoshka and listed.matryoshka_dimensions == (16, 32, 64)
    (tmp_path / "pool" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    assert read_embedding_model(tmp_path, cfg, False).pooling == "last"  # unsupported: the last token
