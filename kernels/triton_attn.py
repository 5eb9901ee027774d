"""Triton kernels over rill's paged KV cache: KV write, decode and chunked prefill.

Layout and visibility rule are those of `rill.kernels`; `reference.py` is the oracle.

Decode (every q_len <= 1) runs one program per (sequence, KV head, split): the program
packs the KV head's G = H / Hkv query heads into the rows of one tile, so each K/V
page is read once per KV head, and walks its share of the visible tokens in tiles of
BLOCK_N keys (flash-decoding). With more than one split a second kernel merges the
partial results by their log-sum-exp. Chunked prefill runs one program per (query
tile, KV head): a tile holds BLOCK_Q query tokens x G heads; the tiles of all
sequences are numbered in one flat grid and each program finds its sequence by binary
search over query_start_loc, so the launch needs no host sync.

Every K/V load is masked to positions some query of the program can see, and block
table entries are looked up only for those positions, so blocks outside the window
(and table slots past the end of a sequence) are never touched.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
_LOG2E = tl.constexpr(LOG2E)  # what a kernel may read: compiled Triton sees only constexpr globals
# Tiles; bench.py sweeps alternatives on the GPU (BENCHMARKS.md, "GPU figures"): decode's is the best of 18 on an
# H200, prefill's the best of 24 on an H100 (1.27x the 64 x 64 tile it replaced at 4 x 4,096 tokens).
DECODE_CONFIG = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
PREFILL_CONFIG = {"BLOCK_M": 128, "BLOCK_N": 32, "num_warps": 4, "num_stages": 3}
MIN_SPLIT_TOKENS = 128  # below this a split's fixed cost outweighs the parallelism gained
MAX_SPLITS = 64  # a power of two: the merge kernel reads this many partial rows, masked past num_splits
# Integer arguments that change from step to step. Compiled Triton specializes an int argument equal to 1
# or divisible by 16 (a variant each, compiled on its first launch); these are kept out of that, so that a
# server's batches, contexts and split counts meet the variants its start-up warm-up compiled, and never
# compile while it serves (a compile holds the interpreter lock for seconds: the event loop stalls).
DYNAMIC_INTS = ("num_splits", "num_seqs", "stride_bt")


@triton.jit
def _write_kv_kernel(
    key, value, k_cache, v_cache, slot_mapping, num_kv_heads,
    stride_kt, stride_kh, stride_vt, stride_vh, stride_cb, stride_ct, stride_ch,
    PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, HEADS_PAD: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    if slot < 0:  # a CUDA graph's padding row (engine/cuda_graphs.py): written nowhere
        return
    h = tl.arange(0, HEADS_PAD)[:, None]
    d = tl.arange(0, HEAD_DIM)[None, :]
    mask = h < num_kv_heads
    dst = (slot // PAGE) * stride_cb + (slot % PAGE) * stride_ct + h * stride_ch + d
    k = tl.load(key + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(value + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache + dst, k.to(k_cache.dtype.element_ty), mask=mask)
    tl.store(v_cache + dst, v.to(v_cache.dtype.element_ty), mask=mask)


@triton.jit
def _kv_offsets(table_row, tok, valid, kv_head, stride_cb, stride_ct, stride_ch, PAGE: tl.constexpr):
    # [BLOCK_N] element offsets of each key's row for this KV head; table read only where valid.
    block = tl.load(table_row + tok // PAGE, mask=valid, other=0).to(tl.int64)
    return block * stride_cb + (tok % PAGE) * stride_ct + kv_head * stride_ch


@triton.jit
def _dot(a, b, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    # UPCAST: Triton's interpreter multiplies bfloat16 bit patterns as integers (3.9), so
    # it gets the exact float32 products instead; the GPU accumulates in float32 too.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=DOT_PRECISION)


@triton.jit
def _soft_cap(s, cap):
    # cap * tanh(s / cap), tanh from exp2 (the interpreter has no tanh): 1 - 2 / (e^2x + 1) is
    # exact at both ends (e^2x overflowing to inf gives 1, underflowing to 0 gives -1).
    e = tl.exp2(s * (2.0 * _LOG2E / cap))
    return cap * (1.0 - 2.0 / (e + 1.0))


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, k_cache, v_cache, kv_off, valid, visible, qk_scale, cap,
    HEAD_DIM: tl.constexpr, HAS_SOFTCAP: tl.constexpr, DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    # One online-softmax step (base 2) over a tile of keys; visible: [rows, BLOCK_N]. Scores are
    # in base-2 units (qk_scale holds log2 e), so the soft cap is too: cap = softcap * log2 e.
    d = tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_cache + kv_off[:, None] + d, mask=valid[:, None], other=0.0)
    s = _dot(q, tl.trans(k), DOT_PRECISION, UPCAST) * qk_scale
    if HAS_SOFTCAP:
        s = _soft_cap(s, cap)
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    v = tl.load(v_cache + kv_off[:, None] + d, mask=valid[:, None], other=0.0)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PRECISION, UPCAST)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit(do_not_specialize=DYNAMIC_INTS)
def _decode_kernel(
    query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, part_out, part_lse,
    qk_scale, cap, window, num_splits, num_heads,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_ct, stride_ch, stride_bt,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, SPLIT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start = tl.load(query_start_loc + seq)
    if tl.load(query_start_loc + seq + 1) == q_start:
        return
    seq_len = tl.load(seq_lens + seq)
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    # Splits cover [page start of lo, seq_len) in BLOCK_N-aligned shares.
    first = (lo // PAGE) * PAGE
    share = tl.cdiv(tl.cdiv(seq_len - first, num_splits), BLOCK_N) * BLOCK_N
    split_lo = first + split * share
    split_hi = tl.minimum(split_lo + share, seq_len)

    g = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(query + q_start * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=(g < GROUP)[:, None], other=0.0)
    m_i = tl.full([GROUP_PAD], -1.0e30, tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], tl.float32)
    table_row = block_tables + seq * stride_bt
    for start in range(split_lo, split_hi, BLOCK_N):
        tok = start + tl.arange(0, BLOCK_N)
        valid = (tok >= lo) & (tok < split_hi)
        kv_off = _kv_offsets(table_row, tok, valid, kv_head, stride_cb, stride_ct, stride_ch, PAGE)
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_cache, v_cache, kv_off, valid, valid[None, :], qk_scale, cap,
            HEAD_DIM, HAS_SOFTCAP, DOT_PRECISION, UPCAST,
        )

    has_keys = l_i > 0
    o = acc / tl.where(has_keys, l_i, 1.0)[:, None]
    if SPLIT:
        row = (seq * num_heads + heads) * num_splits + split
        tl.store(part_out + row[:, None] * HEAD_DIM + d[None, :], o, mask=(g < GROUP)[:, None])
        lse = tl.where(has_keys, m_i + tl.log2(tl.where(has_keys, l_i, 1.0)), float("-inf"))
        tl.store(part_lse + row, lse, mask=g < GROUP)
    else:
        dst = out + q_start * stride_ot + heads[:, None] * stride_oh + d[None, :]
        tl.store(dst, o.to(out.dtype.element_ty), mask=(g < GROUP)[:, None])


@triton.jit(do_not_specialize=DYNAMIC_INTS)
def _merge_splits_kernel(
    part_out, part_lse, query_start_loc, out, num_splits, num_heads, stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr,
):
    seq, head = tl.program_id(0), tl.program_id(1)
    q_start = tl.load(query_start_loc + seq)
    if tl.load(query_start_loc + seq + 1) == q_start:
        return
    s = tl.arange(0, SPLITS_PAD)
    d = tl.arange(0, HEAD_DIM)
    row = (seq * num_heads + head) * num_splits + s
    lse = tl.load(part_lse + row, mask=s < num_splits, other=float("-inf"))
    weight = tl.exp2(lse - tl.max(lse, 0))
    parts = tl.load(part_out + row[:, None] * HEAD_DIM + d[None, :], mask=(s < num_splits)[:, None], other=0.0)
    o = tl.sum(parts * weight[:, None], 0) / tl.sum(weight, 0)
    tl.store(out + q_start * stride_ot + head * stride_oh + d, o.to(out.dtype.element_ty))


@triton.jit
def _find_seq(query_start_loc, num_seqs, tile, BLOCK_Q: tl.constexpr):
    # Sequence i owns flat tiles from query_start_loc[i] // BLOCK_Q + i on; find the last i <= tile.
    left = 0
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        if tl.load(query_start_loc + mid) // BLOCK_Q + mid <= tile:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit(do_not_specialize=DYNAMIC_INTS)
def _prefill_kernel(
    query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
    qk_scale, cap, window, num_seqs,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_cb, stride_ct, stride_ch, stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    tile, kv_head = tl.program_id(0), tl.program_id(1)
    seq = _find_seq(query_start_loc, num_seqs, tile, BLOCK_Q)
    q_start = tl.load(query_start_loc + seq)
    q_len = tl.load(query_start_loc + seq + 1) - q_start
    q_first = (tile - q_start // BLOCK_Q - seq) * BLOCK_Q  # index of the tile's first query in its sequence
    if q_first >= q_len:
        return
    seq_len = tl.load(seq_lens + seq)
    # Rows are (query token, head in group) pairs, heads fastest.
    r = tl.arange(0, BLOCK_M)
    qi = q_first + r // GROUP
    row_ok = (r < BLOCK_Q * GROUP) & (qi < q_len)
    heads = kv_head * GROUP + r % GROUP
    q_pos = seq_len - q_len + qi
    d = tl.arange(0, HEAD_DIM)
    q = tl.load(query + (q_start + qi)[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :],
                mask=row_ok[:, None], other=0.0)

    hi = tl.minimum(seq_len - q_len + q_first + BLOCK_Q, seq_len)  # one past the tile's last position
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(seq_len - q_len + q_first - window + 1, 0)
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table_row = block_tables + seq * stride_bt
    for start in range((lo // PAGE) * PAGE, hi, BLOCK_N):
        tok = start + tl.arange(0, BLOCK_N)
        valid = (tok >= lo) & (tok < hi)
        kv_off = _kv_offsets(table_row, tok, valid, kv_head, stride_cb, stride_ct, stride_ch, PAGE)
        visible = valid[None, :] & (tok[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (tok[None, :] > q_pos[:, None] - window)
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, k_cache, v_cache, kv_off, valid, visible, qk_scale, cap,
            HEAD_DIM, HAS_SOFTCAP, DOT_PRECISION, UPCAST,
        )

    o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    dst = out + (q_start + qi)[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :]
    tl.store(dst, o.to(out.dtype.element_ty), mask=row_ok[:, None])


def write_kv(key, value, k_cache, v_cache, slot_mapping) -> None:
    """Scatter the new tokens' keys and values ([T, Hkv, D]) into their cache slots; a negative
    slot is skipped (the padding rows of a captured decode step)."""
    num_tokens, num_kv_heads, head_dim = key.shape
    check_head_dim(head_dim)
    _check_rows(key, value, k_cache, v_cache)
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping, num_kv_heads,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1), *k_cache.stride()[:3],
        PAGE=k_cache.shape[1], HEAD_DIM=head_dim, HEADS_PAD=triton.next_power_of_2(num_kv_heads),
    )


def paged_attention(
    query: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [N, B, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [S, max_blocks] int32
    seq_lens: torch.Tensor,  # [S] int32
    query_start_loc: torch.Tensor,  # [S + 1] int32
    scale: float,
    window: int | None = None,
    out: torch.Tensor | None = None,  # [T, H, D]
    max_query_len: int | None = None,
    softcap: float | None = None,
    *,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Varlen paged attention; same contract as `reference.paged_attention`.

    softcap (None: off) caps each score as softcap * tanh(score / softcap) before the mask.
    max_query_len (exact, or any upper bound above 1) picks the kernel without a device
    sync: 1 runs the decode kernel, more runs the prefill kernel. num_splits overrides
    the decode kernel's split-K heuristic (tests and benchmarks).
    """
    if out is None:
        out = torch.empty_like(query)
    num_seqs = seq_lens.shape[0]
    if query.shape[0] == 0 or num_seqs == 0:
        return out
    check_head_dim(query.shape[2])
    _check_rows(query, out, k_cache, v_cache)
    if query.shape[1] % k_cache.shape[2]:
        raise ValueError(f"{query.shape[1]} query heads is not a multiple of {k_cache.shape[2]} KV heads")
    if k_cache.dtype != query.dtype or v_cache.dtype != query.dtype:
        raise ValueError(f"query is {query.dtype} but the cache is {k_cache.dtype}/{v_cache.dtype}")
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())  # syncs
    args = (query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, scale * LOG2E, window, softcap)
    if max_query_len <= 1:
        _launch_decode(*args, num_splits)
    else:
        _launch_prefill(*args)
    return out


