"""Benchmark the replay: 1, 20 and 100 finalists on `coding`, `chat` (5,000 requests each) and `reasoning` (2,000).

Synthetic step time: 0.004 + 2e-7 * prefill_tokens + 2e-5 * decode_tokens
+ 2e-9 * decode_context_tokens seconds (scaled by up to 10% per finalist),
max_num_seqs 256, token budget 8192, 20,000 KV blocks per replica, dp 1..4.

Each workload is replayed twice in one process: the first call compiles and
runs; the second uses different per-finalist values (capacities, dp, step
times), so it must reuse the compiled programs: its time is the run time, and
first - second is about the compile time. `iterations` counts loop iterations
of the longest lane (a decode jump of many steps is one), i.e. of the replay's loop; request-steps/s is
the sum over all replica steps of the requests scheduled in them, per run second.
The machine's load average is printed too: the bench shares its cores.

One command gives the whole table: every workload x every finalist count, each measured
--repeat times (JAX's caches are cleared before each repeat, so every "first call" compiles
again), medians reported, with the load average before and after each cell.

    python bench/bench_replay.py                                   # 1, 20, 100 finalists x coding, chat, reasoning
    python bench/bench_replay.py --repeat 3
    python bench/bench_replay.py --finalists 20 --workloads coding reasoning   # the older single table
    python bench/bench_replay.py [--finalists 1 20 100] [--window 128] [--requests N] [--routing round_robin|least_loaded]
    python bench/bench_replay.py --max-replicas-per-lane 1     # round robin: every replica on its own lane
    JAXPLAN_CPU_DEVICES=1 python bench/bench_replay.py         # one XLA CPU device (default: one per core, as the CLI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import numpy as np

from jaxplan.replay import (
    ReplayConfig,
    driver,
    sample_requests,
    simulate_trace,
    summarize,
)
from jaxplan import cpu_devices
from jaxplan.replay.testing import affine_step_time
from jaxplan.specs import load_workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load as load_average
from machine import print_end, print_start

NUM_REQUESTS = {"coding": 5000, "reasoning": 2000, "chat": 5000, "rl-rollout": 4096}
step_time = affine_step_time  # params = (overhead s, s/prefill token, s/decode token, s/context token)


def make_inputs(num_f: int, variant: int, routing: str = "round_robin"):
    """Finalists' configs and step-time parameters; `variant` 1 changes every value, no shape."""
    rng = np.random.default_rng(variant)
    scale = 1.0 + 0.1 * rng.random(num_f)
    params = (np.array([0.004, 2e-7, 2e-5, 2e-9])[None, :] * scale[:, None]).astype(np.float32)
    # The padded replica count (a static shape) follows max(dp): below 4 finalists keep dp, else the
    # warm call of a single finalist would recompile.
    dp = 1 + (np.arange(num_f) + variant * (num_f >= 4)) % 4
    seqs = np.full(num_f, 256) - variant * rng.integers(0, 64, num_f)
    budget = 8192 - variant * 1024 * (np.arange(num_f) % 2)
    config = ReplayConfig.create(max_num_seqs=seqs, max_num_batched_tokens=budget, num_kv_blocks=20000 - variant * 500, data_parallel_size=dp, routing=routing)
    return config, params


def run(name: str, num_f: int, window: int, num_requests: int | None = None, routing: str = "round_robin", per_lane: int | None = None) -> dict:
    workload = load_workload(name)
    requests = sample_requests(workload, num_requests or NUM_REQUESTS.get(name, workload.num_requests), seed=0)
    seconds, compiled = [], []
    loop = []  # loop iterations of each _advance call, per device
    advance = driver._advance
    driver._advance = lambda *a, **k: (lambda out: loop.append(out[1]) or out)(advance(*a, **k))
    for variant in (0, 1):
        config, params = make_inputs(num_f, variant, routing)
        loop.clear()
        start = time.perf_counter()
        trace = simulate_trace(config, requests, workload, step_time, params, window=window, max_replicas_per_lane=per_lane)
        metrics = jax.block_until_ready(summarize(trace, workload))
        seconds.append(time.perf_counter() - start)
        compiled.append(advance._cache_size())
    driver._advance = advance
    steps = np.asarray(trace.replica_steps)
    return {
        "workload": name,
        "F": num_f,
        "R": requests.num_requests,
        "first": seconds[0],
        "compile": max(seconds[0] - seconds[1], 0.0),
        "run": seconds[1],
        "recompiled": compiled[1] != compiled[0],
        "steps": int(steps.sum()),
        "iterations": int(sum(int(np.max(x)) for x in loop)),  # each call's ran [devices]: the most any device ran
        "req_steps": float(np.sum(np.asarray(trace.replica_batch_sum))),
        "done": int(np.asarray(metrics.completed).sum()),
        "preempt": int(np.asarray(metrics.num_preemptions).sum()),
        "ttft_p99": float(np.nanmedian(np.asarray(metrics.ttft.p99_s))),
        "tpot_p50": float(np.nanmedian(np.asarray(metrics.tpot.p50_s))),
    }


