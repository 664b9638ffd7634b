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
    shim for the duration of the baseline (nothing in jaxplan/ is edited; the names are restored).
    Shim `python`: `math` and builtins on Python floats; shim `numpy`: the numpy module itself on numpy
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
import builtins
import contextlib
import itertools
import math
import time
from collections import Counter

import numpy as np
from machine import add_repo_root, median, print_end, print_start

add_repo_root()

import jax
import reference_funnel as ref

from jaxplan.funnel import estimate as estimate_mod
from jaxplan.funnel import rules as rules_mod
from jaxplan.funnel import structure as structure_mod
from jaxplan.funnel.chunk import evaluate_digits
from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context, run_sweep
from jaxplan.grid import AXES, Grid
from jaxplan.physics import batch as batch_mod
from jaxplan.physics import memory as memory_mod
from jaxplan.physics import moe as moe_mod
from jaxplan.physics import weight_formats as weight_formats_mod
from jaxplan.physics import steady_state as steady_mod
from jaxplan.physics import step_time as step_time_mod
from jaxplan.physics.shapes import Hardware, Layout
from jaxplan.physics.traffic import WorkloadParams
from jaxplan.specs import formats, load_model, load_space, load_workload, parse_gpu_list
from jaxplan.specs.space import DTYPE_BYTES

PATCHED = (steady_mod, step_time_mod, memory_mod, moe_mod, weight_formats_mod, batch_mod, estimate_mod, structure_mod, rules_mod)


# ---- scalar shims for the jnp / jax names of jaxplan's physics modules ---------------------------------
class _Index(int):
    def astype(self, _dtype):
        return int(self)


class _Float(float):
    """A float with numpy's `astype`, for `jnp.asarray(x).astype(...)`."""

    def astype(self, dtype):
        return dtype(self)


class _Knots(list):
    """A knot table of one configuration ([K] floats, or [K, 1] indexed as `table[k, 0]`): the shim's
    form of `steady_state.prepare`'s [K, R] tables, with the elementwise division they need."""

    @property
    def shape(self):
        return (len(self),)

    def __getitem__(self, key):
        return list.__getitem__(self, key[0] if isinstance(key, tuple) else key)

    def __truediv__(self, other):
        return _Knots(a / b for a, b in zip(self, other))


class _Maximum:
    """`jnp.maximum` on two floats, with the `accumulate` (running max) of a knot table."""

    def __call__(self, a, b):
        return a if a >= b else b  # noqa: FURB136 - faster than builtins.max on two floats

    @staticmethod
    def accumulate(xs, axis=0):
        return _Knots(itertools.accumulate(xs, builtins.max))


class PyScalar:
    """`jnp` for Python floats: math and builtins (both branches of `where` are already evaluated,
    as in jnp.where)."""

    int32 = int
    float32 = float
    inf = math.inf
    sqrt = staticmethod(math.sqrt)
    ceil = staticmethod(math.ceil)
    floor = staticmethod(math.floor)
    log = staticmethod(math.log)
    log2 = staticmethod(math.log2)
    abs = staticmethod(builtins.abs)
    isfinite = staticmethod(math.isfinite)

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    maximum = _Maximum()

    @staticmethod
    def minimum(a, b):
        return a if a <= b else b  # noqa: FURB136 - as above

    @staticmethod
    def clip(x, lo, hi):
        return lo if x < lo else (hi if x > hi else x)  # noqa: FURB136 - as above

    @staticmethod
    def power(a, b):
        return a**b

    @staticmethod
    def mod(a, b):
        return a % b

    @staticmethod
    def asarray(x, dtype=None):
        if dtype is not None:
            return dtype(x)
        return _Float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x

    @staticmethod
    def zeros_like(x):
        return 0.0

    @staticmethod
    def ones_like(x):
        return 1.0

    @staticmethod
    def zeros(shape, dtype=float):
        return dtype(0)

    @staticmethod
    def shape(x):
        return ()

    @staticmethod
    def broadcast_arrays(*xs):
        return list(xs)

    @staticmethod
    def stack(xs):
        return _Knots(xs)

    @staticmethod
    def ndim(x):
        return 0

    @staticmethod
    def size(x):
        return 1

    @staticmethod
    def arange(n, dtype=int):
        return _Knots(range(n))

    @staticmethod
    def reshape(x, shape):
        return x[0] if shape == () else _Knots(x)

    @staticmethod
    def argsort(xs, axis=0):
        return sorted(range(len(xs)), key=xs.__getitem__)

    @staticmethod
    def take_along_axis(xs, order, axis=0):
        return _Knots(xs[i] for i in order)

    @staticmethod
    def min(xs, axis=0):
        return builtins.min(xs)

    @staticmethod
    def argmin(xs, axis=0):
        return _Index(builtins.min(range(len(xs)), key=xs.__getitem__))


def _fori_loop(lo, hi, body, carry):
    for i in range(lo, hi):
        carry = body(i, carry)
    return carry


class _Lax:
    fori_loop = staticmethod(_fori_loop)
    stop_gradient = staticmethod(lambda x: x)


class _CustomJvp:
    """`jax.custom_jvp` for plain floats: the function as it is (the baseline takes no derivatives)."""

    def __init__(self, fun):
        self.fun = fun

    def __call__(self, *args, **kwargs):
        return self.fun(*args, **kwargs)

    def defjvp(self, *args, **kwargs):
        return None


class _Jax:
    lax = _Lax
    custom_jvp = _CustomJvp


SHIMS = {"python": PyScalar, "numpy": np}