def _launch_decode(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, qk_scale, window, softcap,
                   num_splits):
    num_seqs, (num_heads, head_dim), num_kv_heads = seq_lens.shape[0], query.shape[1:], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if num_splits is None:
        num_splits = _num_splits(num_seqs * num_kv_heads, _max_visible_tokens(block_tables, k_cache, window),
                                 query.device)
    parts = lse = out  # unused unless split
    if num_splits > 1:
        parts = torch.empty(num_seqs, num_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
        lse = torch.empty(num_seqs, num_heads, num_splits, dtype=torch.float32, device=query.device)
    _decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, parts, lse,
        qk_scale, (softcap or 0.0) * LOG2E, window or 0, num_splits, num_heads,
        *query.stride()[:2], *out.stride()[:2], *k_cache.stride()[:3], block_tables.stride(0),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        PAGE=k_cache.shape[1], BLOCK_N=DECODE_CONFIG["BLOCK_N"], HAS_WINDOW=window is not None,
        SPLIT=num_splits > 1, HAS_SOFTCAP=softcap is not None,
        DOT_PRECISION=_dot_precision(query), UPCAST=_upcast_dots(query),
        num_warps=DECODE_CONFIG["num_warps"], num_stages=DECODE_CONFIG["num_stages"],
    )
    if num_splits > 1:
        _merge_splits_kernel[(num_seqs, num_heads)](
            parts, lse, query_start_loc, out, num_splits, num_heads, *out.stride()[:2],
            HEAD_DIM=head_dim, SPLITS_PAD=MAX_SPLITS,
        )


