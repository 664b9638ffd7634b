#!/usr/bin/env bash
# The sweep and replay benchmarks on an accelerator, as one script with a time limit per step, so that
# a short lease still returns every step that finished. Nothing else in the project needs a GPU.
#
#   bash bench/run_device.sh [OUT_DIR]        # logs in OUT_DIR (default $OUT, else ./bench_device_out)
#
# It runs from the source tree (PYTHONPATH=.) under whatever JAX the machine has, with a GPU or TPU
# backend found by JAX itself. Steps: machine facts; stages 1-6 of the headline grid at the library's
# default chunk for the device, then at four other sizes; the 1e6 -> 1e9 scaling at the default chunk;
# the replay of 1, 20 and 100 finalists; the README's sweep as a user runs it, cold then warm.
# BENCH_DEVICE_STEPS="sweep scaling" runs only those steps.
set -u
cd "$(dirname "$0")/.."
out=${1:-${OUT:-bench_device_out}}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 JAXPLAN_CACHE_DIR=off
python=${PYTHON:-python3}
# Limits in seconds; BENCH_DEVICE_QUICK=1 shrinks every step to check the script on a CPU.
if [ "${BENCH_DEVICE_QUICK:-0}" = 1 ]; then
    chunks=16384,65536 sizes=5,6 finalists="1 4" workloads="coding" requests=500 space=small
else
    chunks=65536,1048576,2097152,16777216 sizes=6,7,8,9 finalists="1 20 100" workloads="coding chat reasoning" requests=0 space=huge
fi

steps=${BENCH_DEVICE_STEPS:-sweep chunks scaling replay first_run}
step() {  # step NAME LIMIT_S COMMAND...: run it, keep its output in $out/NAME.log, print its tail
    local name=$1 limit=$2
    shift 2
    case " $steps " in *" $name "*) ;; *) return ;; esac
    local start=$SECONDS
    timeout "$limit" "$@" >"$out/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$out/$name.log"
    echo "== $name: rc $rc after $((SECONDS - start)) s (limit $limit s)" | tee -a "$out/$name.log"
}

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
    "$python" -c 'import jax, jaxlib; print("JAX", jax.__version__, "jaxlib", jaxlib.__version__, jax.devices())'
} >"$out/facts.log" 2>&1
cat "$out/facts.log"

step sweep 60 "$python" bench/bench_sweep.py --space "$space" --repeat 1
step chunks 120 "$python" bench/bench_sweep.py --space "$space" --chunks "$chunks" --repeat 1
step scaling 120 "$python" bench/bench_sweep.py --scaling --sizes "$sizes" --repeat 1
# shellcheck disable=SC2086  # the lists are meant to split into arguments
step replay 200 "$python" bench/bench_replay.py --finalists $finalists --workloads $workloads --requests "$requests"
step first_run 150 "$python" bench/bench_first_run.py --repeat 1