@contextlib.contextmanager
def scalar_physics(shim):
    """Point the physics modules' `jnp` (and steady_state's `jax`) at a scalar shim; restore after."""
    saved = [(m, m.jnp) for m in PATCHED]
    saved_jax = steady_mod.jax
    try:
        for m in PATCHED:
            m.jnp = shim
        steady_mod.jax = _Jax
        with np.errstate(all="ignore"):
            yield
    finally:
        for m, j in saved:
            m.jnp = j
        steady_mod.jax = saved_jax


# ---- the baseline ------------------------------------------------------------------------------------------
class Problem:
    """Everything one candidate needs, as plain Python values."""

    def __init__(self, model_spec, gpu_specs, workload, space, ctx, grid: Grid, shim_name: str):
        self.model_spec, self.gpu_specs, self.workload, self.space = model_spec, gpu_specs, workload, space
        self.sizes = grid.sizes
        self.labels = [list(grid.labels[a]) for a in AXES]
        to_py = (lambda x: float(x)) if shim_name == "python" else (lambda x: np.float64(x))
        self.model = ctx.model  # ModelShape of Python floats
        hw = jax.device_get(ctx.hardware)
        self.hardware = [Hardware(*(to_py(f[g]) for f in hw)) for g in range(len(gpu_specs))]
        self.w = WorkloadParams(*(to_py(x) for x in jax.device_get(ctx.workload)))
        self.gmu = to_py(space.gpu_memory_utilization)
        self.to_py = to_py


def evaluate_one(p: Problem, index: int):
    """(reason, throughput, p99 TTFT, p99 TPOT) of one candidate (NaN metrics before stage 4)."""
    digits = [0] * len(p.sizes)
    for axis in range(len(p.sizes) - 1, -1, -1):
        index, digits[axis] = divmod(index, p.sizes[axis])
    c = {name: p.labels[a][d] for a, (name, d) in enumerate(zip(AXES, digits))}
    c["gpu"] = p.gpu_specs[digits[0]]
    reason = ref.candidate_reason(p.model_spec, p.workload, p.space, c)
    if reason != Reason.ADMITTED:
        return int(reason), math.nan, math.nan, math.nan
    f = p.to_py
    hw = p.hardware[digits[0]]
    fmt = formats.BY_NAME[c["weight_dtype"]]
    expert_parallel, lockstep = ref.kind_of(c["layout_kind"])
    # as `grid.candidates_from_digits` builds it: the DP axis counts servers of `lockstep` ranks each
    layout = Layout(f(c["tensor_parallel_size"]), f(c["pipeline_parallel_size"]), f(c["data_parallel_size"] * lockstep), f(fmt.other_bytes_per_param),
                    f(DTYPE_BYTES[c["kv_cache_dtype"]]), f(c["max_num_seqs"]), f(c["max_num_batched_tokens"]), f(fmt.code), f(lockstep), f(float(expert_parallel)))
    capacity = steady_mod.max_concurrency(p.model, hw, layout, p.w, p.gmu)
    s4, est, _, _, _ = estimate_mod.estimate_stage(p.model, hw, layout, p.w, p.gmu, capacity)
    return int(s4), float(est.output_tokens_per_s), float(est.ttft_p99_s), float(est.tpot_p99_s)


def run_baseline(p: Problem, sample: np.ndarray, shim) -> tuple[float, list]:
    indices = [int(i) for i in sample]
    with scalar_physics(shim):
        t0 = time.perf_counter()
        out = [evaluate_one(p, i) for i in indices]
        seconds = time.perf_counter() - t0
    return seconds, out


def jax_flat(ctx, grid: Grid, sample: np.ndarray):
    digits = np.stack([grid.digits_of(int(i)) for i in sample])
    ev = evaluate_digits(ctx, jax.numpy.asarray(digits))  # compiles for this shape
    jax.block_until_ready(ev.reason)
    t0 = time.perf_counter()
    ev = jax.block_until_ready(evaluate_digits(ctx, jax.numpy.asarray(digits)))
    return time.perf_counter() - t0, jax.device_get(ev)


def check_agreement(out: list, ev, rtol: float) -> tuple[Counter, int]:
    """Assert same reason per candidate and stage-4 metrics within rtol; returns (reason counts, n stage 4)."""
    ref_reason = np.array([o[0] for o in out])
    jax_reason = np.asarray(ev.reason)
    bad = np.flatnonzero(ref_reason != jax_reason)
    assert bad.size == 0, f"{bad.size} reason mismatches, first: ref {Reason(ref_reason[bad[0]]).name} vs jax {Reason(jax_reason[bad[0]]).name} at sample position {bad[0]}"
    reached4 = np.array([Reason(r).stage in (0, 4) for r in ref_reason])
    e = ev.estimate
    for k, name, jax_values in ((1, "throughput", e.output_tokens_per_s), (2, "p99 TTFT", e.ttft_p99_s), (3, "p99 TPOT", e.tpot_p99_s)):
        a = np.array([o[k] for o in out])[reached4]
        b = np.asarray(jax_values, np.float64)[reached4]
        both_inf = np.isinf(a) & np.isinf(b)
        close = both_inf | np.isclose(a, b, rtol=rtol, atol=0.0)
        assert close.all(), f"{name}: {np.sum(~close)} of {close.size} differ by more than rtol {rtol}; worst rel {np.nanmax(np.abs(a - b) / np.abs(b))[()]:.2e}"
    return Counter(Reason(int(r)).name for r in ref_reason), int(reached4.sum())


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
    space = load_space(args.space)
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