def _launch_prefill(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out, qk_scale, window,
                    softcap):
    num_seqs, (num_tokens, num_heads, head_dim), num_kv_heads = seq_lens.shape[0], query.shape, k_cache.shape[2]
    group = num_heads // num_kv_heads
    block_m = max(PREFILL_CONFIG["BLOCK_M"], triton.next_power_of_2(group))
    block_q = block_m // group
    _prefill_kernel[(num_tokens // block_q + num_seqs, num_kv_heads)](
        query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, out,
        qk_scale, (softcap or 0.0) * LOG2E, window or 0, num_seqs,
        *query.stride()[:2], *out.stride()[:2], *k_cache.stride()[:3], block_tables.stride(0),
        GROUP=group, HEAD_DIM=head_dim, PAGE=k_cache.shape[1], BLOCK_M=block_m, BLOCK_Q=block_q,
        BLOCK_N=PREFILL_CONFIG["BLOCK_N"], HAS_WINDOW=window is not None, HAS_SOFTCAP=softcap is not None,
        DOT_PRECISION=_dot_precision(query), UPCAST=_upcast_dots(query),
        num_warps=PREFILL_CONFIG["num_warps"], num_stages=PREFILL_CONFIG["num_stages"],
    )


def _max_visible_tokens(block_tables, k_cache, window):
    # Host-side bound on any sequence's visible keys: no sync on seq_lens.
    bound = block_tables.shape[1] * k_cache.shape[1]
    return bound if window is None else min(bound, window + k_cache.shape[1])


def _num_splits(num_programs: int, max_visible_tokens: int, device: torch.device) -> int:
    """Enough splits to give each multiprocessor about four programs, in powers of two."""
    wanted = triton.next_power_of_2(triton.cdiv(4 * _num_sms(device), num_programs))
    useful = max(1, max_visible_tokens // MIN_SPLIT_TOKENS)
    return max(1, min(wanted, 1 << (useful.bit_length() - 1), MAX_SPLITS))


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 2  # the interpreter: a small count still exercises split-K at test sizes


def _dot_precision(query: torch.Tensor) -> str | None:
    return "ieee" if query.dtype == torch.float32 else None  # float32 in, float32 products


def _upcast_dots(query: torch.Tensor) -> bool:
    return query.dtype == torch.bfloat16 and type(_decode_kernel).__name__ == "InterpretedFunction"


def check_head_dim(head_dim: int) -> None:
    if head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim {head_dim} is not a power of two >= 16")


def _check_rows(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.stride(-1) != 1:
            raise ValueError("the last (head_dim) axis of every tensor must be contiguous")
