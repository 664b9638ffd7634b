"""Plain-Python/NumPy baseline for stages 1-4, one candidate at a time, against the JAX sweep.

The baseline evaluates a random sample of the grid (uniform over grid indices, so the same mix of
cheap stage-1 rejections and expensive stage-4 survivors as the sweep sees), one candidate at a time:

  * index -> axis values: Python divmod over the mixed radix (what `jaxplan.grid` does inside jit);
  * stages 1-3: the plain-Python reference funnel of the tests (tests/reference_funnel.py, imported,
    float64, re-derived from the models' raw config fields): `structure_reason`, `memory_reason`,
    `slots(...) < 1`;
  * stage 4 on the stage-3 survivors: jaxplan's own stage-4 source (`jaxplan.funnel.estimate.
    estimate_stage`, `jaxplan.physics.steady_state.max_concurrency` and everything they call) run
    eagerly on Python scalars, with the modules' `jnp`/`jax` names temporarily pointed at a scalar
    shim for the duration of the baseline (nothing in jaxplan/ is edited; the names are restored;
    `tests/scalar_stage4.py`, which `tests/test_stage4_scalar.py` also runs). Shim `python`: `math` and builtins on Python floats; shim `numpy`: the numpy module itself on numpy
    float64 scalars. The Poisson solve's knot tables are lists of K floats priced one knot at a time
    (`python`) or arrays of K (`numpy`, so the faster of the two once candidates reach stage 4); its
    `fori_loop` becomes a Python loop.

Apples to apples: the same sample goes through jaxplan's jitted flat evaluate (`evaluate_digits`);
the script asserts that every candidate gets the same reason code (stages 1-3 and stage 4) and
that stage-4 throughput / p99 TTFT / p99 TPOT agree to `--rtol` (float64 vs float32), then runs the
JAX sweep (`run_sweep`) over the grid the sample came from, and reports candidates/s for both and
the ratio. The sweep's figure is its streaming rate (compile excluded); wall incl. compile is shown.

    python bench/bench_baseline.py                       # 5,000 candidates of the 1.27e8 'huge' grid
    python bench/bench_baseline.py --sample 20000 --repeat 3
    python bench/bench_baseline.py --grid-size 1e7       # shrink the DP axis (shorter JAX sweep)
    python bench/bench_baseline.py --sweep none          # baseline + agreement check only
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from machine import add_repo_root, median, print_end, print_start

add_repo_root()

import jax
from scalar_stage4 import SHIMS, Problem, check_agreement, run_baseline

from jaxplan.funnel.chunk import evaluate_digits
from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context, run_sweep
from jaxplan.grid import Grid
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


def jax_flat(ctx, grid: Grid, sample: np.ndarray):
    digits = np.stack([grid.digits_of(int(i)) for i in sample])
    ev = evaluate_digits(ctx, jax.numpy.asarray(digits))  # compiles for this shape
    jax.block_until_ready(ev.reason)
    t0 = time.perf_counter()
    ev = jax.block_until_ready(evaluate_digits(ctx, jax.numpy.asarray(digits)))
    return time.perf_counter() - t0, jax.device_get(ev)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--gpus", default="h100_sxm,h200_sxm,b200_sxm,a100_sxm")
    parser.add_argument("--workload", default="coding")
    parser.add_argument("--space", default="huge")
    parser.add_argument("--grid-size", type=float, default=0, help="shrink the DP axis to about this many candidates (0: the space as is)")
    parser.add_argument("--sample", type=int, default=5000, help="candidates evaluated one at a time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shims", nargs="+", default=["python", "numpy"], choices=sorted(SHIMS))
    parser.add_argument("--sweep", choices=["grid", "none"], default="grid", help="run the JAX sweep over the sampled grid")
    parser.add_argument("--chunk", type=int, default=1 << 16)
    parser.add_argument("--rtol", type=float, default=2e-3)
    parser.add_argument("--repeat", type=int, default=1, help="median of N runs (baseline and sweep)")
    args = parser.parse_args()
    print_start()

    model, gpus, workload = load_model(args.model), parse_gpu_list(args.gpus), load_workload(args.workload)
    space = load_space(args.space).for_model(model)  # as run_sweep resolves it (a MoE model's layout kinds and formats)
    if args.grid_size:
        from bench_sweep import scaled_space

        space = scaled_space(space, int(args.grid_size), len(gpus))
    grid = Grid(gpus, space)
    ctx = build_context(grid, model, workload)
    rng = np.random.default_rng(args.seed)
    sample = np.sort(rng.integers(0, grid.size, args.sample))
    print(f"model {model.name}, GPUs {args.gpus}, workload {workload.name}, space {space.name} "
          f"(DP 1-{max(space.data_parallel_size)}), grid {grid.size:,} candidates; sample {args.sample:,} (seed {args.seed}); medians of {args.repeat}")

    flat_s, ev = jax_flat(ctx, grid, sample)
    rows = []
    for name in args.shims:
        p = Problem(model, gpus, workload, space, ctx, grid, name)
        times = []
        for _ in range(args.repeat):
            seconds, out = run_baseline(p, sample, SHIMS[name])
            times.append(seconds)
        counts, n4 = check_agreement(out, ev, args.rtol)
        seconds = median(times)
        rows.append((name, seconds, n4))
        print(f"baseline [{name}]: {args.sample:,} candidates in {seconds:.2f} s = {args.sample / seconds:,.0f} candidates/s "
              f"({seconds / args.sample * 1e6:.1f} us each); {n4:,} reached stage 4; agrees with JAX on every reason "
              f"and on stage-4 metrics within rtol {args.rtol:g}", flush=True)
    print("sample reasons: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))
    # Split of the baseline's time: candidates rejected in stages 1-3 vs those that reach stage 4.
    name0 = rows[0][0]
    p = Problem(model, gpus, workload, space, ctx, grid, name0)
    reached = np.array([Reason(int(r)).stage in (0, 4) for r in np.asarray(ev.reason)])
    early_s, _ = run_baseline(p, sample[~reached], SHIMS[name0]) if (~reached).any() else (0.0, [])
    late_s, _ = run_baseline(p, sample[reached], SHIMS[name0]) if reached.any() else (0.0, [])
    print(f"baseline [{name0}] split: rejected in stages 1-3: {early_s / max((~reached).sum(), 1) * 1e6:.1f} us each; "
          f"reaching stage 4: {late_s / max(reached.sum(), 1) * 1e6:.1f} us each")
    print(f"JAX flat evaluate (jit, no DP factorisation, one batch of the same {args.sample:,}): {flat_s * 1e3:.1f} ms = {args.sample / flat_s:,.0f} candidates/s")

    if args.sweep == "grid":
        runs = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            result = run_sweep(model, gpus, workload, space, chunk_size=args.chunk)
            runs.append((time.perf_counter() - t0, result.compile_s, result.run_s))
        wall, compile_s, run_s = (median(x) for x in zip(*runs))
        sweep_rate = grid.size / run_s
        print(f"JAX sweep (run_sweep, stages 1-6): {grid.size:,} candidates, compile+first chunk {compile_s:.1f} s, streamed {run_s:.2f} s, "
              f"wall {wall:.1f} s -> {sweep_rate:,.3g} candidates/s streamed ({grid.size / wall:,.3g}/s incl. compile)")
        print()
        print("| implementation | candidates | seconds | candidates/s | JAX sweep speed-up |")
        print("|---|---|---|---|---|")
        for name, seconds, _ in rows:
            print(f"| plain Python one at a time, shim `{name}` | {args.sample:,} (sample) | {seconds:.2f} | {args.sample / seconds:,.0f} | {sweep_rate / (args.sample / seconds):,.0f}x |")
        print(f"| JAX flat evaluate (one jit batch) | {args.sample:,} (sample) | {flat_s:.3f} | {args.sample / flat_s:,.3g} | {sweep_rate / (args.sample / flat_s):,.1f}x |")
        print(f"| JAX sweep, streamed (compile excluded) | {grid.size:,} (grid) | {run_s:.1f} | {sweep_rate:,.3g} | 1x |")
        print(f"| JAX sweep, wall incl. compile and stages 5-6 | {grid.size:,} (grid) | {wall:.1f} | {grid.size / wall:,.3g} | |")
        best = max(args.sample / s for _, s, _ in rows)
        print(f"extrapolated: the fastest plain-Python baseline would take {grid.size / best / 3600:,.1f} h for this grid (JAX: {wall:.0f} s wall)")
    print_end()


if __name__ == "__main__":
    main()
