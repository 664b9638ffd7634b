"""Benchmark a MoE model's default sweep against a dense model's sweep over a grid of the same size.

Usage:
    python bench/bench_moe_sweep.py                                   # gpt-oss-120b and MiniMax-M2.5 vs Llama-3.1-70B
    python bench/bench_moe_sweep.py --moe kimi-k2.5 --gpus h200_sxm,b200_sxm --repeat 3

The MoE sweep is stages 1-6 (`run_sweep`) of the model's default space (`SearchSpace.for_model`: layout
kinds tp, ep, dp:D and dp_ep:D for D = 2..128, the checkpoint's weight format). The dense sweep is the
same default space for --dense with its data-parallel axis stretched (1..N) until its grid holds as
many candidates as the MoE one (within one DP value's worth). Each sweep runs --repeat times in this
process: the first call compiles ("cold", compilation reported apart), the others reuse the compiled
kernels ("warm"); medians of the warm calls. Issue #35's bar: the MoE sweep within 2x the dense one's
time.

Prints machine facts and the load average at start and end: the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine

from jaxplan.funnel.sweep import run_sweep
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


def timed(model, gpus, workload, space, repeat: int) -> dict:
    """Cold (first call: compile s, stream s, wall s) and warm (median wall of the other calls) of one sweep."""
    walls, first = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run_sweep(model, gpus, workload, space)
        walls.append(time.perf_counter() - t0)
        first = first or result
    return {"size": result.grid.size, "compile_s": first.compile_s, "run_s": first.run_s, "cold_s": walls[0],
            "warm_s": statistics.median(walls[1:]) if len(walls) > 1 else float("nan"), "admitted": result.stages[3].admitted}


def dense_space_of_size(space, target: int, gpus) -> object:
    """`space` with its data-parallel axis 1..N, N chosen so the grid holds about `target` candidates."""
    per_dp = space.size(len(gpus)) // len(space.data_parallel_size)
    return space.replace(data_parallel_size=tuple(range(1, max(1, round(target / per_dp)) + 1)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--moe", default="gpt-oss-120b,minimax-m2.5", help="MoE models, comma-separated")
    parser.add_argument("--dense", default="llama-3.1-70b")
    parser.add_argument("--gpus", default="h100_sxm,h200_sxm")
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--space", default="default")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gpus, workload, base = parse_gpu_list(args.gpus), load_workload(args.workload), load_space(args.space)
    machine.print_start()
    print(f"GPUs {args.gpus}, workload {workload.name}, space {args.space}; cold = first call (compilation apart), warm = median of {args.repeat - 1} more")
    print("| sweep | candidates | compile s | stream s | cold wall s | warm wall s | admitted after stage 4 | warm / dense warm |")
    print("|---|---|---|---|---|---|---|---|")
    dense_model = load_model(args.dense)
    for name in args.moe.split(","):
        model = load_model(name.strip())
        moe = timed(model, gpus, workload, base.for_model(model), args.repeat)
        dense_space = dense_space_of_size(base.for_model(dense_model), moe["size"], gpus)
        dense = timed(dense_model, gpus, workload, dense_space, args.repeat)
        for label, r in ((f"{model.name} (default kinds)", moe), (f"{dense_model.name}, DP 1-{max(dense_space.data_parallel_size)}", dense)):
            print(f"| {label} | {r['size']:.3g} | {r['compile_s']:.1f} | {r['run_s']:.2f} | {r['cold_s']:.1f} | {r['warm_s']:.2f} | {r['admitted']:,} "
                  f"| {r['warm_s'] / dense['warm_s']:.2f} |", flush=True)
    machine.print_end()


if __name__ == "__main__":
    main()