def median_of(runs: list[dict]) -> dict:
    """Median of every numeric field over repeats (counts are identical across repeats)."""
    out = dict(runs[-1])
    for key in ("first", "compile", "run"):
        out[key] = statistics.median(r[key] for r in runs)
    out["recompiled"] = any(r["recompiled"] for r in runs)
    out["runs"] = [(r["first"], r["run"]) for r in runs]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finalists", type=int, nargs="+", default=[1, 20, 100], help="finalist counts (one or more)")
    parser.add_argument("--window", type=int, default=128, help="most steps one decode jump covers")
    parser.add_argument("--workloads", nargs="+", default=["coding", "chat", "reasoning"])
    parser.add_argument("--requests", type=int, default=0, help="requests per workload (0: coding/chat 5,000, reasoning 2,000)")
    parser.add_argument("--repeat", type=int, default=1, help="median of N runs; JAX caches are cleared before each, so each first call compiles")
    parser.add_argument("--routing", choices=["round_robin", "least_loaded"], default="round_robin", help="how requests reach data-parallel replicas")
    parser.add_argument("--max-replicas-per-lane", type=int, default=None, help="round robin: spread each finalist's replicas over lanes of at most N (default: one lane per finalist)")
    args = parser.parse_args()
    cpu_devices.enable()  # as the CLI does: one XLA CPU device per core, the lanes sharded over them (JAXPLAN_CPU_DEVICES=1: one)
    print_start()
    print(f"device: {jax.devices()[0].platform} x{os.cpu_count()} cores, {jax.local_device_count()} JAX device(s), load average {os.getloadavg()[0]:.1f}, window {args.window}, medians of {args.repeat}, routing {args.routing}, max replicas per lane {args.max_replicas_per_lane or 'all'}")
    head = (
        f"{'workload':<10} {'F':>3} {'R':>5} {'1st call s':>10} {'~compile s':>10} {'run s':>6} {'recompiled':>10} "
        f"{'steps':>11} {'iterations':>10} {'steps/s':>9} {'req-steps/s':>11} {'done':>6} {'preempt':>7} {'med p99 TTFT s':>14} {'med p50 TPOT s':>14}"
    )
    print(head)
    print("-" * len(head))
    table = []
    for name in args.workloads:
        for num_f in args.finalists:
            load_before = load_average()
            runs = []
            for _ in range(args.repeat):
                jax.clear_caches()  # every repeat's first call compiles, as in a fresh process
                runs.append(run(name, num_f, args.window, args.requests or None, args.routing, args.max_replicas_per_lane))
            r = median_of(runs)
            r["load"] = f"{load_before} -> {load_average()}"
            table.append(r)
            print(
                f"{r['workload']:<10} {r['F']:>3} {r['R']:>5} {r['first']:>10.2f} {r['compile']:>10.2f} {r['run']:>6.2f} {r['recompiled']!s:>10} "
                f"{r['steps']:>11,} {r['iterations']:>10,} {r['steps'] / r['run']:>9.3g} {r['req_steps'] / r['run']:>11.3g} {r['done']:>6} {r['preempt']:>7} "
                f"{r['ttft_p99']:>14.3f} {r['tpot_p50']:>14.4f}",
                flush=True,
            )
    print()
    print(f"medians of {args.repeat}; first call = compile + run; warm call = a second call with other per-finalist values (no recompile); "
          "request-steps/s over the warm call")
    print("| workload | finalists | requests | first call s | warm call s | ~compile s | per finalist s (warm) | replayed requests/s (warm) | scheduler steps | request-steps/s | recompiled | load avg (1/5/15) before -> after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['workload']} | {r['F']} | {r['R']:,} | {r['first']:.2f} | {r['run']:.2f} | {r['compile']:.2f} | {r['run'] / r['F']:.3f} | {r['F'] * r['R'] / r['run']:,.0f} | "
              f"{r['steps']:,} | {r['req_steps'] / r['run']:.3g} | {r['recompiled']} | {r['load']} |")
    print_end()


if __name__ == "__main__":
    main()
