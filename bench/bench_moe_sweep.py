"""Benchmark a MoE model's default sweep against a dense model's sweep over a grid of the same size.

Usage:
    python bench/bench_moe_sweep.py --repeat 3                    # gpt-oss-120b and MiniMax-M2.5 vs Llama-3.1-70B
    python bench/bench_moe_sweep.py --moe kimi-k2.5 --gpus h100_sxm,h200_sxm
    python bench/bench_moe_sweep.py --cli --moe gpt-oss-120b --repeat 2   # whole `jaxplan sweep` commands, replay included

The MoE sweep is the model's default space (`SearchSpace.for_model`: layout kinds tp, ep, dp:D and
dp_ep:D for D = 2..128, the checkpoint's weight format). The dense sweep is --dense's default space
with its data-parallel axis stretched (1..N) until its grid holds as many candidates as the MoE one
(within one DP value's worth; both counts are printed).

Default mode: stages 1-6 (`run_sweep`), each sweep in a fresh process (so compilation is real and
the peak RSS is that sweep's), called twice there: the first call compiles ("cold": compilation,
i.e. the chunk kernel and the first chunk, apart from the streaming of the other chunks), the
second reuses the kernels ("warm"). --cli: the whole command, `jaxplan sweep` with the replay, as
`bench_first_run.py` runs it: a fresh process with an empty compilation cache (cold), then another
on that cache (warm). Medians of --repeat; the ratio is MoE / dense of the same column. Issue #35's
bar: the MoE sweep within 2x the dense one's time.

Prints machine facts and the load average at start and end: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(spec: dict) -> None:
    """In a fresh process: two `run_sweep` calls of one sweep; prints one JSON line."""
    import resource
    import time

    from jaxplan.funnel.sweep import run_sweep
    from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

    model, gpus, workload = load_model(spec["model"]), parse_gpu_list(spec["gpus"]), load_workload(spec["workload"])
    space = load_space(spec["space"])
    if spec["dp_max"]:
        space = space.replace(data_parallel_size=tuple(range(1, spec["dp_max"] + 1)))
    walls, cpus, results = [], [], []
    for _ in range(2):
        t0, c0 = time.perf_counter(), time.process_time()
        results.append(run_sweep(model, gpus, workload, space))
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)  # all threads: steadier than wall time on shared cores
    cold, warm = results
    assert [list(r["digits"]) for r in cold.shortlist] == [list(r["digits"]) for r in warm.shortlist], "the two calls disagree"
    print(json.dumps({
        "size": cold.grid.size, "compile_s": cold.compile_s, "stream_s": cold.run_s, "cold_s": walls[0],
        "warm_stream_s": warm.run_s, "warm_s": walls[1], "cold_cpu_s": cpus[0], "warm_cpu_s": cpus[1], "admitted": cold.stages[3].admitted,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # Linux: KiB
    }))


def in_process(spec: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the sweep {spec} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def whole_command(spec: dict, cache_dir: str, space_dir: str) -> dict:
    """One `jaxplan sweep` process (bench_first_run's measured child), the space written as a file when stretched."""
    import bench_first_run

    space = spec["space"]
    if spec["dp_max"]:
        from jaxplan.specs import load_space

        base = load_space(spec["space"])
        space = os.path.join(space_dir, f"dense_dp{spec['dp_max']}.toml")
        with open(space, "w") as f:
            f.write(space_toml(base.replace(data_parallel_size=tuple(range(1, spec["dp_max"] + 1)))))
    return bench_first_run.run_once(["sweep", "--model", spec["model"], "--gpus", spec["gpus"], "--workload", spec["workload"], "--space", space], cache_dir)


def space_toml(space) -> str:
    """A space file holding `space`'s axes (the DP axis as a range)."""
    dp = space.data_parallel_size
    assert dp == tuple(range(dp[0], dp[-1] + 1))
    lines = [
        f"tensor_parallel_size = {list(space.tensor_parallel_size)}",
        f"pipeline_parallel_size = {list(space.pipeline_parallel_size)}",
        f"data_parallel_size = {{ min = {dp[0]}, max = {dp[-1]} }}",
        f"max_num_seqs = {list(space.max_num_seqs)}",
        f"max_num_batched_tokens = {list(space.max_num_batched_tokens)}",
        f"weight_dtype = {json.dumps(list(space.weight_dtype))}",
        f"kv_cache_dtype = {json.dumps(list(space.kv_cache_dtype))}",
        f"gpu_budget = {space.gpu_budget}",
        f"gpu_memory_utilization = {space.gpu_memory_utilization}",
        f"block_size_tokens = {space.block_size_tokens}",
    ]
    return "\n".join(lines) + "\n"


def sizes(args) -> list[tuple[dict, dict]]:
    """(MoE spec, dense spec) pairs, the dense DP axis 1..N sized to the MoE grid."""
    from jaxplan.specs import load_model, load_space, parse_gpu_list

    num_gpus, base = len(parse_gpu_list(args.gpus)), load_space(args.space)
    dense_space = base.for_model(load_model(args.dense))
    per_dp = dense_space.size(num_gpus) // len(dense_space.data_parallel_size)
    pairs = []
    for name in (n.strip() for n in args.moe.split(",")):
        target = base.for_model(load_model(name)).size(num_gpus)
        common = {"gpus": args.gpus, "workload": args.workload, "space": args.space}
        pairs.append(({"model": name, "dp_max": 0, "size": target, **common},
                      {"model": args.dense, "dp_max": max(1, round(target / per_dp)), "size": per_dp * max(1, round(target / per_dp)), **common}))
    return pairs


def median_row(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0] if isinstance(runs[0][k], (int, float))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moe", default="gpt-oss-120b,minimax-m2.5", help="MoE models, comma-separated")
    parser.add_argument("--dense", default="llama-3.1-70b")
    parser.add_argument("--gpus", default="h200_sxm,b200_sxm")
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--space", default="default")
    parser.add_argument("--repeat", type=int, default=3, help="fresh processes per sweep (per phase with --cli); medians")
    parser.add_argument("--cli", action="store_true", help="time whole `jaxplan sweep` commands (replay included) instead of run_sweep")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    machine.print_start()
    pairs = sizes(args)
    for moe, dense in pairs:
        print(f"candidates: {moe['model']} {moe['size']:,} (default space); {dense['model']} {dense['size']:,} (DP 1-{dense['dp_max']:,}); "
              f"{100 * (dense['size'] / moe['size'] - 1):+.1f}%")
    if args.cli:
        cli_table(args, pairs)
    else:
        sweep_table(args, pairs)
    machine.print_end()


def label(spec: dict) -> str:
    return f"{spec['model']}, DP 1-{spec['dp_max']:,}" if spec["dp_max"] else f"{spec['model']} (default kinds)"


def sweep_table(args, pairs) -> None:
    print(f"stages 1-6 (run_sweep), GPUs {args.gpus}, workload {args.workload}; a fresh process per run, medians of {args.repeat}")
    print("| sweep | candidates | compile s | stream s | cold wall s | warm wall s | cold CPU s | warm CPU s | peak RSS GiB | admitted after stage 4 "
          "| cold wall / dense | warm wall / dense | cold CPU / dense | warm CPU / dense |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for moe, dense in pairs:
        rows = {}
        for spec in (moe, dense):
            runs = [in_process(spec) for _ in range(args.repeat)]
            print("  runs " + label(spec) + ": " + "; ".join(f"compile {r['compile_s']:.2f} stream {r['stream_s']:.2f} cold {r['cold_s']:.2f} warm {r['warm_s']:.2f} (CPU {r['cold_cpu_s']:.2f}, {r['warm_cpu_s']:.2f})" for r in runs), flush=True)
            rows[spec["model"]] = median_row(runs)
        m, d = rows[moe["model"]], rows[dense["model"]]
        for spec, r in ((moe, m), (dense, d)):
            print(f"| {label(spec)} | {r['size']:.3g} | {r['compile_s']:.2f} | {r['stream_s']:.2f} | {r['cold_s']:.2f} | {r['warm_s']:.2f} | {r['cold_cpu_s']:.2f} | {r['warm_cpu_s']:.2f} "
                  f"| {r['peak_rss_gib']:.2f} | {int(r['admitted']):,} | {r['cold_s'] / d['cold_s']:.2f} | {r['warm_s'] / d['warm_s']:.2f} "
                  f"| {r['cold_cpu_s'] / d['cold_cpu_s']:.2f} | {r['warm_cpu_s'] / d['warm_cpu_s']:.2f} |", flush=True)


def cli_table(args, pairs) -> None:
    print(f"`jaxplan sweep` (stages 1-7), GPUs {args.gpus}, workload {args.workload}; fresh processes, cold = empty cache, medians of {args.repeat}")
    print("| sweep | candidates | phase | wall s | CPU s | XLA compile s | stream s | replay s | peak RSS GiB | wall / dense |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="jaxplan-bench-moe-") as space_dir:
        for moe, dense in pairs:
            rows = {}
            for spec in (moe, dense):
                runs = {"cold": [], "warm": []}
                for _ in range(args.repeat):
                    with tempfile.TemporaryDirectory(prefix="jaxplan-bench-cache-") as cache:
                        for phase in ("cold", "warm"):
                            runs[phase].append(whole_command(spec, cache, space_dir))
                print("  runs " + label(spec) + ": " + "; ".join(f"{p} {r['wall_s']:.1f}" for p, rs in runs.items() for r in rs), flush=True)
                rows[spec["model"]] = {p: median_row(rs) for p, rs in runs.items()}
            for phase in ("cold", "warm"):
                d = rows[dense["model"]][phase]
                for spec in (moe, dense):
                    r = rows[spec["model"]][phase]
                    print(f"| {label(spec)} | {spec['size']:.3g} | {phase} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['xla_compile_s']:.1f} | {r['stream_s']:.2f} "
                          f"| {r['replay_s']:.1f} | {r['peak_rss_gib']:.2f} | {r['wall_s'] / d['wall_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
