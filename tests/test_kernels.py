"""The Triton attention kernels against the torch reference, on fresh random paged caches.

With a GPU the cases run at full size (batch up to 64, contexts up to 5,000 tokens)
through `rill.kernels` dispatch. Without one they run small through Triton's
interpreter, which needs TRITON_INTERPRET=1 before triton is first imported (its own
library functions are decorated at import) and while kernels launch. A plain CPU run
therefore re-runs this file in a child pytest with the variable set
(`test_kernels_pass_under_the_interpreter`); `TRITON_INTERPRET=1 pytest tests/test_kernels.py`
runs the cases directly.

Every case poisons the output with NaN, fills freed blocks (wholly outside the window),
the table slots past each sequence and the unwritten slots of its last block with NaN,
and points freed table entries at a NaN block: a kernel that reads any of them, or
leaves an output element unwritten, fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from rill.kernels import dispatch, reference, triton_attn  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")
INTERPRETING = not ON_GPU and os.environ.get("TRITON_INTERPRET") == "1"
launches = pytest.mark.skipif(not (ON_GPU or INTERPRETING), reason="run by test_kernels_pass_under_the_interpreter")
# ||out - ref|| / ||ref|| against the float32 reference; a single output row may be 4x off that.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 1.5e-2}


@pytest.mark.skipif(ON_GPU or INTERPRETING, reason="this is the CPU run's way into the interpreter")
def test_kernels_pass_under_the_interpreter(tmp_path):
    root = Path(__file__).resolve().parents[1]
    # cwd outside the repository: its top-level kernels/ would shadow an installed package.
    cmd = [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider",
           "--rootdir", str(root), "-c", str(root / "pyproject.toml")]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-4000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-2000:]


@dataclass(frozen=True)
class Sizes:
    """Shapes of one run: full on a GPU, small under the interpreter."""

    batches: tuple[int, ...]
    max_len: int
    max_chunk: int
    windows: dict  # "small" / "large" -> tokens
    kv_heads: dict  # GQA ratio -> number of KV heads


GPU_SIZES = Sizes((1, 7, 64), 5000, 700, {"small": 1000, "large": 4096}, {1: 32, 4: 8, 8: 4})
CPU_SIZES = Sizes((1, 3, 6), 200, 100, {"small": 24, "large": 70}, {1: 2, 4: 1, 8: 1})
SIZES = GPU_SIZES if ON_GPU else CPU_SIZES


@dataclass
class Case:
    query: torch.Tensor  # [T, H, D]
    k_cache: torch.Tensor  # [N, B, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32
    scale: float
    window: int | None
    softcap: float | None = None

    @property
    def args(self):
        return (self.query, self.k_cache, self.v_cache, self.block_tables, self.seq_lens, self.query_start_loc,
                self.scale, self.window)


def seeded(*key) -> torch.Generator:
    """A CPU generator seeded by the case's parameters, the same in every process."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def randn(shape, gen: torch.Generator, dtype) -> torch.Tensor:
    # Drawn on the device (a full-size cache is gigabytes), seeded from the case's generator.
    device_gen = torch.Generator(DEVICE).manual_seed(int(torch.randint(2**31, (1,), generator=gen)))
    return torch.randn(shape, generator=device_gen, device=DEVICE).to(dtype)


def draw_lengths(gen: torch.Generator, batch: int, page: int, window: int | None, max_len: int = 0) -> list[int]:
    """Context lengths biased to sit on and around block and window boundaries."""
    max_len = max_len or SIZES.max_len
    edges = [1, page - 1, page, page + 1, 2 * page + 1, max_len]
    if window is not None:
        edges += [window - 1, window, window + 1, window + page - 1, window + page + 1, 2 * window + 3]
    edges = [n for n in edges if 1 <= n <= max_len]
    lens = []
    for _ in range(batch):
        if torch.rand(1, generator=gen).item() < 0.5:
            lens.append(edges[int(torch.randint(len(edges), (1,), generator=gen))])
        else:
            lens.append(int(torch.randint(1, max_len + 1, (1,), generator=gen)))
    return lens


