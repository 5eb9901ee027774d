"""The Triton kernels compile for Hopper (sm_90) on any machine: Triton's compiler and its ptxas need no GPU.

Triton's interpreter (tests/test_kernels.py without a GPU) runs the kernels' arithmetic but not the
compiler's rules. On the first H200 lent to rill (2026-11-26) the soft-capped kernels failed to
compile, because they read a plain module global (LOG2E), which the interpreter allows and the
compiler does not. Here each kernel is compiled to a cubin for the configurations its launcher
uses: decode with and without splits, windows and soft caps, in bfloat16 and float32; prefill alike;
the split merge; the KV write.
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="the interpreter compiles nothing")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from rill.kernels import triton_attn  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)
POINTERS = {"block_tables": "*i32", "seq_lens": "*i32", "query_start_loc": "*i32", "slot_mapping": "*i64",
            "part_out": "*fp32", "part_lse": "*fp32"}
FLOATS = {"qk_scale", "cap"}


def compile_kernel(kernel, dtype: str, constexprs: dict):
    """Compile `kernel` for sm_90: tensors of `dtype` ("bf16", "fp32", ...), int32 scalars."""
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = POINTERS[name]
        elif name in FLOATS:
            signature[name] = "fp32"
        elif name in ("query", "key", "value", "k_cache", "v_cache", "out"):
            signature[name] = f"*{dtype}"
        else:
            signature[name] = "i32"
    compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs), target=HOPPER)
    assert compiled.asm["cubin"], "no machine code"
    return compiled


DECODE = [  # (dtype, window, split, softcap)
    ("bf16", True, True, True),
    ("bf16", False, False, False),
    ("fp16", True, False, False),
    ("fp32", True, True, True),
]


@pytest.mark.parametrize("dtype,window,split,softcap", DECODE)
def test_decode_kernel_compiles_for_hopper(dtype, window, split, softcap):
    compile_kernel(triton_attn._decode_kernel, dtype, {
        "GROUP": 4, "GROUP_PAD": 16, "HEAD_DIM": 128, "PAGE": 16, "BLOCK_N": triton_attn.DECODE_CONFIG["BLOCK_N"],
        "HAS_WINDOW": window, "SPLIT": split, "HAS_SOFTCAP": softcap,
        "DOT_PRECISION": "ieee" if dtype == "fp32" else None, "UPCAST": False,
    })


@pytest.mark.parametrize("dtype,window,softcap", [("bf16", True, True), ("fp32", False, False), ("fp16", False, True)])
def test_prefill_kernel_compiles_for_hopper(dtype, window, softcap):
    block_m = triton_attn.PREFILL_CONFIG["BLOCK_M"]
    compile_kernel(triton_attn._prefill_kernel, dtype, {
        "GROUP": 4, "HEAD_DIM": 128, "PAGE": 16, "BLOCK_M": block_m, "BLOCK_Q": block_m // 4,
        "BLOCK_N": triton_attn.PREFILL_CONFIG["BLOCK_N"], "HAS_WINDOW": window, "HAS_SOFTCAP": softcap,
        "DOT_PRECISION": "ieee" if dtype == "fp32" else None, "UPCAST": False,
    })


def test_merge_and_write_kernels_compile_for_hopper():
    compile_kernel(triton_attn._merge_splits_kernel, "bf16", {"HEAD_DIM": 128, "SPLITS_PAD": triton_attn.MAX_SPLITS})
    compile_kernel(triton_attn._write_kv_kernel, "bf16", {"PAGE": 16, "HEAD_DIM": 128, "HEADS_PAD": 8})


def test_a_kernel_reading_a_plain_global_fails_to_compile(monkeypatch):
    """The check can fail: the soft cap reading a plain float, as before the fix, does not compile."""
    monkeypatch.setitem(triton_attn._soft_cap.fn.__globals__, "_LOG2E", triton_attn.LOG2E)
    triton_attn._soft_cap.hash = None  # Triton caches a function's dependencies' hash; make it look again
    with pytest.raises(Exception) as info:
        test_decode_kernel_compiles_for_hopper("bf16", False, False, True)
    causes, error = [], info.value
    while error is not None:  # Triton reports the call site; the NameError is in the chain beneath
        causes.append(str(error))
        error = error.__cause__ or error.__context__
    assert any("global variable _LOG2E" in text for text in causes), causes


def test_the_step_to_step_integers_are_not_specialized():
    """Compiled Triton makes a variant for an int argument equal to 1 or divisible by 16. The split
    count, the prefill's sequence count and the block tables' width change from step to step, so they
    are left out of that: a server then never compiles after its warm-up pass (on an H100 a compile in
    the engine thread stalled the event loop past the keep-alive timeout, 2026-11-26)."""
    kernels = (triton_attn._decode_kernel, triton_attn._merge_splits_kernel, triton_attn._prefill_kernel)
    for name in triton_attn.DYNAMIC_INTS:
        params = [p for k in kernels for p in k.params if p.name == name]
        assert params and all(p.do_not_specialize for p in params), name
