"""Stage 4's Poisson solve (steady_state.poisson_concurrency) against a converged reference root.

The solver brackets the root between two of `prepare`'s knots (kinks of slot_time(b) and a grid)
and runs SECANT_ITERATIONS safeguarded interpolation steps. The reference here does not use the
knots: the smallest root of g(b) = rate x slot_time(b) - b on [low_b, b_max] by a 2,048-point scan
(first sign change) and 60 bisections (float32 limit). Cases: every bundled model (dense, MoE, MLA,
hybrid) on every bundled GPU, the 'huge' space's layouts, random ISL/OSL/hit rate/rate, and rates
placed so that the root sits on a kink (prefill saturation, the chunk starting to shrink, the first
chunk-count jump at b >= 0).

Measured on these cases: median relative error of b ~6e-8, max < 1e-3 (REL_B); throughput, p99 TTFT
and p99 TPOT at the solver's b within REL_OUT of their values at the reference b.
The programs that scan thousands of candidates compile at -O2 (`conftest.RUNS_LONG`), the
gradient's at the suite's -O0.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import RUNS_LONG
import jaxplan.physics.steady_state as steady_state
from jaxplan.physics import hardware_table, make_layout, model_shape, take, workload_params
from jaxplan.physics.params import efficiency_for
from jaxplan.physics.steady_state import _steps, estimate, prepare, slot_time_s
from jaxplan.specs import known, load_gpu, load_model, load_workload
from jaxplan.xla_options import accepted

MODELS = tuple(known("models"))
MOE = ("deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b")
LONG_OPTIONS = accepted(RUNS_LONG) or None  # the reference scans' jit compiler_options
GPUS = tuple(known("gpus"))
N = 1024  # candidates per case, one vectorised call
GMU = 0.9
SCAN, BISECTIONS = 1024, 60
REL_B = 1e-3  # relative error of b against the reference root
REL_OUT = 5e-3  # relative error of throughput, p99 TTFT and p99 TPOT at the solver's b vs the reference's
JUMP_POINTS = 8  # points between the solver's b and the reference root at which the outputs are checked for a step
ZERO = 1e-5  # |g(b)| / b below this: b is a fixed point of Little's law (float32 rounding of rate x slot time)


@pytest.fixture(scope="module")
def hardware():
    return hardware_table(tuple(load_gpu(n) for n in GPUS), efficiency_for(GPUS))


def traced(m):
    return jax.tree.map(jnp.float32, m)


def random_inputs(hardware, model: str, seed: int, n: int = N):
    """[n] Poisson candidates: the 'huge' space's TP/PP/knobs/dtypes, random workload, random rate."""
    rng = np.random.default_rng(seed)
    hw = take(hardware, jnp.asarray(rng.integers(0, len(GPUS), n), jnp.int32))
    layout = make_layout(
        rng.choice([1.0, 2, 3, 4, 6, 8, 12, 16, 32], n), rng.choice([1.0, 2, 3, 4, 6, 8], n), 1.0,
        rng.choice([1.0, 2.0], n), rng.choice([1.0, 2.0], n),
        rng.choice([8.0, 16, 32, 48, 64, 96, 128, 192, 256, 512, 768, 1024], n),
        rng.choice([256.0, 512, 1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768, 65536], n),
    )
    log_uniform = lambda lo, hi: jnp.asarray(np.exp(rng.uniform(np.log(lo), np.log(hi), n)), jnp.float32)  # noqa: E731
    w = workload_params(
        load_workload("chat"), isl_tokens=log_uniform(50, 30_000), osl_tokens=log_uniform(20, 8_000),
        prefix_hit_rate=jnp.asarray(rng.uniform(0, 0.9, n) * (rng.uniform(size=n) < 0.5), jnp.float32),
        request_rate_per_s=log_uniform(0.003, 200), arrival_code=0,
    )
    return traced(model_shape(load_model(model))), hw, layout, w


def _excess(m, hw, layout, w, b):
    """g(b) = rate x slot_time(b) - b (DP = 1: the rate is per replica)."""
    return w.request_rate_per_s * slot_time_s(_steps(m, hw, layout, w, b), w) - b


excess = jax.jit(_excess, compiler_options=LONG_OPTIONS)  # called on its own too (outside `reference_root`): one program, not op-by-op dispatch