def make_case(gen, seq_lens, q_lens, *, group, head_dim, page, window, dtype, softcap=None) -> Case:
    num_kv_heads = SIZES.kv_heads[group]
    blocks = [-(-n // page) for n in seq_lens]
    num_blocks = sum(blocks) + 1
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    poison = ids.pop()
    shape = (num_blocks, page, num_kv_heads, head_dim)
    k_cache, v_cache = randn(shape, gen, dtype), randn(shape, gen, dtype)
    table = torch.full((len(seq_lens), max(blocks) + 2), poison, dtype=torch.int32)
    for i, (seq_len, q_len) in enumerate(zip(seq_lens, q_lens)):
        own, ids = ids[: blocks[i]], ids[blocks[i] :]
        first = reference.first_visible_position(seq_len, q_len, window) // page
        table[i, first : blocks[i]] = torch.tensor(own[first:], dtype=torch.int32)
        for cache in (k_cache, v_cache):
            cache[own[:first]] = float("nan")  # freed by the engine
            cache[own[-1], seq_len - (blocks[i] - 1) * page :] = float("nan")  # not yet written
    k_cache[poison] = v_cache[poison] = float("nan")
    starts = torch.tensor([0] + q_lens).cumsum(0).to(torch.int32)
    query = randn((int(starts[-1]), num_kv_heads * group, head_dim), gen, dtype)
    seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
    return Case(query, k_cache, v_cache, table.to(DEVICE), seq_lens.to(DEVICE), starts.to(DEVICE),
                head_dim**-0.5, window, softcap)


def run_and_check(case: Case, attention=None, **kwargs) -> None:
    attention = attention or (dispatch.paged_attention if ON_GPU else triton_attn.paged_attention)
    out = torch.full_like(case.query, float("nan"))
    attention(*case.args, out=out, softcap=case.softcap, **kwargs)
    # The oracle runs on the CPU in float32, whatever device the kernels ran on.
    cpu_args = [t.cpu() if isinstance(t, torch.Tensor) else t for t in case.args]
    expected = reference.paged_attention(*cpu_args, out=torch.empty(case.query.shape, dtype=torch.float32),
                                         softcap=case.softcap)
    out = out.cpu()
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements unwritten or poisoned"
    err, ref = (out.double() - expected.double()), expected.double()
    tol = TOLERANCE[case.query.dtype]
    assert err.norm() / ref.norm() < tol
    row_err = err.norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-6)
    assert row_err.max() < 4 * tol, f"worst row (token, head) {divmod(int(row_err.argmax()), out.shape[1])}"


def _window(kind):
    return None if kind is None else SIZES.windows[kind]


DECODE_CASES = [
    # batch index, dtype, GQA ratio, head_dim, window, page
    (0, torch.bfloat16, 1, 64, None, 16),
    (2, torch.bfloat16, 4, 128, "large", 16),
    (1, torch.float16, 8, 64, "small", 16),
    (2, torch.float32, 4, 32, "small", 8),
    (1, torch.bfloat16, 8, 128, None, 32),
    (2, torch.float16, 1, 128, "large", 16),
]


@launches
@pytest.mark.parametrize("batch_idx,dtype,group,head_dim,window,page", DECODE_CASES)
def test_decode_matches_reference(batch_idx, dtype, group, head_dim, window, page):
    gen = seeded(batch_idx, dtype, group, head_dim, window, page)
    window = _window(window)
    seq_lens = draw_lengths(gen, SIZES.batches[batch_idx], page, window)
    case = make_case(gen, seq_lens, [1] * len(seq_lens), group=group, head_dim=head_dim, page=page,
                     window=window, dtype=dtype)
    run_and_check(case, max_query_len=1)


@launches
@pytest.mark.parametrize("num_splits,window", [(1, None), (3, None), (8, None), (2, "large"), (5, "small")])
def test_decode_split_k_merges_to_the_same_result(num_splits, window):
    gen = seeded("splits", num_splits, window)
    window = _window(window)
    # Long enough that every split gets keys, under the interpreter too.
    seq_lens = draw_lengths(gen, SIZES.batches[-1], 16, window, max_len=max(SIZES.max_len, 800))
    case = make_case(gen, seq_lens, [1] * len(seq_lens), group=4, head_dim=64, page=16, window=window,
                     dtype=torch.bfloat16)
    run_and_check(case, triton_attn.paged_attention, max_query_len=1, num_splits=num_splits)


@launches
def test_decode_skips_sequences_without_queries():
    gen = seeded("empty decode")
    case = make_case(gen, [40, 9, 17], [1, 0, 1], group=4, head_dim=32, page=8, window=None, dtype=torch.float16)
    run_and_check(case, triton_attn.paged_attention, num_splits=2)


PREFILL_CASES = [
    # batch index, dtype, GQA ratio, head_dim, window, page
    (0, torch.bfloat16, 4, 128, "large", 16),
    (1, torch.bfloat16, 1, 64, None, 16),
    (1, torch.float16, 8, 128, "small", 16),
    (1, torch.float32, 4, 32, "small", 8),
    (1, torch.bfloat16, 8, 64, "large", 32),
]


def draw_chunks(gen, seq_lens):
    """Query lengths: whole prompts, chunks over a cached prefix, and single decode tokens."""
    q_lens = []
    for n in seq_lens:
        kind = int(torch.randint(3, (1,), generator=gen))
        longest = min(n, SIZES.max_chunk)
        q_lens.append([longest, int(torch.randint(1, longest + 1, (1,), generator=gen)), 1][kind])
    return q_lens


@launches
@pytest.mark.parametrize("batch_idx,dtype,group,head_dim,window,page", PREFILL_CASES)
def test_chunked_prefill_matches_reference(batch_idx, dtype, group, head_dim, window, page):
    gen = seeded("prefill", batch_idx, dtype, group, head_dim, window, page)
    window = _window(window)
    batch = min(SIZES.batches[batch_idx], 16)
    seq_lens = draw_lengths(gen, batch, page, window)
    q_lens = draw_chunks(gen, seq_lens)
    q_lens[0] = min(seq_lens[0], max(2, q_lens[0]))  # at least one real chunk
    seq_lens[0] = max(seq_lens[0], 2)
    case = make_case(gen, seq_lens, q_lens, group=group, head_dim=head_dim, page=page, window=window, dtype=dtype)
    run_and_check(case, max_query_len=None if batch_idx else max(q_lens))


@launches
def test_prefill_handles_empty_sequences_and_loose_max_query_len():
    gen = seeded("empty prefill")
    case = make_case(gen, [30, 5, 64, 1], [30, 0, 7, 1], group=4, head_dim=32, page=4,
                     window=SIZES.windows["small"], dtype=torch.float32)
    run_and_check(case, triton_attn.paged_attention, max_query_len=100)


# Scores q.k * scale have a standard deviation near 1 here, so a cap of 1.5 bends most of them.
SOFTCAP = 1.5


@launches
@pytest.mark.parametrize("num_splits,dtype,window", [(1, torch.float32, "small"), (2, torch.bfloat16, None)])
def test_decode_soft_caps_scores_like_the_reference(num_splits, dtype, window):
    gen = seeded("softcap decode", num_splits, dtype, window)
    window = _window(window)
    seq_lens = draw_lengths(gen, SIZES.batches[1], 16, window)
    case = make_case(gen, seq_lens, [1] * len(seq_lens), group=4, head_dim=32, page=16, window=window,
                     dtype=dtype, softcap=SOFTCAP)
    run_and_check(case, triton_attn.paged_attention, max_query_len=1, num_splits=num_splits)


@launches
@pytest.mark.parametrize("dtype,window", [(torch.float32, "small"), (torch.bfloat16, None)])
def test_chunked_prefill_soft_caps_scores_like_the_reference(dtype, window):
    gen = seeded("softcap prefill", dtype, window)
    window = _window(window)
    seq_lens = draw_lengths(gen, SIZES.batches[1], 8, window)
    q_lens = draw_chunks(gen, seq_lens)
    q_lens[0] = seq_lens[0] = max(seq_lens[0], 2)
    case = make_case(gen, seq_lens, q_lens, group=1, head_dim=32, page=8, window=window, dtype=dtype,
                     softcap=SOFTCAP)
    run_and_check(case, max_query_len=max(q_lens))


def test_reference_soft_cap_changes_the_result():
    """Guards the tests above: a cap this tight must move the output, or they would pass vacuously."""
    gen = seeded("softcap matters")
    case = make_case(gen, [37, 5], [37, 1], group=1, head_dim=32, page=8, window=None, dtype=torch.float32)
    cpu_args = [t.cpu() if isinstance(t, torch.Tensor) else t for t in case.args]
    capped = reference.paged_attention(*cpu_args, softcap=SOFTCAP)
    assert (capped - reference.paged_attention(*cpu_args)).abs().max() > 0.05


@launches
@pytest.mark.parametrize("dtype,cache_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float16)])
@pytest.mark.parametrize("num_kv_heads,head_dim", [(1, 32), (8, 128)])
def test_write_kv_fills_exactly_the_mapped_slots(dtype, cache_dtype, num_kv_heads, head_dim):
    gen = seeded("write", dtype, cache_dtype, num_kv_heads, head_dim)
    num_blocks, page = (64, 16) if ON_GPU else (6, 4)
    num_tokens = num_blocks * page // 2
    # Keys and values as strided views of one fused projection, like a model's qkv split.
    fused = randn((num_tokens, 3 * num_kv_heads, head_dim), gen, dtype)
    key, value = fused[:, num_kv_heads : 2 * num_kv_heads], fused[:, 2 * num_kv_heads :]
    slots = torch.randperm(num_blocks * page, generator=gen)[:num_tokens]
    slots[::5] = -1  # padding rows of a captured decode step: written nowhere, by both backends
    slots = slots.to(DEVICE)
    caches = [torch.full((num_blocks, page, num_kv_heads, head_dim), float("nan"), dtype=cache_dtype, device=DEVICE)
              for _ in range(4)]
    write = dispatch.write_kv if ON_GPU else triton_attn.write_kv
    write(key, value, caches[0], caches[1], slots)
    reference.write_kv(key, value, caches[2], caches[3], slots)
    for got, want in zip(caches[:2], caches[2:]):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_dispatch_uses_reference_on_cpu_unless_interpreting(monkeypatch):
    calls = []
    monkeypatch.setattr(triton_attn, "paged_attention", lambda *args, **kwargs: calls.append(args))
    gen = seeded("dispatch")
    case = make_case(gen, [5], [1], group=1, head_dim=32, page=4, window=None, dtype=torch.float32)
    cpu_args = [t.cpu() if isinstance(t, torch.Tensor) else t for t in case.args]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert dispatch.paged_attention(*cpu_args).isfinite().all() and not calls
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    dispatch.paged_attention(*cpu_args, max_query_len=1)
    assert len(calls) == 1 and calls[0][-1] == 1


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(4, 4, 48), (6, 4, 32)])
def test_unsupported_shapes_are_rejected(heads, kv_heads, head_dim):
    query = torch.randn(1, heads, head_dim)
    cache = torch.randn(2, 4, kv_heads, head_dim)
    table, ones = torch.zeros(1, 2, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError):
        triton_attn.paged_attention(query, cache, cache, table, ones, torch.tensor([0, 1], dtype=torch.int32), 1.0)
