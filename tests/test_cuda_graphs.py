"""Decode steps replayed from CUDA graphs (`--cuda-graphs`, engine/cuda_graphs.py).

On a GPU: greedy tokens with graphs equal those without (float32, so the two paths differ only in
the attention kernel's split count), for one KV group (Mistral's window) and several (Gemma 2's
alternating layers), with batches that fall on and between the buckets. Without a GPU, the part
that is not CUDA's is checked: the static buffers, the padding rows and the bucket choice, by
running the decoder eagerly over the filled buffers where a GPU would replay the graph
(`EagerReplayStandIn`, a stand-in for the replay alone).
"""

from __future__ import annotations

import random

import pytest
import torch

from helpers_models import make_model_dir
from rill.config import EngineConfig
from rill.engine.core import EngineCore
from rill.engine.cuda_graphs import DecodeGraphs, buckets
from rill.engine.model_runner import WARM_UP_SPLIT_TOKENS
from rill.kernels.triton_attn import MIN_SPLIT_TOKENS
from rill.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
ON_GPU = torch.cuda.is_available()


@pytest.fixture(scope="module", params=["mistral", "gemma2"])
def model_dir(request, tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp(request.param), request.param)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 400) for _ in range(rng.randrange(3, 60))] for _ in range(n)]


def generate(core: EngineCore, ps: list[list[int]]) -> dict[str, list[int]]:
    for i, p in enumerate(ps):
        core.add_request(f"r{i}", p, GREEDY)
    out = {f"r{i}": [] for i in range(len(ps))}
    done = 0
    for _ in range(2000):
        for d in core.step():
            out[d.request_id] += d.token_ids
            done += d.finished
        if done == len(ps):
            assert core.block_manager.num_free_blocks == core.block_manager.num_blocks
            return out
    raise AssertionError("requests did not finish")


class EagerReplayStandIn(DecodeGraphs):
    """Fills the buffers as a replay would, then runs the decoder eagerly over them (no GPU needed)."""

    used: list[int]

    def capture(self) -> float:
        self.used = []
        return 0.0

    @torch.inference_mode()
    def run(self, seqs) -> torch.Tensor:
        size = self.fill(seqs)
        self.used.append(size)
        return self._forward(size)[: len(seqs)]


def test_buckets_cover_every_batch_size_up_to_the_largest():
    assert buckets(1) == [1]
    assert buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert buckets(256)[-3:] == [224, 240, 256]
    for top in (1, 5, 17, 64, 300):
        sizes = buckets(top)
        assert sizes[-1] == top and all(any(s >= n for s in sizes) for n in range(1, top + 1))


def test_cuda_graphs_need_a_cuda_device():
    with pytest.raises(ValueError, match="CUDA device"):
        EngineConfig(cuda_graphs=True)
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        EngineConfig(cuda_graphs=True, device="cuda", tensor_parallel_size=2)


@pytest.mark.parametrize("n", [1, 3, 17])
def test_padded_buffers_give_the_eager_tokens_with_an_eager_stand_in_for_replay(model_dir, n):
    ps = prompts(n, seed=n)
    want = generate(EngineCore(EngineConfig(model=str(model_dir), num_kv_blocks=256, max_num_seqs=20)), ps)
    core = EngineCore(EngineConfig(model=str(model_dir), num_kv_blocks=256, max_num_seqs=20))
    runner = core.runner
    max_blocks = -(-core.max_model_len // core.config.block_size) + 1
    runner.graphs = EagerReplayStandIn(runner.model, runner.kv_caches, runner.layout, runner.block_size, 20, max_blocks)
    runner.graphs.capture()
    last_slot = [k.view(-1, *k.shape[2:])[-1].clone() for k, _ in runner.kv_caches]
    assert generate(core, ps) == want
    assert runner.graphs.used and set(runner.graphs.used) <= {s for s in buckets(20) if s >= 1}
    assert min(s for s in runner.graphs.used) >= 1 and max(runner.graphs.used) == next(s for s in buckets(20) if s >= n)
    # the padding rows wrote nowhere: slot -1 would have been the cache's last slot
    for (k, _), before in zip(runner.kv_caches, last_slot):
        assert torch.equal(k.view(-1, *k.shape[2:])[-1], before)


@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("n", [1, 3, 17, 40])
def test_greedy_tokens_with_cuda_graphs_equal_those_without(model_dir, n):
    ps = prompts(n, seed=n)
    kw = dict(model=str(model_dir), device="cuda", dtype="float32", num_kv_blocks=512, max_num_seqs=40)
    want = generate(EngineCore(EngineConfig(**kw)), ps)
    core = EngineCore(EngineConfig(**kw, cuda_graphs=True))
    assert core.runner.graphs is not None and sorted(core.runner.graphs.graphs) == buckets(40)
    replays = []
    run = core.runner.graphs.run
    core.runner.graphs.run = lambda seqs: (replays.append(len(seqs)), run(seqs))[1]
    assert generate(core, ps) == want
    assert replays  # decode steps did replay


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU"))])
def test_the_start_up_warm_up_pass_leaves_the_engine_as_it_was(model_dir, device):
    """ModelRunner.warm_up (run at start on CUDA, so that Triton compiles before the first request):
    dummy prefills and decodes over free blocks; the answers afterwards are the same as without it."""
    ps = prompts(3, seed=9)
    kw = dict(model=str(model_dir), device=device, dtype="float32", num_kv_blocks=256, max_num_seqs=8)
    want = generate(EngineCore(EngineConfig(**kw)), ps)
    core = EngineCore(EngineConfig(**kw))
    free = core.block_manager.num_free_blocks
    widths, prepare = [], core.runner._prepare  # its last decode reads tables wide enough to split the keys
    core.runner._prepare = lambda batch: (widths.append(max(len(t) for s in batch.seqs for t in s.block_tables)),
                                          prepare(batch))[1]
    assert core.runner.warm_up() >= 0
    core.runner._prepare = prepare
    assert widths[-1] * core.runner.block_size >= WARM_UP_SPLIT_TOKENS >= 2 * MIN_SPLIT_TOKENS
    assert core.block_manager.num_free_blocks == free and not core.requests
    assert generate(core, ps) == want


def test_a_mixture_of_experts_model_refuses_cuda_graphs(tmp_path):
    from helpers_families import make_family_dir

    core = EngineCore(EngineConfig(model=str(make_family_dir(tmp_path, "mixtral")), num_kv_blocks=64))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        core.runner.capture_decode_graphs(8, 16)
    with pytest.raises(ValueError, match="CUDA device"):  # a dense model on the CPU: the device is the reason
        EngineCore(EngineConfig(model=str(make_model_dir(tmp_path / "dense", "mistral")),
                                num_kv_blocks=64)).runner.capture_decode_graphs(8, 16)


def test_the_warm_up_pass_skips_a_cache_too_small_for_its_dummy_sequences(tmp_path):
    d = make_model_dir(tmp_path, "mistral")
    assert EngineCore(EngineConfig(model=str(d), num_kv_blocks=4)).runner.warm_up() == 0.0  # needs 5
    assert EngineCore(EngineConfig(model=str(d), num_kv_blocks=5)).runner.warm_up() > 0.0
