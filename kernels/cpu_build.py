"""Builds rill's CPU kernels (kernels/cpu_attn.c, kernels/cpu_linear.c, kernels/cpu_glue.c and their
bfloat16 counterparts, kernels/*_bf16.c) once per machine into one library and loads it with ctypes.

The library is compiled with the system's C compiler (`cc`, or $CC) for this CPU (-march=native; or
RILL_CPU_ISA: avx512_bf16, avx512, avx2 or generic, for tests and comparisons of the paths: see ISAS)
and kept under ~/.cache/rill/kernels (or $RILL_CACHE/kernels), named by a hash of the source,
the compiler, the CPU's flags and the build's, so an edit, a new compiler or another machine builds afresh.
Without a compiler, or with RILL_CPU_KERNELS=0, `library()` returns None and the callers keep
torch's paths (the reference decode attention, oneDNN's linear layers, torch's elementwise ops); the
reason is logged once.

Threads: the library's own pool (kernels/cpu_pool.c), not OpenMP: a parallel loop there waits only for the
chunks already claimed, never for a worker thread to arrive, which matters when the server's event loop
and its clients share the cores (see cpu_pool.h). It starts torch.get_num_threads() - 1 workers, which
spin briefly between calls and then sleep. torch's own OpenMP workers spin too, by default, after every
parallel torch op; `rill serve` and `rill bench` therefore set OMP_WAIT_POLICY=PASSIVE (unless it is set)
before torch loads, so that the two pools do not spin against each other on the same cores.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("rill.kernels")

SOURCES = tuple(Path(__file__).with_name(name) for name in (
    "cpu_attn.c", "cpu_linear.c", "cpu_glue.c", "cpu_linear_bf16.c", "cpu_attn_bf16.c", "cpu_glue_bf16.c",
    "cpu_pool.c"))
HEADERS = tuple(Path(__file__).with_name(name) for name in ("cpu_vec.h", "cpu_bf16.h", "cpu_attn_common.h", "cpu_pool.h"))
_FLAGS = ["-O3", "-fopenmp-simd", "-pthread", "-shared", "-fPIC", "-std=gnu11"]
# Instruction sets a build can target (RILL_CPU_ISA, default native: this CPU's own). The others are for
# tests and comparisons: each compiles anywhere, and runs where the CPU has its instructions (ISA_CPU_FLAGS).
ISAS = {
    "native": ["-march=native"],
    "avx512_bf16": ["-march=x86-64-v4", "-mavx512bf16", "-mtune=generic"],  # vdpbf16ps: Zen 4, Cooper Lake+
    "avx512": ["-march=x86-64-v4", "-mtune=generic"],
    "avx2": ["-march=x86-64-v3", "-mtune=generic"],  # AVX2 + FMA
    "generic": ["-march=x86-64", "-mtune=generic"],  # plain C: SSE2 only
}
ISA_CPU_FLAGS = {"native": (), "avx512_bf16": ("avx512f", "avx512bw", "avx512vl", "avx512_bf16"),
                 "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq"), "avx2": ("avx2", "fma"), "generic": ()}
_lock = threading.Lock()
_loaded: list = []  # [library or None] once tried
_why: list[str] = []  # why the library is not in use, once known


def library() -> ctypes.CDLL | None:
    """The compiled library, built on first use; None when it cannot be had (unavailable_reason says why)."""
    if _loaded:
        return _loaded[0]
    with _lock:
        if not _loaded:
            _loaded.append(_try_load())
    return _loaded[0]


def isa() -> str:
    """The build library() loads: RILL_CPU_ISA, else native."""
    name = os.environ.get("RILL_CPU_ISA", "native")
    if name not in ISAS:
        raise ValueError(f"RILL_CPU_ISA={name!r}: expected one of {', '.join(ISAS)}")
    return name


def cpu_has(name: str) -> bool:
    """Whether this CPU runs the instructions of build `name` (ISAS)."""
    flags = set(_cpu_flags().split())
    return all(f in flags for f in ISA_CPU_FLAGS[name])


def load(name: str) -> ctypes.CDLL:
    """The library built for instruction set `name` (ISAS), compiled if need be; raises when it cannot be.
    Only call its functions where cpu_has(name)."""
    lib = ctypes.CDLL(str(_build(name)))
    _declare(lib)
    return lib


def bf16_path() -> str | None:
    """Which bfloat16 kernels the library runs ("avx512_bf16", "avx2", "generic"), None without a library."""
    lib = library()
    return None if lib is None else lib.rill_bf16_path().decode()


@contextmanager
def using(lib: ctypes.CDLL | None) -> Iterator[None]:
    """Within it, library() returns lib (tests and A/B runs compare builds in one process)."""
    library()
    before = _loaded[0]
    _loaded[0] = lib
    try:
        yield
    finally:
        _loaded[0] = before


def unavailable_reason() -> str | None:
    """None when the library is in use; else why CPU decode attention runs the torch reference."""
    library()
    return _why[0] if _why else None


def _try_load() -> ctypes.CDLL | None:
    if os.environ.get("RILL_CPU_KERNELS", "1") == "0":
        _why.append("RILL_CPU_KERNELS=0")
        log.info("RILL_CPU_KERNELS=0: CPU decode attention uses the torch reference, linear layers oneDNN")
        return None
    try:
        lib = load(isa())
    except (OSError, subprocess.SubprocessError, RuntimeError, ValueError) as e:
        _why.append(str(e))
        log.warning("rill's C kernels are unavailable (%s); CPU decode attention uses the torch reference and "
                    "linear layers torch's oneDNN, together about 1.6x slower per decode step at 64 sequences", e)
        return None
    return lib


def _compiler() -> str:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    return cc


def _cache_dir() -> Path:
    root = os.environ.get("RILL_CACHE")
    return (Path(root) if root else Path.home() / ".cache" / "rill") / "kernels"


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")


def _build(name: str = "native") -> Path:
    cc = _compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [path.read_text() for path in (*SOURCES, *HEADERS)]
    flags = [*_FLAGS, *ISAS[name]]
    key = hashlib.sha256("\0".join([*texts, cc, version, _cpu_flags(), *flags]).encode()).hexdigest()
    target = _cache_dir() / f"rill_cpu-{key[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *flags, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True,
                              timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed: {done.stderr.strip()[-500:]}")
        os.replace(tmp, target)  # atomic: another process building the same key gets a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("built rill's C kernels: %s", target)
    return target


def _declare(lib: ctypes.CDLL) -> None:
    i64, f32, ptr = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
    lib.rill_paged_decode_f32.restype = ctypes.c_int
    lib.rill_paged_decode_f32.argtypes = [
        ptr, i64, ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64, i64, i64, f32, f32, ptr, ctypes.c_int,
    ]
    lib.rill_linear_pack_f32.restype = None
    lib.rill_linear_pack_f32.argtypes = [ptr, i64, i64, ptr]
    lib.rill_linear_f32.restype = ctypes.c_int
    lib.rill_linear_f32.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.rill_rms_norm_f32.restype = None
    lib.rill_rms_norm_f32.argtypes = [ptr, ptr, ptr, f32, ptr, i64, i64, ctypes.c_int]
    lib.rill_rotary_kv_f32.restype = None
    lib.rill_rotary_kv_f32.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, ctypes.c_int]
    lib.rill_silu_mul_f32.restype = None
    lib.rill_silu_mul_f32.argtypes = [ptr, i64, i64, ptr, ctypes.c_int]
    if hasattr(lib, "rill_bf16_path"):  # a library built before the bfloat16 kernels (an A/B's OLD) has none
        _declare_bf16(lib)


def _declare_bf16(lib: ctypes.CDLL) -> None:
    i64, f32, ptr, i32 = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int
    lib.rill_bf16_path.restype = ctypes.c_char_p
    lib.rill_bf16_path.argtypes = []
    lib.rill_linear_pack_bf16.restype = None
    lib.rill_linear_pack_bf16.argtypes = [ptr, i64, i64, ptr]
    lib.rill_linear_bf16.restype = i32
    lib.rill_linear_bf16.argtypes = [ptr, i64, ptr, ptr, ptr, i32, i64, i64, i64, i32]
    lib.rill_paged_decode_bf16.restype = i32
    lib.rill_paged_decode_bf16.argtypes = [
        ptr, i64, ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64, i64, i64, f32, f32, ptr, i32,
    ]
    lib.rill_rms_norm_bf16.restype = None
    lib.rill_rms_norm_bf16.argtypes = [ptr, ptr, ptr, f32, ptr, i64, i64, i32]
    lib.rill_rotary_kv_bf16.restype = None
    lib.rill_rotary_kv_bf16.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ptr, ptr, ptr, ptr, i32]
    lib.rill_silu_mul_bf16.restype = None
    lib.rill_silu_mul_bf16.argtypes = [ptr, i64, i64, ptr, i32]
