"""Random-weight models of each supported architecture, made with transformers and saved as
Hugging Face directories (no hub), plus a ChatML template. transformers is the oracle."""

from __future__ import annotations

from pathlib import Path

import torch

from helpers_tokenizers import QWEN_SPECIALS, byte_level_bpe, qwen_config, save_dir
from rill.models.attention import AttentionMetadata
from rill.models.loader import load

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)


def _config(arch: str, vocab_size: int, **overrides):
    from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    kinds = {
        "llama": (LlamaConfig, {}),
        "llama3-rope": (LlamaConfig, {"rope_parameters": {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}}),
        "llama-linear-rope": (LlamaConfig, {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0,
                                                                "factor": 2.0}}),
        "mistral": (MistralConfig, {"sliding_window": 24}),
        "qwen2": (Qwen2Config, {"tie_word_embeddings": True}),
        "qwen3": (Qwen3Config, {"head_dim": 32}),
        **gemma_kinds(Gemma2Config, Gemma3TextConfig),
    }
    cls, extra = kinds[arch]
    # A wider init than transformers' default keeps the logits apart, so greedy argmax is not
    # decided by float rounding.
    return cls(vocab_size=vocab_size, eos_token_id=None, bos_token_id=None, pad_token_id=None,
               **{"initializer_range": 0.2, **SMALL, **extra, **overrides})


def gemma_kinds(gemma2, gemma3) -> dict:
    """Gemma 2 (every other layer slides) and Gemma 3 (two sliding layers to one global), with windows
    shorter than the parity prompts, a query scale and soft caps that differ from the defaults and bite
    at these sizes, and (Gemma 3) a local RoPE base and linear scaling of the global one."""
    return {
        "gemma2": (gemma2, {"head_dim": 16, "num_hidden_layers": 4, "sliding_window": 24, "query_pre_attn_scalar": 24,
                            "attn_logit_softcapping": 5.0, "final_logit_softcapping": 10.0}),
        "gemma3": (gemma3, {"head_dim": 32, "num_hidden_layers": 4, "sliding_window": 16, "sliding_window_pattern": 3,
                            "query_pre_attn_scalar": 16, "rope_local_base_freq": 100.0, "final_logit_softcapping": 20.0,
                            "rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
    }


def spread_norm_weights(model) -> None:
    """Gemma initializes its (1 + weight) norms to weight 0; random ones make the parity tests see the 1 +."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.2)


def never_ends(model) -> None:
    """Zero the output rows of the special tokens (the end of turn among them): their logit is exactly 0
    while the largest of the other few hundred random logits is above 0, so greedy decoding never stops on
    its own, whatever the float rounding of the machine. For tests that must interrupt an answer."""
    assert not model.config.tie_word_embeddings, "the rows zeroed must be the output's own, not the input's too"
    backend = byte_level_bpe()
    with torch.no_grad():
        for token in QWEN_SPECIALS:
            model.get_output_embeddings().weight[backend.token_to_id(token)].zero_()


def make_model_dir(path: Path, arch: str = "mistral", dtype: torch.dtype = torch.float32, seed: int = 0,
                   endless: bool = False, **overrides) -> Path:
    """Save a random model of `arch` with a ByteLevel BPE tokenizer and a ChatML template; `endless`:
    one whose greedy answers never end (never_ends)."""
    prepare = spread_norm_weights if arch.startswith("gemma") else None
    if endless:
        assert prepare is None, "an endless Gemma would need both preparations"
        prepare = never_ends
    return save_random_model(path, lambda vocab_size: _config(arch, vocab_size, **overrides), dtype, seed, prepare)


def save_random_model(path: Path, make_config, dtype: torch.dtype = torch.float32, seed: int = 0,
                      prepare=None) -> Path:
    """Save a random model (make_config(vocab_size) -> a transformers config) with a ByteLevel BPE
    tokenizer and a ChatML template; prepare(model), if given, adjusts the weights first."""
    from transformers import AutoModelForCausalLM

    backend = byte_level_bpe()
    save_dir(path, backend, qwen_config(chat_template=CHATML))
    cfg = make_config(backend.get_vocab_size())
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    if prepare is not None:
        prepare(model)
    model.save_pretrained(path)
    return path


# -- the two ways the parity tests read logits: rill's decoder in one engine-shaped step, transformers' forward


def rill_logits(model_dir: Path, ids: list[int], dtype: str | None = None) -> torch.Tensor:
    """rill's decoder over `ids` as one prefill step of one sequence (paged cache, block size 16)."""
    return rill_forward(load(model_dir, dtype=dtype)[3], ids)


def rill_forward(model, ids: list[int]) -> torch.Tensor:
    """One prefill step on the model's own device (a CUDA model runs the Triton kernels)."""
    cfg, dev = model.config, model.embed_tokens.weight.device
    num_blocks = -(-len(ids) // 16)
    shape = (num_blocks, 16, cfg.num_kv_heads, cfg.head_dim)
    kv = [(torch.zeros(shape, dtype=cfg.dtype, device=dev), torch.zeros(shape, dtype=cfg.dtype, device=dev))
          for _ in range(cfg.num_layers)]
    n = len(ids)
    meta = AttentionMetadata(
        slot_mapping=torch.arange(n, device=dev), block_tables=torch.arange(num_blocks, dtype=torch.int32, device=dev)[None],
        seq_lens=torch.tensor([n], dtype=torch.int32, device=dev),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev), max_query_len=n,
    )
    with torch.inference_mode():
        return model.compute_logits(model(torch.tensor(ids, device=dev), torch.arange(n, device=dev), kv, meta))


def hf_logits(model_dir: Path, ids: list[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return hf_forward(hf_model(model_dir, dtype), ids)


def hf_model(model_dir: Path, dtype: torch.dtype = torch.float32, **kw):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, **kw).eval()


def hf_forward(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids], device=model.device)).logits[0].float()


def hf_greedy(path: Path, prompt_ids: list[int], max_new_tokens: int, dtype=torch.float32) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    ids = torch.tensor([prompt_ids])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         min_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


def engine_greedy(core, ids, items, max_tokens: int) -> list[int]:
    """Greedy tokens of one request (multimodal `items` or None) run alone on an EngineCore, EOS ignored."""
    from rill.sampling_params import SamplingParams

    core.add_request("r", ids, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True), items)
    out = []
    while core.has_work:
        for delta in core.step():
            out += delta.token_ids
    return out
