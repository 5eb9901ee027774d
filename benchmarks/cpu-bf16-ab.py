"""Issue 53: bfloat16 on the CPU C path, side by side in one process, with the floors.

1. Linear layers (random-qwen2-100m's shapes) at a decode step's rows and a prefill chunk's: rill's C kernel
   over float32 weights, over bfloat16 weights (kernels/cpu_linear_bf16.c), and torch's bfloat16 F.linear
   (what a bfloat16 model ran before), calls alternating, each weight in enough copies that every call reads
   it from memory. Floors: the weight's bytes at the measured read bandwidth (a sum over a 256 MB buffer),
   and its multiply-adds at the measured peak of the instruction the path uses (FP32 FMA for AVX2 and
   plain C, vdpbf16ps for AVX-512 BF16: a small C loop compiled here, sixteen independent chains).
2. Decode steps of two engines on random-qwen2-100m, float32 and bfloat16, alternating step by step, B
   sequences of PROMPT tokens.

    THREADS=2 B=8 ROUNDS=20 .venv/bin/python benchmarks/cpu-bf16-ab.py [out.json]
"""
import ctypes, json, os, random, statistics, subprocess, sys, tempfile, time
from pathlib import Path

import torch
import torch.nn.functional as F

THREADS = int(os.environ.get("THREADS", "2"))
torch.set_num_threads(THREADS)
from rill.kernels import cpu_build, cpu_linear  # noqa: E402

SHAPES = {"qkv": (1280, 768), "o": (768, 768), "gate_up": (4096, 768), "down": (768, 2048), "lm_head": (32000, 768)}
ROWS = [int(r) for r in os.environ.get("ROWS", "1 8 64 512").split()]
COPIES_BYTES, REPEATS = 96 << 20, int(os.environ.get("REPEATS", "5"))

PEAK_C = r"""
#include <immintrin.h>
#include <stdint.h>
/* multiply-adds per second of one core: 16 independent chains (a Zen 5 issues two FMAs or vdpbf16ps a cycle
   at a latency of several cycles: 8 chains measured it at a third of its peak), n loops */
double fma_loop(int64_t n) {
    __m256 a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm256_set1_ps(1.0f);
    const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
    for (int64_t i = 0; i < n; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm256_fmadd_ps(a[j], x, y);
    float t[8], s = 0;
    for (int j = 0; j < 16; j++) { _mm256_storeu_ps(t, a[j]); s += t[0]; }
    return s;
}
#ifdef __AVX512BF16__
double dp_loop(int64_t n) {
    __m512 a[16];
    for (int j = 0; j < 16; j++) a[j] = _mm512_setzero_ps();
    const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    for (int64_t i = 0; i < n; i++)
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) a[j] = _mm512_dpbf16_ps(a[j], x, x);
    float s = 0;
    for (int j = 0; j < 16; j++) s += _mm512_reduce_add_ps(a[j]);
    return s;
}
#endif
"""


def peaks() -> dict:
    """Multiply-adds per second of all THREADS cores: FP32 FMA (AVX2), and vdpbf16ps where the CPU has it."""
    src = Path(tempfile.mkdtemp()) / "peak.c"
    src.write_text(PEAK_C)
    subprocess.run(["cc", "-O2", "-march=native", "-shared", "-fPIC", str(src), "-o", str(src.with_suffix(".so"))],
                   check=True)
    lib = ctypes.CDLL(str(src.with_suffix(".so")))
    out = {}
    for name, macs in (("fma_loop", 16 * 8), ("dp_loop", 16 * 32)):  # per iteration: 16 instructions x lanes x (1 or 2)
        if not hasattr(lib, name):
            continue
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = ctypes.c_double, [ctypes.c_int64]
        n = 20_000_000
        best = min(_timed(lambda: fn(n)) for _ in range(3))
        out[name] = macs * n / best * THREADS  # one core measured; the cores are alike
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def read_bandwidth() -> float:
    buf = torch.ones(64 << 20)  # 256 MB
    best = min(_timed(buf.sum) for _ in range(5))
    return buf.numel() * 4 / best


