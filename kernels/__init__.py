"""Attention kernels over rill's paged KV cache.

Layout (shared by every backend):
  k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim]
  slot_mapping:     [num_new_tokens] int64, flat slot = block_id * block_size + offset;
                    a negative slot writes nothing (a CUDA graph's padding rows)
  block_tables:     [num_seqs, max_blocks_per_seq] int32, logical block i -> physical id
  seq_lens:         [num_seqs] int32, context length of each sequence after this step
  query_start_loc:  [num_seqs + 1] int32, prefix sums of the query lengths

The queries of sequence i are the last q_len_i positions of its context. A query at
position p attends keys at positions k with max(0, p - window + 1) <= k <= p
(window None: no lower bound), which is Hugging Face's sliding-window rule. With softcap
(Gemma 2) each score is capped as softcap * tanh(score / softcap) before the mask.
Blocks that hold no position any query may see are never read, so the engine can
free them and leave any id in their table slots.

`dispatch` picks the Triton kernels for CUDA tensors; on the CPU, `cpu_attn` runs decode rows in C
(cpu_attn.c, built by cpu_build) over float32 caches and the torch reference for the rest.
"""

from rill.kernels.dispatch import check_head_dim, paged_attention, write_kv

__all__ = ["check_head_dim", "paged_attention", "write_kv"]
