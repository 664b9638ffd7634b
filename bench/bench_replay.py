"""Benchmark the replay: 20 finalists on `coding` (5,000 requests) and `reasoning` (2,000).

Synthetic step time: 0.004 + 2e-7 * prefill_tokens + 2e-5 * decode_tokens
+ 2e-9 * decode_context_tokens seconds (scaled by up to 10% per finalist),
max_num_seqs 256, token budget 8192, 20,000 KV blocks per replica, dp 1..4.

Each workload is replayed twice in one process: the first call compiles and
runs; the second uses different per-finalist values (capacities, dp, step
times), so it must reuse the compiled programs: its time is the run time, and
first - second is about the compile time. `iterations` counts loop iterations
of the longest lane (a decode jump of many steps is one); request-steps/s is
the sum over all replica steps of the requests scheduled in them, per run second.
The machine's load average is printed too: the bench shares its cores.

    python bench/bench_replay.py [--finalists 20] [--window 128] [--workloads coding reasoning]
"""

from __future__ import annotations

import argparse
import os
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
from jaxplan.replay.testing import affine_step_time
from jaxplan.specs import load_workload

NUM_REQUESTS = {"coding": 5000, "reasoning": 2000, "chat": 5000, "rl-rollout": 4096}
step_time = affine_step_time  # params = (overhead s, s/prefill token, s/decode token, s/context token)


def make_inputs(num_f: int, variant: int):
    """Finalists' configs and step-time parameters; `variant` 1 changes every value, no shape."""
    rng = np.random.default_rng(variant)
    scale = 1.0 + 0.1 * rng.random(num_f)
    params = (np.array([0.004, 2e-7, 2e-5, 2e-9])[None, :] * scale[:, None]).astype(np.float32)
    dp = 1 + (np.arange(num_f) + variant) % 4
    seqs = np.full(num_f, 256) - variant * rng.integers(0, 64, num_f)
    budget = 8192 - variant * 1024 * (np.arange(num_f) % 2)
    config = ReplayConfig.create(max_num_seqs=seqs, max_num_batched_tokens=budget, num_kv_blocks=20000 - variant * 500, data_parallel_size=dp)
    return config, params


def run(name: str, num_f: int, window: int) -> dict:
    workload = load_workload(name)
    requests = sample_requests(workload, NUM_REQUESTS.get(name, workload.num_requests), seed=0)
    seconds, compiled = [], []
    for variant in (0, 1):
        config, params = make_inputs(num_f, variant)
        start = time.perf_counter()
        trace = simulate_trace(config, requests, workload, step_time, params, window=window)
        metrics = jax.block_until_ready(summarize(trace, workload))
        seconds.append(time.perf_counter() - start)
        compiled.append(driver._advance._cache_size())
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
        "iterations": int(np.asarray(trace.replica_iterations).sum(1).max()),
        "req_steps": float(np.sum(np.asarray(trace.replica_batch_sum))),
        "done": int(np.asarray(metrics.completed).sum()),
        "preempt": int(np.asarray(metrics.num_preemptions).sum()),
        "ttft_p99": float(np.nanmedian(np.asarray(metrics.ttft.p99_s))),
        "tpot_p50": float(np.nanmedian(np.asarray(metrics.tpot.p50_s))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finalists", type=int, default=20)
    parser.add_argument("--window", type=int, default=128, help="most steps one decode jump covers")
    parser.add_argument("--workloads", nargs="+", default=["coding", "reasoning"])
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].platform} x{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}, window {args.window}")
    head = (
        f"{'workload':<10} {'F':>3} {'R':>5} {'1st call s':>10} {'~compile s':>10} {'run s':>6} {'recompiled':>10} "
        f"{'steps':>11} {'iterations':>10} {'steps/s':>9} {'req-steps/s':>11} {'done':>6} {'preempt':>7} {'med p99 TTFT s':>14} {'med p50 TPOT s':>14}"
    )
    print(head)
    print("-" * len(head))
    for name in args.workloads:
        r = run(name, args.finalists, args.window)
        print(
            f"{r['workload']:<10} {r['F']:>3} {r['R']:>5} {r['first']:>10.2f} {r['compile']:>10.2f} {r['run']:>6.2f} {r['recompiled']!s:>10} "
            f"{r['steps']:>11,} {r['iterations']:>10,} {r['steps'] / r['run']:>9.3g} {r['req_steps'] / r['run']:>11.3g} {r['done']:>6} {r['preempt']:>7} "
            f"{r['ttft_p99']:>14.3f} {r['tpot_p50']:>14.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
