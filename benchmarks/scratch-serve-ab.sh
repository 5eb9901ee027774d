#!/usr/bin/env bash
# Issue 33: rill serve with the scratch buffers (port 18441) against rill serve without them
# (benchmarks/serve-without-scratch.py, port 18442), vLLM's client at rate inf, three rounds alternating.
#   bash benchmarks/scratch-serve-ab.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_DIR=$(.venv/bin/python -c "from rill.bench.common import resolve_model; print(resolve_model('random-qwen2-100m'))")
OUT=${1:-bench-results/scratch-serve-ab}; mkdir -p $OUT
LIMITS=(--max-num-seqs 64 --max-num-batched-tokens 2048 --max-model-len 2048)
COMMON=(--model "$MODEL_DIR" --served-model-name model --host 127.0.0.1 --dtype float32 --kv-cache-gb 2 "${LIMITS[@]}")
OMP_NUM_THREADS=2 .venv/bin/rill serve "${COMMON[@]}" --port 18441 > $OUT/scratch.log 2>&1 & P1=$!
OMP_NUM_THREADS=2 .venv/bin/python benchmarks/serve-without-scratch.py serve "${COMMON[@]}" --port 18442 > $OUT/fresh.log 2>&1 & P2=$!
trap 'kill -INT $P1 $P2 2>/dev/null; sleep 3; kill -KILL $P1 $P2 2>/dev/null || true' EXIT
deadline=$((SECONDS + 600))
for port in 18441 18442; do until curl -sf http://127.0.0.1:$port/v1/models >/dev/null; do
  [ $SECONDS -lt $deadline ] || { echo "no server on $port after 600 s" >&2; exit 1; }; sleep 3; done; done
echo up
client() { ${VLLM_VENV:-/work/vllm-venv}/bin/vllm bench serve --backend openai --endpoint /v1/completions --base-url http://127.0.0.1:$2 \
  --model model --tokenizer "$MODEL_DIR" --dataset-name random --random-input-len 256 --random-output-len 128 --num-prompts 64 \
  --ignore-eos --temperature 0 --request-rate inf --percentile-metrics ttft,tpot,itl --seed $3 > $OUT/$1-$3.log 2>&1
  echo "$1 round $3: $(grep -E 'Output token throughput|Median TPOT|Median TTFT' $OUT/$1-$3.log | tr -s ' ' | tr '\n' ' ')"; }
for r in 1 2 3; do
  if [ $((r % 2)) -eq 1 ]; then client scratch 18441 $r; client fresh 18442 $r; else client fresh 18442 $r; client scratch 18441 $r; fi
done
