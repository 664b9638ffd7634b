"""Stage 4 one candidate at a time, eagerly on Python (or NumPy) scalars: the jitted funnel's twin.

Stages 1-3 come from the plain-Python reference funnel (`reference_funnel.candidate_reason`); stage
4 runs jaxplan's own stage-4 source (`jaxplan.funnel.estimate.estimate_stage`,
`jaxplan.physics.steady_state.max_concurrency` and everything they call) with the modules' `jnp` /
`jax` names pointed at a scalar shim for the duration (`scalar_physics`; nothing in jaxplan/ is
edited, the names are restored). Shim `python`: `math` and builtins on Python floats; shim
`numpy`: the numpy module on float64 scalars. The Poisson solve's knot tables are lists of K floats
and its `fori_loop` a Python loop.

What it checks, against `jaxplan.funnel.chunk.evaluate_digits`, is the jitted machinery: the grid's
digits decoded inside jit, float32 against float64, the vectorised solver against one candidate's,
and the reasons the batched sieves give. `bench/bench_baseline.py` times it; `tests/test_stage4_scalar.py`
holds the two to each other.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import math
import time
from collections import Counter

import jax
import numpy as np
import reference_funnel as ref

from jaxplan.funnel import estimate as estimate_mod
from jaxplan.funnel import rules as rules_mod
from jaxplan.funnel import structure as structure_mod
from jaxplan.funnel.reasons import Reason
from jaxplan.grid import AXES, Grid
from jaxplan.physics import batch as batch_mod
from jaxplan.physics import memory as memory_mod
from jaxplan.physics import moe as moe_mod
from jaxplan.physics import steady_state as steady_mod
from jaxplan.physics import step_time as step_time_mod
from jaxplan.physics import weight_formats as weight_formats_mod
from jaxplan.physics.shapes import Hardware, Layout
from jaxplan.physics.traffic import WorkloadParams
from jaxplan.specs import formats
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


def _vmap(fun, in_axes):
    """`jax.vmap` over a leading axis that the shim holds as a list: the calls one by one."""

    def mapped(*args):
        count = len(next(leaf for arg, axis in zip(args, in_axes) if axis == 0 for leaf in jax.tree.leaves(arg)))
        pick = lambda i: [jax.tree.map(lambda x: x[i], arg) if axis == 0 else arg for arg, axis in zip(args, in_axes)]  # noqa: E731
        return _Knots(fun(*pick(i)) for i in range(count))

    return mapped


class _Jax:
    lax = _Lax
    custom_jvp = _CustomJvp
    tree = jax.tree
    vmap = staticmethod(_vmap)


SHIMS = {"python": PyScalar, "numpy": np}


@contextlib.contextmanager
def scalar_physics(shim):
    """Point the physics modules' `jnp` (and steady_state's and step_time's `jax`) at a scalar shim; restore after."""
    saved = [(m, m.jnp) for m in PATCHED]
    saved_jax = [(m, m.jax) for m in (steady_mod, step_time_mod)]
    try:
        for m in PATCHED:
            m.jnp = shim
        for m, _ in saved_jax:
            m.jax = _Jax
        with np.errstate(all="ignore"):
            yield
    finally:
        for m, j in saved:
            m.jnp = j
        for m, j in saved_jax:
            m.jax = j


# ---- one candidate at a time -------------------------------------------------------------------------------
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


def candidate(p: Problem, index: int) -> dict:
    """The candidate at grid `index` (decoded with divmod over the mixed radix) as the reference
    funnel takes it: every axis's value, the GPU's spec under "gpu" and its position under "gpu_index"."""
    digits = [0] * len(p.sizes)
    for axis in range(len(p.sizes) - 1, -1, -1):
        index, digits[axis] = divmod(index, p.sizes[axis])
    c = {name: p.labels[a][d] for a, (name, d) in enumerate(zip(AXES, digits))}
    return {**c, "gpu": p.gpu_specs[digits[0]], "gpu_index": digits[0]}


def reason_1_to_3(p: Problem, index: int) -> Reason:
    """The reference funnel's stages 1-3 verdict on the candidate at grid `index`."""
    return ref.candidate_reason(p.model_spec, p.workload, p.space, candidate(p, index))


def evaluate_one(p: Problem, index: int):
    """(reason, throughput, p99 TTFT, p99 TPOT) of one candidate (NaN metrics before stage 4)."""
    c = candidate(p, index)
    reason = ref.candidate_reason(p.model_spec, p.workload, p.space, c)
    if reason != Reason.ADMITTED:
        return int(reason), math.nan, math.nan, math.nan
    f = p.to_py
    hw = p.hardware[c["gpu_index"]]
    fmt = formats.BY_NAME[c["weight_dtype"]]
    expert_parallel, lockstep = ref.kind_of(c["layout_kind"])
    # as `grid.candidates_from_digits` builds it: the DP axis counts servers of `lockstep` ranks each
    layout = Layout(f(c["tensor_parallel_size"]), f(c["pipeline_parallel_size"]), f(c["data_parallel_size"] * lockstep), f(fmt.other_bytes_per_param),
                    f(DTYPE_BYTES[c["kv_cache_dtype"]]), f(c["max_num_seqs"]), f(c["max_num_batched_tokens"]), f(fmt.code), f(lockstep), f(float(expert_parallel)))
    capacity = steady_mod.max_concurrency(p.model, hw, layout, p.w, p.gmu)
    s4, est, _, _, _ = estimate_mod.estimate_stage(p.model, hw, layout, p.w, p.gmu, capacity)
    return int(s4), float(est.output_tokens_per_s), float(est.ttft_p99_s), float(est.tpot_p99_s)


def run_baseline(p: Problem, sample: np.ndarray, shim) -> tuple[float, list]:
    """(seconds, [evaluate_one of each index in `sample`]) under `shim`."""
    indices = [int(i) for i in sample]
    with scalar_physics(shim):
        t0 = time.perf_counter()
        out = [evaluate_one(p, i) for i in indices]
        seconds = time.perf_counter() - t0
    return seconds, out


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
