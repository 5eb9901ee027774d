"""Builds rill's CPU kernels (kernels/cpu_attn.c, kernels/cpu_linear.c, kernels/cpu_glue.c) once per
machine into one library and loads it with ctypes.

The library is compiled with the system's C compiler (`cc`, or $CC) for this CPU (-march=native)
and kept under ~/.cache/rill/kernels (or $RILL_CACHE/kernels), named by a hash of the source,
the compiler and the CPU's flags, so an edit, a new compiler or another machine builds afresh.
Without a compiler, or with RILL_CPU_KERNELS=0, `library()` returns None and the callers keep
torch's paths (the reference decode attention, oneDNN's linear layers, torch's elementwise ops); the
reason is logged once.

OpenMP: the library links libgomp by its soname, which resolves to the copy torch loaded, so its
parallel regions share torch's thread pool instead of starting a second one.
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
from pathlib import Path

log = logging.getLogger("rill.kernels")

SOURCES = tuple(Path(__file__).with_name(name) for name in ("cpu_attn.c", "cpu_linear.c", "cpu_glue.c"))
HEADERS = (Path(__file__).with_name("cpu_vec.h"),)  # included by the sources: part of the hash
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=gnu11"]
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
        import torch  # noqa: F401  (loads torch's libgomp first, so ours resolves to it)

        lib = ctypes.CDLL(str(_build()))
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        _why.append(str(e))
        log.warning("rill's C kernels are unavailable (%s); CPU decode attention uses the torch reference and "
                    "linear layers torch's oneDNN, together about 1.6x slower per decode step at 64 sequences", e)
        return None
    _declare(lib)
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


def _build() -> Path:
    cc = _compiler()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
    texts = [path.read_text() for path in (*SOURCES, *HEADERS)]
    key = hashlib.sha256("\0".join([*texts, cc, version, _cpu_flags(), *_FLAGS]).encode()).hexdigest()
    target = _cache_dir() / f"rill_cpu-{key[:16]}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([cc, *_FLAGS, *map(str, SOURCES), "-o", tmp, "-lm"], capture_output=True, text=True,
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
