"""Mixtral and Qwen3-MoE: batched expert routing against a per-token reference, and rill's decoder
against transformers on random-weight models (tolerances as in test_model_parity: float32 logits
within 1e-4, bfloat16 within 0.25, float16 within 0.05, greedy tokens identical)."""

import contextlib
import json

import pytest
import torch

from helpers_families import make_family_dir
from helpers_models import hf_forward, hf_greedy, hf_logits, hf_model, rill_forward, rill_logits
from rill import LLM, SamplingParams
from rill.errors import ModelLoadError
from rill.models.config import load_model_config
from rill.models.loader import load
from rill.models.moe import grouped_experts, route

KINDS = ["mixtral", "qwen3-moe", "qwen3-moe-window"]
PROMPTS = [
    "Hello world!",
    "The quick brown fox jumps over the lazy dog. " * 3,  # longer than the 24-token windows
    "def add(a, b):\n    return a + b\n" * 4,
]


def per_token_reference(x, experts, weights, gate_up, down):
    """Each token alone through each of its experts: the loop the batched form replaces."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for e, w in zip(experts[t].tolist(), weights[t]):
            gate, up = (gate_up[e] @ x[t]).chunk(2)
            out[t] += w * (down[e] @ (torch.nn.functional.silu(gate) * up))
    return out


@pytest.mark.parametrize(("num_tokens", "num_experts", "top_k"), [(1, 4, 2), (13, 8, 2), (29, 6, 3), (7, 16, 4)])
def test_grouped_experts_equal_each_token_run_alone(num_tokens, num_experts, top_k):
    g = torch.Generator().manual_seed(num_tokens)
    x = torch.randn(num_tokens, 16, generator=g, dtype=torch.float64)
    gate_up = torch.randn(num_experts, 2 * 8, 16, generator=g, dtype=torch.float64)
    down = torch.randn(num_experts, 16, 8, generator=g, dtype=torch.float64)
    weights, experts = route(torch.randn(num_tokens, num_experts, generator=g), top_k, normalize=True)
    weights = weights.double()
    batched = grouped_experts(x, experts, weights, gate_up, down)
    torch.testing.assert_close(batched, per_token_reference(x, experts, weights, gate_up, down))


def test_tokens_that_all_pick_the_same_experts_leave_the_others_idle():
    x = torch.randn(5, 16, dtype=torch.float64)
    gate_up, down = torch.randn(4, 16, 16, dtype=torch.float64), torch.randn(4, 16, 8, dtype=torch.float64)
    experts = torch.tensor([[2, 0]] * 5)
    weights = torch.full((5, 2), 0.5, dtype=torch.float64)
    gate_up[[1, 3]] = float("nan")  # an expert no token picked is never read
    torch.testing.assert_close(grouped_experts(x, experts, weights, gate_up, down),
                               per_token_reference(x, experts, weights, gate_up, down))


def test_route_renormalizes_the_top_k_only_when_asked():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    raw, ids = route(logits, 2, normalize=False)
    normed, _ = route(logits, 2, normalize=True)
    assert ids.tolist() == [[0, 1]]
    assert raw.sum().item() < 1.0
    assert normed.sum().item() == pytest.approx(1.0)


@pytest.fixture(scope="module", params=KINDS)
def model_dir(request, tmp_path_factory):
    return make_family_dir(tmp_path_factory.mktemp(request.param), request.param)


def test_logits_match_transformers_float32(model_dir):
    for ids in (list(range(3, 100)), list(range(200, 217))):
        assert (rill_logits(model_dir, ids) - hf_logits(model_dir, ids)).abs().max().item() < 1e-4


def test_greedy_generation_matches_transformers_token_for_token(model_dir):
    llm = LLM(str(model_dir), num_kv_blocks=64)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for out in outs:
        assert out.outputs[0].token_ids == hf_greedy(model_dir, out.prompt_token_ids, 16)


@contextlib.contextmanager
def router_logits(layers):
    """Yields a list that fills with the [T, E] router logits of each sparse layer, in order."""
    seen, handles = [], []

    def record(module, inputs, out):
        logits = out[0] if isinstance(out, tuple) else out  # transformers' routers return (logits, weights, ids)
        seen.append(logits.float().reshape(-1, logits.shape[-1]))

    for layer in layers:
        if hasattr(layer.mlp, "gate") and not hasattr(layer.mlp, "gate_up_proj"):
            handles.append(layer.mlp.gate.register_forward_hook(record))
    yield seen
    for handle in handles:
        handle.remove()


# Max abs logit difference, as in test_model_parity (measured here: bfloat16 0.22, float16 0.023).
HALF_TOLERANCE = {torch.bfloat16: 0.25, torch.float16: 0.05}
# Half precision rounds rill's and transformers' hidden states differently (rill's attention reference runs in
# float32), so a token whose k-th and (k+1)-th router probabilities nearly tie may pick another expert,
# and from that token on the two outputs part. Such flips must be rare and near ties; the tokens before
# the first one (causal attention: untouched by it) must agree within the bfloat16 tolerance.
NEAR_TIE = 0.02  # gap between the k-th and (k+1)-th router probability in transformers' model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", ["mixtral", "qwen3-moe-window"])
def test_half_precision_logits_close_to_transformers_up_to_the_first_near_tie_routing_flip(kind, dtype, tmp_path):
    d = make_family_dir(tmp_path, kind, dtype=dtype)
    ours_model, theirs_model = load(d)[3], hf_model(d, dtype)
    top_k = ours_model.config.moe.top_k
    for ids in (list(range(3, 60)), list(range(200, 260))):
        with router_logits(ours_model.layers) as mine, router_logits(theirs_model.model.layers) as ref:
            ours, theirs = rill_forward(ours_model, ids), hf_forward(theirs_model, ids)
        assert len(mine) == len(ref) == sum(ours_model.config.moe.sparse_layers)
        first_flip = len(ids)
        for our_logits, their_logits in zip(mine, ref, strict=True):
            ours_picked, theirs_picked = route(our_logits, top_k, False)[1], route(their_logits, top_k, False)[1]
            flips = (ours_picked.sort().values != theirs_picked.sort().values).any(-1)
            probs = their_logits.softmax(-1).topk(top_k + 1).values
            assert ((probs[:, -2] - probs[:, -1])[flips] < NEAR_TIE).all()
            first_flip = min([first_flip, *flips.nonzero().flatten().tolist()])
        assert first_flip >= 16  # the comparison below covers a real prefix
        assert (ours[:first_flip] - theirs[:first_flip]).abs().max().item() < HALF_TOLERANCE[dtype]


def test_qwen3_moe_sparse_layers_follow_decoder_sparse_step_and_mlp_only_layers(tmp_path):
    d = make_family_dir(tmp_path, "qwen3-moe-window")  # 2 layers, decoder_sparse_step 2
    cfg = load_model_config(d)
    assert cfg.moe.sparse_layers == (False, True)
    assert cfg.moe.norm_topk_prob and cfg.moe.weights_in_model_dtype
    assert cfg.layer_windows == (24, 24)
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, "decoder_sparse_step": 1, "mlp_only_layers": [0]}))
    assert load_model_config(d).moe.sparse_layers == (False, True)


def test_mixtral_config_reads_experts_and_window(tmp_path):
    cfg = load_model_config(make_family_dir(tmp_path, "mixtral"))
    assert (cfg.moe.num_experts, cfg.moe.top_k, cfg.moe.intermediate_size) == (8, 2, 64)
    assert cfg.moe.norm_topk_prob and not cfg.moe.weights_in_model_dtype
    assert cfg.moe.sparse_layers == (True, True) and cfg.layer_windows == (24, 24)


def test_more_experts_per_token_than_experts_is_a_model_load_error(tmp_path):
    d = make_family_dir(tmp_path, "mixtral")
    raw = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**raw, "num_experts_per_tok": 9}))
    with pytest.raises(ModelLoadError, match="num_experts_per_tok 9"):
        load_model_config(d)
