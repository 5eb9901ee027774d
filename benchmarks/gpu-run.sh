#!/usr/bin/env bash
# Issue 32 on a lent CUDA GPU, one call per phase (the device tool; BENCHMARKS.md "GPU figures").
#
#   bash benchmarks/gpu-run.sh 1   correctness (kernels, parity at realistic width, engine eager and
#                                     with CUDA graphs), the kernel benchmark, throughput against transformers
#   bash benchmarks/gpu-run.sh 2   what phase 1 did not finish: serve at 64 and 256 clients, the kernel
#                                     sweeps, the failing tests again
#   3, 4, 5                           Gemma's fixes again; serve in its own process; the in-process serve's log
#   bash benchmarks/gpu-run.sh 6   speech (rill bench transcribe) and vision (rill bench vision) on CUDA
#   bash benchmarks/gpu-run.sh 7   rill serve at 64 and 256 clients with --stream-interval 1, 4, 16
#   bash benchmarks/gpu-run.sh 8   the kernel sweeps alone
#   bash benchmarks/gpu-run.sh 10  rill serve with and without CUDA graphs, each in its own process
#   bash benchmarks/gpu-run.sh 9   speech admission groups 1 and 4 on CUDA; the new prefill tiles checked and timed
#   bash benchmarks/gpu-run.sh 11  the eager server's closed connections: before and after the compile fix (the
#                                     kernels compiled while serving listed); py-spy on the graphs server at 256
#   bash benchmarks/gpu-run.sh 12  256 clients from 1, 2 and 4 client processes (graphs), and eager from 4
#   bash benchmarks/gpu-run.sh 13  issue 55: rill bench roofline (graphs, batch 64/256), the families never run on
#                                     CUDA + the kernel tests, prefill attention vs flash SDPA, then eager and batch 1
#                                     (RILL_GPU_DRY=1 runs its steps on a CPU at tiny shapes: see the phase)
#
# The machine has torch, triton and transformers but not rill's other dependencies: they travel as
# wheels in .whl/ (carry it; see /work/.library/device/README.md), and rill itself is copied into
# /tmp/site with kernels/ and transports/ in place. Every step has its own time limit; logs and JSON go
# to $OUT/results.tar.gz and a summary is printed last.
set -u
PHASE=${1:-1}
OUT=${OUT:-/tmp/gpu-out}
R=/tmp/gpu-results
mkdir -p "$R" "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
export RILL_BENCH_CACHE=/tmp/rill-bench-cache
T0=$(date +%s)
stamp() { echo "[$(($(date +%s) - T0))s] $*"; }
DEADLINE=$((T0 + ${BUDGET:-420}))  # seconds for the whole call; steps are cut to fit, or skipped
step() {  # step NAME SECONDS CMD...: run with a limit, log to $R/NAME.log, note the exit status
    local name=$1 secs=$2 left=$((DEADLINE - $(date +%s) - 15))
    shift 2
    [ "$left" -lt "$secs" ] && secs=$left
    if [ "$secs" -lt 10 ]; then echo "$name skipped: out of time" >>"$R/status.txt"; return; fi
    stamp "start $name"
    timeout -k 5 "$secs" "$@" >"$R/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc ($(($(date +%s) - T0))s)" >>"$R/status.txt"
    stamp "end $name rc=$rc"
}
finish() {
    tar -czf "$OUT/results.tar.gz" -C "$R" . 2>/dev/null
    echo "== status"; cat "$R/status.txt"
    for f in "$R"/*.log; do
        echo "== $(basename "$f") (tail)"
        grep -E "passed|failed|error|Error|FAILED|rc=|tok|speedup|GB/s|%copy" "$f" | tail -n 12
    done
    [ -f "$R/table.txt" ] && cat "$R/table.txt"
}
trap finish EXIT

if [ -z "${RILL_GPU_DRY:-}" ]; then  # a dry run (phase 13 on a CPU) uses the checkout's own environment
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$R/install.log" 2>&1 || { cat "$R/install.log"; exit 1; }
mkdir -p /tmp/site/rill && cp -r src/rill/. /tmp/site/rill/ && cp -r kernels/. /tmp/site/rill/kernels/ \
    && cp -r transports/. /tmp/site/rill/transports/
export PYTHONPATH=/tmp/site
fi
{
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
    python3 -c "import sys, torch, triton, transformers; print(sys.version.split()[0], torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"
    python3 -c "import rill, rill.kernels, rill.transports, rill.engine.core; print('rill imports ok')"
} >"$R/env.log" 2>&1
cat "$R/env.log"

TPUT_ARGS=(--model random-qwen2-0.5b --device cuda --dtype bfloat16 --num-requests 256 --max-num-seqs 64
           --hf-batch-size 64 --no-progress)
PYTEST=(python3 -m pytest -q -p no:cacheprovider -o addopts= --timeout 300)

if [ "$PHASE" = 1 ]; then
    # correctness, in parallel (16 cores compile the Triton kernels; the GPU has room for all)
    step kernels 200 "${PYTEST[@]}" tests/test_kernels.py -n 6 &
    step parity 200 env RILL_GPU_REPORT="$R/parity.jsonl" "${PYTEST[@]}" tests/test_cuda.py -n 3 &
    step engine 200 env RILL_TEST_DEVICE=cuda "${PYTEST[@]}" tests/test_engine.py tests/test_cuda_graphs.py -n 3 &
    step engine-graphs 200 env RILL_TEST_DEVICE=cuda RILL_TEST_CUDA_GRAPHS=1 "${PYTEST[@]}" tests/test_engine.py -n 2 &
    step model 200 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))" &
    wait
    # timings, one at a time
    step kbench 100 python3 kernels/bench.py --no-sweep --out "$R"
    tail -n 16 "$R/kbench.log" >"$R/table.txt"
    step tput-graphs 120 python3 -m rill bench throughput "${TPUT_ARGS[@]}" --skip-hf --cuda-graphs --json "$R/tput-graphs.json"
    step tput 200 python3 -m rill bench throughput "${TPUT_ARGS[@]}" --json "$R/tput.json"
elif [ "$PHASE" = 4 ]; then
    # the server in a process of its own, so that its log is kept; rill's own h11/httpx/anyio versions
    { ulimit -n; sysctl net.core.somaxconn 2>/dev/null; } >"$R/limits.log" 2>&1
    step model 100 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))"
    MODEL=$(tail -n 1 "$R/model.log")
    python3 -m rill serve --model "$MODEL" --device cuda --dtype bfloat16 --cuda-graphs --host 127.0.0.1 --port 8765 \
        --log-level info >"$R/server.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 120); do curl -sf http://127.0.0.1:8765/v1/models >/dev/null && break; sleep 1; done
    stamp "server up"
    step serve-graphs 110 python3 -m rill bench serve --url http://127.0.0.1:8765 --concurrency 8,64,256 \
        --requests-per-client 2 --prompt-tokens 128 --max-tokens 64 --no-progress --json "$R/serve-graphs.json"
    kill "$SERVER"; wait "$SERVER"
    tail -n 5 "$R/serve-graphs.log" >"$R/table.txt"
elif [ "$PHASE" = 5 ]; then
    # why the in-process server of phase 3 reset its connections: the same run with rill's log on
    step model 100 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))"
    step serve-inproc 90 python3 -c "
import logging, sys
logging.basicConfig(level=logging.INFO, format='%(asctime)s %(levelname)s %(name)s: %(message)s')
from rill.cli import main
sys.exit(main(sys.argv[1:]))" bench serve --model random-qwen2-0.5b --device cuda --dtype bfloat16 \
        --concurrency 64 --requests-per-client 1 --prompt-tokens 128 --max-tokens 16 --no-progress --json "$R/serve-inproc.json"
    grep -v "^ *[|+]" "$R/serve-inproc.log" | grep -v "status=200" | tail -n 40 >"$R/table.txt"
elif [ "$PHASE" = 6 ]; then
    # speech and vision on CUDA. .gpu-carry/ (carry it) holds a Whisper-shaped speech model and the audio set,
    # made on a machine with espeak-ng: `rill bench transcribe --model M --n 64 --cache-dir .gpu-carry/bench-cache`
    step transcribe 150 python3 -m rill bench transcribe --model .gpu-carry/speech-model --n 64 --concurrency 16 \
        --cache-dir .gpu-carry/bench-cache --device cuda --dtype float32 --no-progress --json "$R/transcribe.json"
    step vision 150 python3 -m rill bench vision --device cuda --dtype bfloat16 --skip-http --no-progress \
        --json "$R/vision.json"
    : >"$R/table.txt"
    for f in transcribe vision; do tail -n 12 "$R/$f.log" >>"$R/table.txt"; done
elif [ "$PHASE" = 7 ]; then
    # rill serve over HTTP at 256 clients with --stream-interval 1, 4 and 16 (the server was the limit at 1)
    step model 100 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))"
    MODEL=$(tail -n 1 "$R/model.log")
    : >"$R/table.txt"
    for n in 1 4 16; do
        python3 -m rill serve --model "$MODEL" --device cuda --dtype bfloat16 --cuda-graphs --stream-interval $n \
            --host 127.0.0.1 --port 8765 --log-level info >"$R/server-$n.log" 2>&1 &
        SERVER=$!
        for _ in $(seq 120); do curl -sf http://127.0.0.1:8765/v1/models >/dev/null && break; sleep 1; done
        step serve-si$n 45 python3 -m rill bench serve --url http://127.0.0.1:8765 --concurrency 64,256 \
            --requests-per-client 2 --prompt-tokens 128 --max-tokens 64 --no-progress --json "$R/serve-si$n.json"
        kill "$SERVER"; wait "$SERVER"
        echo "stream interval $n" >>"$R/table.txt"; grep -h "warm-up" "$R/server-$n.log" >>"$R/table.txt"
        tail -n 4 "$R/serve-si$n.log" >>"$R/table.txt"
    done
elif [ "$PHASE" = 9 ]; then
    # the speech core's grouped admission on CUDA (admit group 1 against the default, 4 of 16 rows), the new
    # prefill tiles: the kernel tests at full size and the kernel benchmark
    for g in 1 4; do
        step transcribe-g$g 100 python3 -m rill bench transcribe --model .gpu-carry/speech-model --n 64 \
            --concurrency 16 --admit-group $g --skip-transformers --skip-http --cache-dir .gpu-carry/bench-cache \
            --device cuda --dtype float32 --no-progress --json "$R/transcribe-g$g.json"
    done
    step kernels 150 "${PYTEST[@]}" tests/test_kernels.py -n 6
    step kbench 100 python3 kernels/bench.py --no-sweep --out "$R"
    : >"$R/table.txt"
    for f in transcribe-g1 transcribe-g4; do grep -A3 "side " "$R/$f.log" >>"$R/table.txt"; done
    tail -n 12 "$R/kbench.log" >>"$R/table.txt"
elif [ "$PHASE" = 10 ]; then
    # rill serve in its own process with CUDA graphs and without, side by side (64 and 256 clients)
    step model 100 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))"
    MODEL=$(tail -n 1 "$R/model.log")
    : >"$R/table.txt"
    # eager first (a cold Triton cache, as a user's first start), then eager with a 60 s keep-alive timeout
    # (if only that one runs clean, a stalled event loop let hypercorn's 5 s timer close waiting connections)
    for mode in eager eager-ka60 graphs; do
        flag=$([ $mode = graphs ] && echo --cuda-graphs)
        [ $mode = eager-ka60 ] && flag="--keep-alive-timeout-s 60"
        # info: the eager server of the first try (2026-11-26) closed connections with nothing at warning level
        python3 -m rill serve --model "$MODEL" --device cuda --dtype bfloat16 $flag --host 127.0.0.1 --port 8765 \
            --log-level info >"$R/server-$mode.log" 2>&1 &
        SERVER=$!
        for _ in $(seq 120); do curl -sf http://127.0.0.1:8765/v1/models >/dev/null && break; sleep 1; done
        step serve-$mode 45 python3 -m rill bench serve --url http://127.0.0.1:8765 --concurrency 64,256 \
            --requests-per-client 2 --prompt-tokens 128 --max-tokens 64 --no-progress --json "$R/serve-$mode.json"
        kill -0 "$SERVER" 2>/dev/null || echo "the $mode server had exited before the kill" >>"$R/table.txt"
        kill "$SERVER"; wait "$SERVER"; echo "$mode server exit status $?" >>"$R/table.txt"
        echo "$mode" >>"$R/table.txt"; tail -n 4 "$R/serve-$mode.log" >>"$R/table.txt"
        grep -v "status=200" "$R/server-$mode.log" | tail -n 20 >>"$R/table.txt"
    done
elif [ "$PHASE" = 11 ]; then
    # Why the eager server of phase 10 closed connections (H100, 2026-11-26), and the 256-client ceiling.
    # Each server starts with a cold Triton cache of its own; the kernel variants compiled after its start
    # (after its warm-up) are listed. old-eager: the kernels and warm-up before the fix (.gpu-carry/old, from
    # 6971b13; carry .gpu-carry), eager with the 5 s keep-alive of that run; eager: the same with the fix;
    # graphs: py-spy samples the server through both levels, then 256 clients come from two processes of 128.
    step model 100 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))"
    MODEL=$(tail -n 1 "$R/model.log")
    cp -r /tmp/site /tmp/site-old && cp .gpu-carry/old/triton_attn.py /tmp/site-old/rill/kernels/ \
        && cp .gpu-carry/old/model_runner.py /tmp/site-old/rill/engine/
    : >"$R/table.txt"
    for mode in old-eager eager graphs; do
        flag="--keep-alive-timeout-s 5"; site=/tmp/site
        [ $mode = graphs ] && flag=--cuda-graphs
        [ $mode = old-eager ] && site=/tmp/site-old
        export TRITON_CACHE_DIR=/tmp/triton-$mode
        PYTHONPATH=$site python3 -m rill serve --model "$MODEL" --device cuda --dtype bfloat16 $flag --host 127.0.0.1 \
            --port 8765 --log-level info >"$R/server-$mode.log" 2>&1 &
        SERVER=$!
        for _ in $(seq 120); do curl -sf http://127.0.0.1:8765/v1/models >/dev/null && break; sleep 1; done
        touch /tmp/marker-$mode
        if [ $mode = graphs ]; then
            /tmp/site/bin/py-spy record --pid "$SERVER" --duration 40 --rate 100 --nonblocking --idle --threads \
                --format raw -o "$R/pyspy-graphs.txt" >"$R/pyspy.log" 2>&1 &
            SPY=$!
        fi
        step serve-$mode 45 python3 -m rill bench serve --url http://127.0.0.1:8765 --concurrency 64,256 \
            --requests-per-client 2 --prompt-tokens 128 --max-tokens 64 --no-progress --json "$R/serve-$mode.json"
        if [ $mode = graphs ]; then
            kill -INT "$SPY" 2>/dev/null; wait "$SPY"
            for i in 1 2; do
                step serve-2x128-$i 45 python3 -m rill bench serve --url http://127.0.0.1:8765 --concurrency 128 \
                    --requests-per-client 2 --prompt-tokens 128 --max-tokens 64 --no-progress --seed $i \
                    --json "$R/serve-2x128-$i.json" &
                CLIENTS[$i]=$!
            done
            wait "${CLIENTS[@]}"  # not a bare wait: the server is a job of this shell too (it cost 5 minutes)
        fi
        kill -0 "$SERVER" 2>/dev/null || echo "the $mode server had exited before the kill" >>"$R/table.txt"
        kill "$SERVER"; wait "$SERVER"; echo "$mode server exit status $?" >>"$R/table.txt"
        echo "$mode" >>"$R/table.txt"; tail -n 3 "$R/serve-$mode.log" >>"$R/table.txt"
        echo "kernel variants compiled at start: $(find /tmp/triton-$mode -name '*.json' ! -name '__grp__*' \
            ! -newer /tmp/marker-$mode | wc -l); after: $(find /tmp/triton-$mode -name '*.json' ! -name '__grp__*' \
            -newer /tmp/marker-$mode -printf '%f ')" >>"$R/table.txt"
        grep -E "warm-up|captured" "$R/server-$mode.log" >>"$R/table.txt"
        grep -v "status=200" "$R/server-$mode.log" | grep -vE "warm-up|captured" | tail -n 8 >>"$R/table.txt"
    done
    for i in 1 2; do tail -n 2 "$R/serve-2x128-$i.log" >>"$R/table.txt"; done
elif [ "$PHASE" = 12 ]; then
    # 256 clients from 1, 2 and 4 client processes (rill bench serve --client-processes) against the graphs
    # server, after a warm-up level; then 64 and 256 clients from 4 processes against the eager server
    step model 100 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))"
    MODEL=$(tail -n 1 "$R/model.log")
    : >"$R/table.txt"
    BENCH=(python3 -m rill bench serve --url http://127.0.0.1:8765 --requests-per-client 2 --prompt-tokens 128
           --max-tokens 64 --no-progress)
    for mode in graphs eager; do
        flag=$([ $mode = graphs ] && echo --cuda-graphs)
        python3 -m rill serve --model "$MODEL" --device cuda --dtype bfloat16 $flag --host 127.0.0.1 --port 8765 \
            >"$R/server-$mode.log" 2>&1 &
        SERVER=$!
        for _ in $(seq 120); do curl -sf http://127.0.0.1:8765/v1/models >/dev/null && break; sleep 1; done
        if [ $mode = graphs ]; then
            step warm 20 "${BENCH[@]}" --concurrency 16
            for n in 1 2 4; do
                step serve-graphs-p$n 35 "${BENCH[@]}" --concurrency 256 --client-processes $n \
                    --json "$R/serve-graphs-p$n.json"
            done
        else
            step serve-eager-p4 40 "${BENCH[@]}" --concurrency 64,256 --client-processes 4 --json "$R/serve-eager-p4.json"
        fi
        kill "$SERVER"; wait "$SERVER"; echo "$mode server exit status $?" >>"$R/table.txt"
    done
    for f in serve-graphs-p1 serve-graphs-p2 serve-graphs-p4 serve-eager-p4; do
        echo "$f" >>"$R/table.txt"; grep -E "^ +[0-9]+ +[0-9]+ " "$R/$f.log" >>"$R/table.txt"
    done
elif [ "$PHASE" = 13 ]; then
    # Issue 55, the most valuable figures first, within BUDGET (420 s: a 15-minute lease can run it twice).
    # Wheels: benchmarks/gpu-wheels.txt (carry .whl). H200 times expected (model: 39-43 s in runs 11 and 12;
    # the rest estimated): model 40 s beside the families 60-90 s; roofline-graphs 40-70 s; kernels 60-120 s;
    # prefill-attn 15-30 s; roofline-eager 30-60 s; roofline-b1 15-30 s.
    # RILL_GPU_DRY=1: the same steps on a CPU at tiny shapes (random-small, float32, no CUDA graphs, kernels
    # through Triton's interpreter), to check the script where no GPU is lent.
    RL=(python3 -m rill bench roofline --model random-qwen2-0.5b --no-progress)
    FAMILIES_ENV=() SHRINK=() GRAPHS=(--cuda-graphs) PAR=(-n 4) KPAR=(-n 6)
    if [ -n "${RILL_GPU_DRY:-}" ]; then
        RL=(python3 -m rill bench roofline --model random-small --no-progress --device cpu --dtype float32)
        SHRINK=(--batch-sizes 4,8 --contexts 64,128 --prefill-tokens 64,128 --steps 2 --warmup 1 --repeats 2
                --copy-mb 16 --matmul-size 128 --profile-cells 1)
        FAMILIES_ENV=(RILL_TEST_DEVICE=cpu TRITON_INTERPRET=1) GRAPHS=() PAR=() KPAR=(-x)
        export TRITON_INTERPRET=1  # prefill-attention.py on the CPU
    fi
    step model 100 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('${RL[6]}'))" &
    step families 120 env "${FAMILIES_ENV[@]}" RILL_GPU_REPORT="$R/families.jsonl" "${PYTEST[@]}" \
        tests/test_cuda_families.py "${PAR[@]}" &
    wait
    # the engine against the roofline at serving's settings (CUDA graphs), the issue's batches, then prefill
    step roofline-graphs 150 "${RL[@]}" "${GRAPHS[@]}" --batch-sizes 64,256 --contexts 1024,2048,4096,8192 \
        --prefill-tokens 1024,4096,8192 --profile-cells 3 "${SHRINK[@]}" --json "$R/roofline-graphs.json"
    step kernels 120 "${PYTEST[@]}" tests/test_kernels.py "${KPAR[@]}"
    step prefill-attn 60 python3 benchmarks/prefill-attention.py --out "$R"
    # the rest: eager (against graphs: the launch gaps) at 1/64/256, and batch 1 with graphs
    step roofline-eager 100 "${RL[@]}" --batch-sizes 1,64,256 --contexts 1024,4096,8192 --prefill-tokens "" \
        --profile-cells 2 "${SHRINK[@]}" --json "$R/roofline-eager.json"
    step roofline-b1 60 "${RL[@]}" "${GRAPHS[@]}" --batch-sizes 1 --contexts 1024,2048,4096,8192 --prefill-tokens "" \
        --profile-cells 1 "${SHRINK[@]}" --json "$R/roofline-b1.json"
    : >"$R/table.txt"
    for f in roofline-graphs roofline-eager roofline-b1; do
        [ -f "$R/$f.log" ] && grep -v -e "^USDT" -e "^wrote" "$R/$f.log" | tail -n 22 >>"$R/table.txt"
    done
    [ -f "$R/prefill-attn.log" ] && grep -A12 "flash/ours" "$R/prefill-attn.log" >>"$R/table.txt"
    for f in families kernels; do [ -f "$R/$f.log" ] && { echo "$f: $(tail -n 1 "$R/$f.log")"; } >>"$R/table.txt"; done
elif [ "$PHASE" = 8 ]; then
    # the kernel sweeps alone (split heuristic, decode tiles, the 24 prefill tile configurations)
    step ksweep 120 python3 kernels/bench.py --out "$R"
    tail -n 30 "$R/ksweep.log" >"$R/table.txt"
elif [ "$PHASE" = 3 ]; then
    step parity 150 env RILL_GPU_REPORT="$R/parity.jsonl" "${PYTEST[@]}" tests/test_cuda.py -n 3 -k gemma &
    step engine 150 env RILL_TEST_DEVICE=cuda "${PYTEST[@]}" tests/test_cuda_graphs.py -n 4 &
    step model 150 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))" &
    wait
    for mode in graphs eager; do
        flag=$([ $mode = graphs ] && echo --cuda-graphs)
        step serve-$mode 100 python3 -m rill bench serve --model random-qwen2-0.5b --device cuda --dtype bfloat16 $flag \
            --concurrency 64,256 --requests-per-client 2 --prompt-tokens 128 --max-tokens 64 --no-progress \
            --json "$R/serve-$mode.json"
    done
    : >"$R/table.txt"
    for mode in graphs eager; do tail -n 4 "$R/serve-$mode.log" >>"$R/table.txt"; done
else
    step kernels 150 "${PYTEST[@]}" tests/test_kernels.py -n 6 &
    step parity 150 env RILL_GPU_REPORT="$R/parity.jsonl" "${PYTEST[@]}" tests/test_cuda.py -n 3 -k gemma &
    step engine 150 env RILL_TEST_DEVICE=cuda "${PYTEST[@]}" tests/test_engine.py tests/test_cuda_graphs.py -n 3 &
    step engine-graphs 150 env RILL_TEST_DEVICE=cuda RILL_TEST_CUDA_GRAPHS=1 "${PYTEST[@]}" tests/test_engine.py -n 2 &
    step model 150 python3 -c "from rill.bench.common import make_random_model_dir as m; print(m('random-qwen2-0.5b'))" &
    wait
    step serve 120 python3 -m rill bench serve --model random-qwen2-0.5b --device cuda --dtype bfloat16 --cuda-graphs \
        --concurrency 64,256 --requests-per-client 2 --prompt-tokens 128 --max-tokens 64 --no-progress --json "$R/serve.json"
    step tput256-graphs 60 python3 -m rill bench throughput "${TPUT_ARGS[@]}" --num-requests 512 --max-num-seqs 256 \
        --skip-hf --cuda-graphs --json "$R/tput256-graphs.json"
    step ksweep 130 python3 kernels/bench.py --out "$R"
    tail -n 20 "$R/ksweep.log" >"$R/table.txt"
fi