@functools.partial(jax.jit, compiler_options=LONG_OPTIONS)
def reference_root(m, hw, layout, w):
    """(b, usable): the smallest root of g on [low_b, b_max] by scan + bisection; usable where a root
    is inside (g(low_b) > 0 > g(b_max)) and the replica has at least one slot."""
    b_max = jnp.maximum(prepare(m, hw, layout, w, GMU).b_max, 1e-3)
    low = jnp.minimum(b_max, 1e-2)
    points = low[None] + jnp.linspace(0.0, 1.0, SCAN)[:, None] * (b_max - low)[None]  # [SCAN, C]
    negative = jax.lax.map(lambda b: _excess(m, hw, layout, w, b) < 0, points, batch_size=128)
    first = jnp.maximum(jnp.argmax(negative, axis=0), 1)
    lo = jnp.take_along_axis(points, (first - 1)[None], 0)[0]
    hi = jnp.take_along_axis(points, first[None], 0)[0]

    def bisect(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        up = _excess(m, hw, layout, w, mid) >= 0
        return jnp.where(up, mid, lo), jnp.where(up, hi, mid)

    lo, hi = jax.lax.fori_loop(0, BISECTIONS, bisect, (lo, hi))
    usable = (_excess(m, hw, layout, w, low) > 0) & (_excess(m, hw, layout, w, b_max) < 0) & (b_max >= 1.0)
    return 0.5 * (lo + hi), usable


@functools.partial(jax.jit, compiler_options=LONG_OPTIONS)
def solved(m, hw, layout, w):
    return estimate(m, hw, layout, w, GMU)


@functools.partial(jax.jit, compiler_options=LONG_OPTIONS)
def at_concurrency(m, hw, layout, w, b):
    """The estimate with the Poisson solve replaced by the given b [C] (patched while tracing: one
    compilation serves every call)."""
    saved = steady_state.poisson_concurrency
    steady_state.poisson_concurrency = lambda *_: b
    try:
        return estimate(m, hw, layout, w, GMU)
    finally:
        steady_state.poisson_concurrency = saved


def check(m, hw, layout, w, label: str, min_usable: int = 50):
    ref, usable = (np.asarray(x) for x in reference_root(m, hw, layout, w))
    est = solved(m, hw, layout, w)
    b = np.asarray(est.concurrency_per_replica)
    assert np.all(np.isfinite(b)), label
    assert usable.sum() >= min_usable, f"{label}: only {usable.sum()} cases with a root inside"
    rel = np.abs(b - ref) / ref
    # Where g has a jump (the chunk count) or touches 0 at a kink, a negative stretch narrower than the
    # scan's step can hide a smaller root than the reference's: accepted if g changes sign within
    # REL_B of b or vanishes at b.
    g_at = lambda x: np.asarray(excess(m, hw, layout, w, jnp.asarray(x)))  # noqa: E731
    root = ((g_at(b * (1 - REL_B)) >= 0) & (g_at(b * (1 + REL_B)) < 0)) | (np.abs(g_at(b)) <= ZERO * b)
    close = rel <= REL_B
    bad = usable & ~close & ~(root & (b < ref))
    assert not bad.any(), f"{label}: b={b[bad][:4]} vs reference {ref[bad][:4]} (rel {rel[bad][:4]})"
    at_ref = at_concurrency(m, hw, layout, w, jnp.asarray(ref))
    stable = usable & close & (np.asarray(est.utilization) < 1.0)
    # The outputs step where a whole chunk more or less is needed: a b within REL_B of the root may lie
    # across such a step from it. Where one of JUMP_POINTS evenly spaced steps between b and the root
    # moves an output by more than half of REL_OUT (a smooth change over REL_B moves each by ~1e-4),
    # that output is a step, not a solver error, and is not compared.
    between = [at_concurrency(m, hw, layout, w, jnp.asarray(b + (ref - b) * k / JUMP_POINTS)) for k in range(JUMP_POINTS + 1)]
    for name in ("output_tokens_per_s", "ttft_p99_s", "tpot_p99_s"):
        got, want = np.asarray(getattr(est, name)), np.asarray(getattr(at_ref, name))
        path = np.stack([np.asarray(getattr(e, name), np.float64) for e in between])
        with np.errstate(invalid="ignore"):  # unstable cases' outputs are inf (never compared)
            step = np.max(np.abs(np.diff(path, axis=0)), axis=0) / np.maximum(np.abs(want), 1e-30)
        compared = stable & (step <= 0.5 * REL_OUT)
        assert compared.sum() >= 0.9 * stable.sum(), f"{label} {name}: {stable.sum() - compared.sum()} of {stable.sum()} cases at a step"
        err = np.abs(got[compared] - want[compared]) / np.abs(want[compared])
        assert np.all(err <= REL_OUT), f"{label} {name}: max rel {err.max():.2e}"
    return rel[usable & close]


@pytest.mark.parametrize("model", MODELS)
def test_solver_matches_converged_root(hardware, model):
    """Random candidates of every bundled model: b within REL_B of the reference root."""
    rel = np.concatenate([check(*random_inputs(hardware, model, seed), f"{model} seed {seed}") for seed in (1, 2)])
    assert np.median(rel) < 1e-5


@functools.partial(jax.jit, compiler_options=LONG_OPTIONS)
def kink_rates(m, hw, layout, w):
    """[3 kinds, n] rates per replica that put the root exactly on a kink: prefill saturation, the
    chunk starting to shrink, the first chunk-count jump at b >= 0 (b / slot_time(b) at that b; a
    prompt longer than PP x budget has its first jumps below 0)."""
    isl_eff = w.isl_tokens * (1.0 - w.prefix_hit_rate)
    tokens = layout.pipeline_parallel_size * layout.max_num_batched_tokens
    full_chunk = jnp.minimum(layout.max_num_batched_tokens, isl_eff)
    first_jump = jnp.maximum(jnp.ceil(isl_eff / tokens - 1e-4), 1.0)
    kinks = [w.osl_tokens * full_chunk / isl_eff, tokens - full_chunk, tokens - isl_eff / (first_jump + 1e-4)]
    return jnp.stack([b / slot_time_s(_steps(m, hw, layout, w, b), w) for b in kinks])


@pytest.mark.parametrize("model", ("llama-3.1-70b",) + MOE)
@pytest.mark.parametrize("shift", (0.999, 1.0, 1.001))
def test_solver_at_kinks(hardware, model, shift):
    """Rates that put the root on (or 0.1% either side of) a kink of slot_time(b); long prompts and
    small budgets so that the chunk shrinks and saturates inside [0, b_max]."""
    m, hw, layout, w = random_inputs(hardware, model, 7)
    rng = np.random.default_rng(8)
    layout = layout._replace(max_num_batched_tokens=jnp.asarray(rng.choice([256.0, 512, 1024, 2048, 4096], N), jnp.float32))
    w = w._replace(isl_tokens=jnp.asarray(rng.uniform(200, 6000, N), jnp.float32), osl_tokens=jnp.asarray(rng.uniform(20, 600, N), jnp.float32))
    rates = np.asarray(kink_rates(m, hw, layout, w))
    for kind, rate in zip(("saturation", "chunk shrinks", "chunk count jump"), rates):
        ok = np.isfinite(rate) & (rate > 0)
        w_k = w._replace(request_rate_per_s=jnp.asarray(np.where(ok, rate * shift, 1.0), jnp.float32))
        check(m, hw, layout, w_k, f"{model} at {kind} x {shift}", min_usable=20)


@pytest.mark.parametrize("model", ("llama-3.1-70b", "deepseek-v3"))
def test_solver_gradient_is_finite_at_kinks(hardware, model):
    """d(b, TTFT, TPOT)/d(rate, ISL) through the bracket selection and the fori_loop: finite."""
    m, hw, layout, w = random_inputs(hardware, model, 3, 256)
    w = w._replace(request_rate_per_s=jnp.asarray(kink_rates(m, hw, layout, w)[0], jnp.float32))

    jac = np.asarray(kink_jacobian(jnp.ones(2, jnp.float32), m, hw, layout, w))
    assert np.all(np.isfinite(jac)), jac


@jax.jit
def kink_jacobian(params, m, hw, layout, w):
    """d(sum b, sum p99 TTFT, sum p99 TPOT)/d(rate scale, ISL scale) at params; the inputs are arguments,
    not constants, so that every model of one shape structure runs one compiled program."""

    def outputs(params):
        est = estimate(m, hw, layout, w._replace(request_rate_per_s=params[0] * w.request_rate_per_s, isl_tokens=params[1] * w.isl_tokens), GMU)
        return jnp.stack([jnp.sum(est.concurrency_per_replica), jnp.sum(jnp.where(jnp.isfinite(est.ttft_p99_s), est.ttft_p99_s, 0.0)), jnp.sum(est.tpot_p99_s)])

    return jax.jacfwd(outputs)(params)