def linear_rows(bw: float, peak: dict) -> list[dict]:
    gen, rows = torch.Generator().manual_seed(0), []
    dp = cpu_build.bf16_path() == "avx512_bf16"
    bf16_peak = peak.get("dp_loop") if dp else peak["fma_loop"]
    for layer, (n, k) in SHAPES.items():
        copies = max(1, COPIES_BYTES // (n * k * 4))
        weights = [torch.randn(n, k, generator=gen) / k**0.5 for _ in range(copies)]
        sides = {"c_f32": [cpu_linear.pack(w) for w in weights],
                 "c_bf16": [cpu_linear.pack(w.bfloat16()) for w in weights],
                 "torch_bf16": [w.bfloat16() for w in weights]}
        del weights
        for m in ROWS:
            if layer == "lm_head" and m > 64:
                continue
            x = torch.randn(m, k, generator=gen)
            xb = x.bfloat16()
            calls = {"c_f32": lambda p: cpu_linear.linear(x, p), "c_bf16": lambda p: cpu_linear.linear(xb, p),
                     "torch_bf16": lambda w: F.linear(xb, w)}
            times = {s: [] for s in sides}
            for rep in range(REPEATS):
                for i in range(copies):
                    for s in (sides if rep % 2 else reversed(list(sides))):
                        times[s].append(_timed(lambda: calls[s](sides[s][i])))
            row = {"layer": layer, "rows": m, **{f"{s}_ms": statistics.median(t) * 1e3 for s, t in times.items()}}
            row["read_floor_bf16_ms"] = n * k * 2 / bw * 1e3
            row["read_floor_f32_ms"] = n * k * 4 / bw * 1e3
            row["mac_floor_bf16_ms"] = m * n * k / bf16_peak * 1e3
            row["mac_floor_f32_ms"] = m * n * k / peak["fma_loop"] * 1e3
            rows.append(row)
            print(f"{layer:8s} {m:5d} rows: C f32 {row['c_f32_ms']:7.3f}  C bf16 {row['c_bf16_ms']:7.3f}  torch bf16 "
                  f"{row['torch_bf16_ms']:7.3f} ms | bf16 vs f32 {row['c_f32_ms'] / row['c_bf16_ms']:.2f}x, vs torch "
                  f"{row['torch_bf16_ms'] / row['c_bf16_ms']:.2f}x | bf16 floor "
                  f"{max(row['read_floor_bf16_ms'], row['mac_floor_bf16_ms']):.3f} ms "
                  f"({max(row['read_floor_bf16_ms'], row['mac_floor_bf16_ms']) / row['c_bf16_ms']:.0%} of it)", flush=True)
    return rows


def engine_steps() -> dict:
    from rill.bench.common import resolve_model
    from rill.config import EngineConfig
    from rill.engine.core import EngineCore
    from rill.sampling_params import SamplingParams

    model = resolve_model("random-qwen2-100m")
    b, prompt, rounds = int(os.environ.get("B", "8")), int(os.environ.get("PROMPT", "256")), int(os.environ.get("ROUNDS", "20"))
    cores = {d: EngineCore(EngineConfig(model=model, dtype=d, seed=0, max_num_seqs=64, max_num_batched_tokens=2048))
             for d in ("float32", "bfloat16")}
    for core in cores.values():
        rng = random.Random(0)
        for i in range(b):
            core.add_request(f"r{i}", [rng.randrange(3, 32000) for _ in range(prompt)],
                             SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True))
        while any(s.num_computed_tokens < prompt for s in core.scheduler.running) or core.scheduler.waiting:
            core.step()
    times = {d: [] for d in cores}
    for r in range(rounds):
        for d in (cores if r % 2 else reversed(list(cores))):
            times[d].append(_timed(cores[d].step))
    p50 = {d: statistics.median(t) * 1e3 for d, t in times.items()}
    print(f"decode step, B={b}, prompt {prompt}: float32 p50 {p50['float32']:.1f} ms, bfloat16 p50 "
          f"{p50['bfloat16']:.1f} ms ({p50['float32'] / p50['bfloat16']:.2f}x)", flush=True)
    return {"B": b, "prompt": prompt, "rounds": rounds, "p50_ms": p50}


def main() -> None:
    print(f"bfloat16 path: {cpu_build.bf16_path()}, {THREADS} threads", flush=True)
    bw, peak = read_bandwidth(), peaks()
    print(f"read bandwidth {bw / 1e9:.1f} GB/s; peak multiply-adds/s: "
          + ", ".join(f"{k} {v / 1e9:.0f} G" for k, v in peak.items()), flush=True)
    result = {"bf16_path": cpu_build.bf16_path(), "threads": THREADS, "read_bytes_per_s": bw, "peak_macs_per_s": peak,
              "linear": linear_rows(bw, peak), "engine": engine_steps() if os.environ.get("ENGINE", "1") == "1" else None}
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
