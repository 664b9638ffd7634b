"""Cost of one replay loop iteration at a fixed width: the README sweep's finalists, one device.

The README's question (Llama-3.1-70B on H100 + H200, `coding`) is swept, and its first F finalists
replay 2,000 requests with S slot rows fixed (no growth), `--iterations` loop iterations per call,
on one XLA CPU device. The loop is compiled by a first call; then `--repeat` calls are timed (wall
and process CPU time, which counts XLA's worker threads) and the medians per iteration printed.
The physics step and the scheduler are the shipped ones, so this isolates the loop's own cost from
compilation, lane balance and device count. Compare two versions of the code in the same hour,
alternating runs: the VM's speed drifts by more than the differences measured here.

    python bench/bench_replay_iteration.py                     # 10 finalists x 192 slot rows
    python bench/bench_replay_iteration.py --finalists 1 --slots 64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
os.environ.setdefault("JAXPLAN_SWEEP_DEVICES", "1")

import jax  # noqa: E402

from jaxplan.funnel import run_sweep  # noqa: E402
from jaxplan.funnel.replay_stage import finalist_inputs, physics_step  # noqa: E402
from jaxplan.replay import driver, sample_requests  # noqa: E402
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import print_end, print_start  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finalists", type=int, default=10, help="lanes (the README sweep's first N finalists)")
    parser.add_argument("--slots", type=int, default=192, help="slot rows per lane, fixed")
    parser.add_argument("--iterations", type=int, default=3000, help="loop iterations per timed call")
    parser.add_argument("--repeat", type=int, default=5, help="timed calls; medians reported")
    args = parser.parse_args()
    print_start()
    workload = load_workload("coding")
    result = run_sweep(load_model("llama-3.1-70b"), parse_gpu_list("h100_sxm,h200_sxm"), workload, load_space("default"), top_k=max(args.finalists, 1))
    configs, params = finalist_inputs(result, result.shortlist[: args.finalists])
    requests = sample_requests(workload, 2000, seed=0)
    advance, calls = driver._advance, []

    def timed(*a, **k):
        wall, cpu = time.perf_counter(), time.process_time()
        out = advance(*a, **k)
        jax.block_until_ready(out)
        calls.append((time.perf_counter() - wall, time.process_time() - cpu, driver._host_flags(*out[1:])[0]))
        return out

    driver._advance = timed
    replay = lambda: driver.simulate_trace(configs, requests, workload, physics_step, params, num_slots=args.slots, max_iterations=args.iterations)
    replay()  # compiles
    per_iteration = []
    for _ in range(args.repeat):
        calls.clear()
        replay()
        wall, cpu, ran = calls[-1]
        per_iteration.append((wall / ran * 1e6, cpu / ran * 1e6))
    wall_us = statistics.median(w for w, _ in per_iteration)
    cpu_us = statistics.median(c for _, c in per_iteration)
    print(f"{args.finalists} lanes x {args.slots} slot rows, one device: {wall_us:.0f} us wall, {cpu_us:.0f} us CPU per loop iteration (medians of {args.repeat} calls of {calls[-1][2]:,} iterations)")
    print_end()


if __name__ == "__main__":
    main()
