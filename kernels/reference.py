"""Torch reference for paged attention: the oracle for the Triton kernels, and the CPU path."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def write_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [N, B, Hkv, D]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    """Scatter the new tokens' keys and values into their cache slots; a negative slot is skipped
    (the padding rows of a captured decode step, engine/cuda_graphs.py)."""
    num_blocks, block_size = k_cache.shape[:2]
    if slot_mapping.numel() and int(slot_mapping.min()) < 0:
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slot_mapping] = key.to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slot_mapping] = value.to(v_cache.dtype)


def first_visible_position(seq_len: int, q_len: int, window: int | None) -> int:
    """The oldest key position any of the last q_len queries can see."""
    if window is None:
        return 0
    return max(0, seq_len - q_len - window + 1)


def _gather_context(cache, table, first_block, num_blocks):
    # cache: [N, B, Hkv, D]; -> [num_blocks * B, Hkv, D]
    ids = table[first_block : first_block + num_blocks].long()
    return cache[ids].flatten(0, 1)


def _sdpa(q, k, v, visible, scale, softcap, causal=False):
    """q: [b, H, Tq, D], k/v: [b, Hkv, Tk, D], visible: broadcastable to [b, H, Tq, Tk]; float32.

    Without softcap, torch's fused scaled_dot_product_attention (grouped-query aware). With it,
    the scores are capped as Gemma 2 computes them (softcap * tanh(scores / softcap), before
    the mask), which the fused call cannot express. causal (no softcap): the mask is the plain causal
    one of Tq == Tk positions and `visible` is None; the fused call takes is_causal, so that torch's
    flash kernel skips the key blocks no query sees (1.7x at 1,024 tokens, the same bits as the mask)."""
    if softcap is None:
        gqa = q.shape[1] != k.shape[1]
        if causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=gqa)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = softcap * torch.tanh(q @ k.transpose(-1, -2) * (scale / softcap))
    return scores.masked_fill(~visible, float("-inf")).softmax(-1) @ v


def _attend(q, k, v, q_pos, k_pos, window, scale, softcap):
    # q: [Tq, H, D], k/v: [Tk, Hkv, D]; positions are absolute token positions. Attention in
    # float32 with the causal + window mask; every query sees at least its own key, so no row
    # is fully masked.
    # The queries at the same positions as the keys (a whole sequence in one chunk), with a window (if any) that
    # cuts none of it: the mask is the plain causal one, which torch builds itself (causal, unless softcap).
    causal = q.shape[0] == k.shape[0] and (window is None or window >= k.shape[0]) and softcap is None
    visible = None
    if not causal:
        visible = k_pos[None, :] <= q_pos[:, None]  # [Tq, Tk]
        if window is not None:
            visible &= k_pos[None, :] > q_pos[:, None] - window
    # A batch dimension matters: unbatched inputs take torch's slow math path on CPU.
    out = _sdpa(
        q.float().transpose(0, 1)[None], k.float().transpose(0, 1)[None], v.float().transpose(0, 1)[None],
        visible, scale, softcap, causal,
    )  # [1, H, Tq, D]
    return out[0].transpose(0, 1)


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
    max_query_len: int | None = None,  # a hint for the kernels' choice; unused here
    softcap: float | None = None,  # Gemma 2's attention logit soft-capping; None: off
) -> torch.Tensor:
    """Varlen attention of each sequence's new queries over its paged context.

    Covers decode (every q_len is 1) and chunked prefill with the same rule. Only blocks
    that hold a visible position are gathered, so freed blocks are never read.
    """
    return attend_step(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, out, softcap,
                       _decode)


def attend_step(query, k_cache, v_cache, block_tables, seq_lens, query_start_loc, scale, window, out, softcap,
                decode) -> torch.Tensor:
    """paged_attention's rule, the one-query sequences attended by `decode(query [S, H, D], k_cache, v_cache,
    block_tables, seq_lens, scale, window, softcap) -> [S, H, D]` (this module's buckets, or the C kernel of
    kernels/cpu_attn.py) and the prefill chunks one sequence at a time."""
    if out is None:
        out = torch.empty_like(query)
    if query.shape[0] == seq_lens.shape[0]:  # every sequence has one query: batched decode
        out.copy_(decode(query, k_cache, v_cache, block_tables, seq_lens, scale, window, softcap))
        return out
    # A mixed step: the one-query sequences still go through batched decode (for the reference, one
    # fused call per bucket), so only the prefill chunks are attended one sequence at a time.
    q_lens = query_start_loc[1:] - query_start_loc[:-1]
    single = (q_lens == 1).nonzero().squeeze(1)
    if single.numel():
        rows = query_start_loc[single].long()
        decoded = decode(query[rows], k_cache, v_cache, block_tables[single], seq_lens[single], scale, window,
                         softcap)
        out[rows] = decoded.to(out.dtype)
    block_size = k_cache.shape[1]
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    for i in (q_lens > 1).nonzero().squeeze(1).tolist():
        seq_len, q_start, q_end = lens[i], starts[i], starts[i + 1]
        q_len = q_end - q_start
        first = first_visible_position(seq_len, q_len, window)
        first_block = first // block_size
        num_blocks = (seq_len + block_size - 1) // block_size - first_block
        k = _gather_context(k_cache, block_tables[i], first_block, num_blocks)
        v = _gather_context(v_cache, block_tables[i], first_block, num_blocks)
        base = first_block * block_size
        k, v = k[: seq_len - base], v[: seq_len - base]
        k_pos = torch.arange(base, seq_len, device=query.device)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        out[q_start:q_end] = _attend(query[q_start:q_end], k, v, q_pos, k_pos, window, scale, softcap).to(out.dtype)
    return out


def _decode(query, k_cache, v_cache, block_tables, seq_lens, scale, window, softcap=None):
    """All sequences, in buckets of similar context length (little padding), each bucket one fused
    scaled_dot_product_attention over the blocks its sequences' windows can see."""
    num_seqs, heads, dim = query.shape
    out = torch.empty(num_seqs, heads, dim, dtype=torch.float32, device=query.device)
    for part in _decode_plan(block_tables, seq_lens, window, k_cache.shape[1]):
        k = _gather_rows(k_cache, part.ids, 0, part.invalid_rows, part.length)  # [b, Hkv, L, D], reused memory
        v = _gather_rows(v_cache, part.ids, 1, part.invalid_rows, part.length)
        o = _sdpa(query[part.seqs, :, None, :].float(), k.float(), v.float(), part.visible, scale, softcap)
        # [b, H, 1, D]
        out[part.seqs] = o[:, :, 0, :]
    return out


@dataclass(frozen=True)
class _Bucket:
    """One fused decode call: which sequences, which cache blocks, which gathered rows are visible."""

    seqs: torch.Tensor  # [b] int64
    ids: torch.Tensor  # [b * W] int64: the cache blocks gathered, W per sequence
    length: int  # L = W * block_size, the gathered positions per sequence
    invalid_rows: torch.Tensor  # [n] int64: rows of the [b * L] gather that are padding or unwritten
    visible: torch.Tensor  # [b, 1, 1, L] bool: the attention mask


def _decode_plan(block_tables, seq_lens, window, block_size) -> list[_Bucket]:
    """The buckets of a decode call. Every layer of a step attends with the same tables, lengths and
    window, so the plan is kept per thread and window and reused while the tables and lengths hold the
    same values (compared, not trusted by identity: the caller may refill a tensor in place)."""
    plans = getattr(_scratch, "plans", None)
    if plans is None:
        plans = _scratch.plans = {}
    key = (window, block_size, block_tables.device, torch.is_inference_mode_enabled())
    kept = plans.get(key)
    if kept is not None and torch.equal(kept[0], block_tables) and torch.equal(kept[1], seq_lens):
        return kept[2]
    plan = _make_plan(block_tables, seq_lens, window, block_size)
    plans[key] = (block_tables.clone(), seq_lens.clone(), plan)
    return plan


def _make_plan(block_tables, seq_lens, window, block_size) -> list[_Bucket]:
    lens = seq_lens.long()
    first = torch.zeros_like(lens) if window is None else (lens - window).clamp(min=0)
    first_block = first // block_size
    num_blocks = (lens + block_size - 1) // block_size - first_block
    plan = []
    for seqs in _buckets(num_blocks):
        width = int(num_blocks[seqs].max())
        logical = (first_block[seqs, None] + torch.arange(width)[None, :]).clamp(max=block_tables.shape[1] - 1)
        ids = block_tables[seqs].long().gather(1, logical).flatten()  # [b * W]
        pos = first_block[seqs, None] * block_size + torch.arange(width * block_size)[None, :]  # [b, L]
        valid = (pos < lens[seqs, None]) & (pos >= first[seqs, None])
        invalid_rows = (~valid).view(-1).nonzero().squeeze(1)
        plan.append(_Bucket(seqs, ids, width * block_size, invalid_rows, valid[:, None, None, :]))
    return plan


MAX_PADDING = 1.25  # a bucket's padded size over its sequences' own blocks


def _buckets(num_blocks: torch.Tensor) -> list[torch.Tensor]:
    """Sequence indices grouped by visible block count, so that padding each group to its widest
    member adds at most MAX_PADDING - 1 of work."""
    order = torch.argsort(num_blocks)
    counts = num_blocks[order].tolist()
    groups, start, total = [], 0, 0
    for end, n in enumerate(counts):
        if end > start and n * (end + 1 - start) > MAX_PADDING * (total + n):
            groups.append(order[start:end])
            start, total = end, 0
        total += n
    groups.append(order[start:])
    return groups


_scratch = threading.local()  # per thread: the engine's worker reuses its gather buffers every step


def _gather_rows(cache, ids, which: int, invalid_rows, length: int):
    """cache[ids] as [b, Hkv, L, D] (a strided view) in memory reused across calls: a fresh
    tensor this size costs more in page faults than the copy itself. The `invalid_rows` of the
    [b * L] positions (padding, slots not yet written) are zeroed so that nothing unwritten reaches
    the softmax."""
    num_blocks, block_size, kv_heads, dim = cache.shape
    row = block_size * kv_heads * dim
    key = (which, cache.dtype, cache.device, torch.is_inference_mode_enabled())  # an inference tensor is read-only outside it
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    buf = buffers.get(key)
    if buf is None or buf.shape[0] < ids.numel() or buf.shape[1] != row:
        buf = buffers[key] = torch.empty(ids.numel(), row, dtype=cache.dtype, device=cache.device)
    rows = torch.index_select(cache.view(num_blocks, row), 0, ids, out=buf[: ids.numel()])
    b = ids.numel() * block_size // length
    rows.view(b * length, kv_heads * dim).index_fill_(0, invalid_rows, 0)
    return rows.view(b, length, kv_heads, dim).transpose(1, 2)
