"""Benchmark stages 1-6 of the funnel over large grids.

Usage:
    python bench/bench_sweep.py                       # the 1.3e8-candidate headline run
    python bench/bench_sweep.py --scaling             # 1e6 .. 1e8: wall time vs grid size, exponent
    python bench/bench_sweep.py --scaling --sizes 4,5,6,7,8,9   # 1e4 .. 1e9 (1e9: one run, ~2 min)
    python bench/bench_sweep.py --chunks 16384,65536,262144
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python bench/bench_sweep.py

Prints compile time and run time separately, candidates/s and peak RSS; medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import statistics
import time

import jax
from machine import print_end, print_start

from jaxplan.funnel.sweep import run_sweep
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux: KiB


def one(model, gpus, workload, space, chunk, repeat):
    runs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run_sweep(model, gpus, workload, space, chunk_size=chunk)
        runs.append((time.perf_counter() - t0, result.compile_s, result.run_s))
    wall, compile_s, run_s = (statistics.median(x) for x in zip(*runs))
    return result, wall, compile_s, run_s


def row(label, result, wall, compile_s, run_s):
    size = result.grid.size
    print(f"| {label} | {size:.3g} | {compile_s:.1f} | {run_s:.2f} | {wall:.1f} | {size / run_s:.3g} | {peak_rss_gib():.2f} | {result.stages[3].admitted:,} |", flush=True)


def scaled_space(space, target: int, num_gpus: int):
    """Shrink (or grow) the DP axis so the grid holds about `target` candidates; below one DP value's
    worth (~1.2e5 in the 'huge' space), also keep only the first max_num_seqs and budget values."""
    per_dp = space.size(num_gpus) // len(space.data_parallel_size)
    if target >= per_dp:
        return space.replace(data_parallel_size=tuple(range(1, round(target / per_dp) + 1)))
    knobs = len(space.max_num_seqs) * len(space.max_num_batched_tokens)
    keep = max(1, round(math.sqrt(knobs * target / per_dp)))
    return space.replace(data_parallel_size=(1,), max_num_seqs=space.max_num_seqs[:keep], max_num_batched_tokens=space.max_num_batched_tokens[:keep])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--gpus", default="h100_sxm,h200_sxm,b200_sxm,a100_sxm")
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--space", default="huge")
    parser.add_argument("--chunk", type=int, default=None, help="candidates per chunk (default: the library's, 65,536 on a CPU, ~4e6 on a GPU)")
    parser.add_argument("--chunks", default="")
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--sizes", default="6,7,8", help="--scaling: powers of ten of the grid sizes (the exponent is fitted from 1e6 to 1e8)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    model, gpus, workload = load_model(args.model), parse_gpu_list(args.gpus), load_workload(args.workload)
    space = load_space(args.space)
    print_start()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, JAX {jax.__version__}, devices: {jax.device_count()} x {jax.devices()[0].platform}")
    print(f"model {model.name}, GPUs {args.gpus}, workload {workload.name}, space {args.space}; medians of {args.repeat}")
    print("| run | candidates | compile s | run s | wall s | candidates/s | peak RSS GiB | admitted after stage 4 |")
    print("|---|---|---|---|---|---|---|---|")
    if args.scaling:
        measured = {}
        for exponent in (int(e) for e in args.sizes.split(",")):
            sub = scaled_space(space, 10**exponent, len(gpus))
            repeat = 1 if exponent >= 9 else args.repeat  # 1e9 streams for ~100 s
            result, wall, compile_s, run_s = one(model, gpus, workload, sub, args.chunk, repeat)
            row(f"1e{exponent} (chunk {result.chunk_size:,})", result, wall, compile_s, run_s)
            measured[exponent] = (result.grid.size, run_s)
        for lo, hi in ((6, 8), (7, 9), (6, 9)):
            if lo in measured and hi in measured:
                (n0, t0), (n1, t1) = measured[lo], measured[hi]
                print(f"scaling exponent of run time vs grid size (1e{lo} -> 1e{hi}): {(math.log(t1) - math.log(t0)) / (math.log(n1) - math.log(n0)):.3f}")
    elif args.chunks:
        for chunk in (int(c) for c in args.chunks.split(",")):
            row(f"chunk {chunk}", *one(model, gpus, workload, space, chunk, args.repeat))
    else:
        result, wall, compile_s, run_s = one(model, gpus, workload, space, args.chunk, args.repeat)
        row(f"headline (chunk {result.chunk_size:,})", result, wall, compile_s, run_s)
    print_end()


if __name__ == "__main__":
    main()
