"""Benchmark the sensitivity views: jacfwd gradients of the finalists, and the winner map.

Usage:
    python bench/bench_sensitivity.py                  # both, with the defaults below
    python bench/bench_sensitivity.py --skip-map       # gradients only
    python bench/bench_sensitivity.py --map-axes isl=2000:32000:10,rate=1:32:10 --dp-max 64

Gradients: the sweep's top 20 finalists (default space, h100_sxm + h200_sxm, coding) x the 4
workload parameters that apply (ISL, OSL, rate, prefix hit rate), forward mode; compilation is
timed separately (first call), then the median of --repeat calls. Target: < 2 s after compilation.

Winner map: stages 1-4 of the default space with DP 1..--dp-max (64: 1.1e6 candidates) for every
scenario of --map-axes (10 x 10 = 100) plus the current workload, one compiled pass. "compile s"
is the first chunk (compilation + one chunk); "run s" streams the rest; "wall s" is the whole call
including the winners' report rows. Target: < 60 s.

Prints machine facts and the load average at start and end: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jax
import machine

from jaxplan.funnel.sweep import run_sweep
from jaxplan.elasticity import for_rows
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
from jaxplan.winner_map import winner_map


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--gpus", default="h100_sxm,h200_sxm")
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--finalists", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--map-axes", default="isl=2000:32000:10,rate=1:32:10")
    parser.add_argument("--dp-max", type=int, default=64)
    parser.add_argument("--skip-map", action="store_true")
    parser.add_argument("--skip-gradients", action="store_true")
    args = parser.parse_args()
    machine.print_start()
    model, gpus, workload = load_model(args.model), parse_gpu_list(args.gpus), load_workload(args.workload)
    print(f"model {model.name}, GPUs {args.gpus}, workload {workload.name}")
    print("| what | size | compile s | run s | wall s | CPU s (run) | peak RSS GiB | load (1 min) |")
    print("|---|---|---|---|---|---|---|---|")

    if not args.skip_gradients:
        result = run_sweep(model, gpus, workload, load_space("default"), top_k=args.finalists)
        rows = result.shortlist
        t0 = time.perf_counter()
        sens = for_rows(result, rows)
        first = time.perf_counter() - t0
        runs, cpu = [], []
        for _ in range(args.repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            sens = for_rows(result, rows)
            runs.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        run = statistics.median(runs)
        size = f"{len(rows)} finalists x {len(sens.parameters)} parameters x {len(sens.metrics)} metrics"
        print(f"| gradients (jacfwd) | {size} | {first - run:.1f} | {run:.3f} | {first:.1f} (first call) | {statistics.median(cpu):.3f} | {peak_rss_gib():.2f} | {os.getloadavg()[0]:.1f} |", flush=True)

    if not args.skip_map:
        space = load_space("default")
        space = space.replace(data_parallel_size=tuple(d for d in space.data_parallel_size if d <= args.dp_max))
        t0, c0 = time.perf_counter(), time.process_time()
        wmap = winner_map(model, gpus, workload, space, args.map_axes)
        wall, cpu_total = time.perf_counter() - t0, time.process_time() - c0
        scenarios = int(wmap.shape[0] * wmap.shape[1] * wmap.shape[2])
        size = f"{scenarios} scenarios (+ current) x {wmap.num_candidates:,} candidates"
        print(f"| winner map | {size} | {wmap.compile_s:.1f} | {wmap.run_s:.1f} | {wall:.1f} | {cpu_total:.1f} (whole call) | {peak_rss_gib():.2f} | {os.getloadavg()[0]:.1f} |", flush=True)
        labels = {label for label in wmap.labels.ravel() if label}
        print(f"winner map: {len(labels)} distinct winners, {len(wmap.boundaries())} boundary crossings; "
              f"{scenarios * wmap.num_candidates / max(wmap.run_s, 1e-9):.3g} scenario-candidates/s streamed")
    machine.print_end()
    print(f"JAX devices: {jax.device_count()}")


if __name__ == "__main__":
    main()
