"""Stage-4 estimates: throughput, TTFT and TPOT of a replica in steady state.

A replica runs `b` requests concurrently. Every step each produces one token;
b / OSL requests finish per step and as many new prompts (ISL x (1 - hit)
uncached tokens each) are prefilled in chunks of the room the token budget
leaves next to the decodes. A step therefore either carries a prefill chunk
(fraction `f` of steps) or is decode-only, and both are priced by the same
`step_time_s` the replay uses.

The concurrency `b` is the smallest of: max_num_seqs, what the KV cache holds
at the mean live context (ISL + OSL / 2), what the token budget sustains
(b (1 + ISL_eff / OSL) <= PP x budget), and the demand: the closed-loop or
burst concurrency per replica, or for Poisson arrivals the fixed point of
Little's law b = rate x (time a request holds a slot).

Queueing: Poisson waits for a slot (Sakasegawa's M/M/c approximation, c = the
replica's slots) and for the prefill "server" (M/D/1); closed loops and bursts
wait in line for a slot (Little's law), and a closed loop's first wave, whose
clients start together, for each other's prefills. p99s: exponential tail for Poisson
waits; binomial spread of prefill-carrying steps over a request's tokens for
TPOT, at most the chunk-carrying step.

Smoothing for gradients (the sensitivity view): the chunk count uses a
straight-through ceil (exact value, gradient of the unrounded count);
min/max pass the gradient of the binding term; the KV footprint is not
rounded to blocks here (stage 3 rounds).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from jaxplan.physics.batch import StepBatch
from jaxplan.physics.memory import kv_budget_bytes_per_gpu, smooth_request_kv_bytes_per_gpu
from jaxplan.physics.shapes import Hardware, Layout, ModelShape
from jaxplan.physics.step_time import step_times_s
from jaxplan.physics.traffic import P99_Z, WorkloadParams

SECANT_ITERATIONS = 2  # evaluations of slot_time(b) per Poisson solve, inside the knot interval holding the root
GRID_KNOTS = 46  # knots at b_max x (i / 47)^2, i = 1..46, besides the ends and the kinks (`knots`)
CEIL_JUMPS = 4  # jumps of the prefill chunk count (under a shrinking chunk) that get knots
KINK_SPREAD = 2e-5  # each kink gets two knots, this much (relative) either side: float32 rounding of where it is
LN_100 = 4.605  # p99 of an exponential = mean x ln(100)
P99_TAIL = 0.01  # the share of requests above a p99

BOUND_MAX_NUM_SEQS, BOUND_KV_CACHE, BOUND_TOKEN_BUDGET, BOUND_DEMAND = 0, 1, 2, 3
BOUND_NAMES = ("max_num_seqs", "KV cache", "token budget", "demand")


class Estimate(NamedTuple):
    """Per candidate; times in seconds, rates per second, whole deployment unless noted."""

    output_tokens_per_s: jnp.ndarray
    requests_per_s: jnp.ndarray
    ttft_mean_s: jnp.ndarray
    ttft_p99_s: jnp.ndarray
    tpot_mean_s: jnp.ndarray
    tpot_p99_s: jnp.ndarray
    concurrency_per_replica: jnp.ndarray  # b
    max_concurrency_per_replica: jnp.ndarray  # b_max (slots the replica can run)
    utilization: jnp.ndarray  # Poisson: demand / capacity (>= 1: cannot keep up); else b / b_max
    bound: jnp.ndarray  # int32 BOUND_* code: what limits b


def ste_ceil(x):
    """ceil(x) in value, identity in gradient."""
    return x + jax.lax.stop_gradient(jnp.ceil(x - 1e-4) - x)


class _Steps(NamedTuple):
    mean_s: jnp.ndarray  # mean step time
    decode_s: jnp.ndarray  # step without a prefill chunk
    chunk_s: jnp.ndarray  # step carrying a prefill chunk
    chunk_fraction: jnp.ndarray  # f: of the replica's steps (of its lock-step group's, under lock-step DP)
    prefill_s: jnp.ndarray  # a request's prefill (all its chunks): what it costs its slot
    prefill_latency_s: jnp.ndarray  # its wall time: under PP one budget per step (>= prefill_s)
    chunk_tokens: jnp.ndarray  # prefill tokens a chunk step carries
    prompt_chunk_steps: jnp.ndarray  # chunk steps one prompt's prefill work is counted over: max(ISL / chunk, 1)
    work_s: jnp.ndarray  # a request's prefill work alone: prefill_s less the decode steps its chunks ride
    light_s: jnp.ndarray | None = None  # a decode step of one request (`wave_makespan_s`'s s(1)); None unless asked


def _light_batch(w: WorkloadParams, b) -> StepBatch:
    """A decode step of one request at the mean context (`wave_makespan_s`'s s(1)), shaped like b."""
    return StepBatch.decode_only(1.0 + 0.0 * b, w.isl_tokens + 0.5 * w.osl_tokens)


def _stacked(*trees):
    """The trees' leaves stacked along a new leading axis (broadcast to one shape first)."""
    return jax.tree.map(lambda *leaves: jnp.stack(jnp.broadcast_arrays(*leaves)), *trees)


def _steps(model, hw, layout, w: WorkloadParams, b, with_light: bool = False) -> _Steps:
    """The steps a replica of b running requests takes; with_light: also the one-request decode step."""
    isl_eff = w.isl_tokens * (1.0 - w.prefix_hit_rate)
    cached = w.isl_tokens * w.prefix_hit_rate
    room = jnp.maximum(layout.pipeline_parallel_size * layout.max_num_batched_tokens - b, 1.0)
    # Prefill tokens a step carries: one prompt (or what room is left), or, once b / OSL prompts start
    # per step (few output tokens per request), that many prompts' tokens in one step, as the budget
    # allows (several prompts' also under PP).
    chunk = jnp.minimum(room, jnp.maximum(isl_eff, b / w.osl_tokens * isl_eff))
    # Under PP each micro-batch has its own budget, but one request sits in one micro-batch: its
    # own chunk per replica step is at most one budget (the replay's scheduler does the same).
    own_chunk = jnp.minimum(chunk, layout.max_num_batched_tokens)
    decode_context = b * (w.isl_tokens + 0.5 * w.osl_tokens)
    decode = StepBatch.decode_only(b, decode_context)
    # The chunks' cached context: a prompt split into n chunks (the last one partial) has its hit and
    # i chunks before its i-th, spread over the chunk steps it is counted over; a step of several whole
    # prompts holds each one's hit.
    pieces = ste_ceil(isl_eff / chunk)  # the prompt's chunks
    prompts_per_step = chunk / jnp.maximum(isl_eff, 1.0)  # below 1: the share of a prompt a chunk step carries
    context = prompts_per_step * jnp.where(chunk < isl_eff, pieces * cached + 0.5 * chunk * pieces * (pieces - 1.0), cached)
    with_chunk = decode.merged(StepBatch(chunk, 0.0 * b, 0.0 * b, chunk * (cached + 0.5 * isl_eff), 1.0 + 0.0 * b, context))
    fraction = jnp.clip(b / w.osl_tokens * isl_eff / chunk, 0.0, 1.0)
    # Lock-step DP ranks (a MoE model's --data-parallel-size) step together: a group step carries a
    # chunk, and lasts a chunk step, whenever any of its D ranks does, 1 - (1 - f)^D of the steps,
    # and the expert layers then see the chunks of the D f / (1 - (1 - f)^D) ranks that carry one.
    ranks = layout.lockstep_ranks
    lockstep = ranks > 1
    group_fraction = jnp.where(lockstep, 1.0 - jnp.power(1.0 - fraction, ranks), fraction)
    chunk_ranks = jnp.maximum(ranks * fraction / jnp.maximum(group_fraction, 1e-9), 1.0)
    # The steps in one call (`step_times_s`); a decode step's expert layers see every rank's decodes.
    batches = [decode, with_chunk]
    group_tokens = [decode.decode_tokens * ranks, jnp.where(lockstep, ranks * b + chunk_ranks * chunk, (b + chunk) * ranks)]
    if with_light:
        batches.append(_light_batch(w, b))
        group_tokens.append(batches[-1].decode_tokens * ranks)
    times = step_times_s(model, hw, layout, _stacked(*batches), _stacked(*group_tokens))
    decode_s, chunk_s = times[0], times[1]
    fraction = group_fraction
    mean_s = fraction * chunk_s + (1.0 - fraction) * decode_s
    # Every chunk step pays the decode step's cost; the prefill work itself is paid once over all
    # chunks (the last chunk is partial: an 8,192-token prompt next to 4 decodes takes 2 steps). A
    # prompt that shares its step with other prompts holds its slot for the whole step.
    prompt_chunk_steps = jnp.maximum(isl_eff / chunk, 1.0)
    work_s = prompt_chunk_steps * (chunk_s - decode_s)
    prefill_s = pieces * decode_s + work_s
    # The slot time (and with it b, throughput and TPOT) counts a step's prefill capacity; the first
    # token waits for the prompt's own chunks, one budget per step (equal to prefill_s without PP).
    latency_s = ste_ceil(isl_eff / own_chunk) * decode_s + work_s
    return _Steps(mean_s, decode_s, chunk_s, fraction, prefill_s, latency_s, chunk, prompt_chunk_steps, work_s, times[2] if with_light else None)


def slot_time_s(steps: _Steps, w: WorkloadParams):
    """Time a request holds a slot: its prefill plus (OSL - 1) further steps."""
    return steps.prefill_s + (w.osl_tokens - 1.0) * steps.mean_s


def admission_limit(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization):
    """Requests the engine admits at once: KV for their prompts (not their mean context), max_num_seqs."""
    free = jnp.maximum(kv_budget_bytes_per_gpu(model, hw, layout, gpu_memory_utilization), 0.0)
    prompts = free / smooth_request_kv_bytes_per_gpu(model, layout, w.isl_tokens + 1.0)
    return jnp.minimum(layout.max_num_seqs, prompts)


def max_concurrency(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization):
    """(b_max, bound code): slots a replica can run, and which limit binds."""
    isl_eff = w.isl_tokens * (1.0 - w.prefix_hit_rate)
    free = kv_budget_bytes_per_gpu(model, hw, layout, gpu_memory_utilization)
    kv_cap = jnp.maximum(free, 0.0) / smooth_request_kv_bytes_per_gpu(model, layout, w.isl_tokens + 0.5 * w.osl_tokens)
    budget_cap = layout.pipeline_parallel_size * layout.max_num_batched_tokens * w.osl_tokens / (w.osl_tokens + isl_eff)
    caps = jnp.stack(jnp.broadcast_arrays(layout.max_num_seqs, kv_cap, budget_cap))
    return jnp.min(caps, axis=0), jnp.argmin(caps, axis=0).astype(jnp.int32)


class Prepared(NamedTuple):
    """What the estimate needs that does not depend on the demand per replica (DP, rate, concurrency):
    computed once per (GPU, TP, PP, knobs, dtypes) and shared by every DP value. Fields [C], but the
    knot tables [K, R]: R rows (one per configuration), K = 10 + 2 CEIL_JUMPS + GRID_KNOTS = 64 knots each,
    that candidates reference by `knot_row` (so C candidates of one configuration share a row and
    stage 4 reads ~9 values of it per candidate instead of gathering the whole table)."""

    b_max: jnp.ndarray
    bound: jnp.ndarray
    full_slot_s: jnp.ndarray  # slot time at b_max
    admission: jnp.ndarray  # admission_limit
    knot_b: jnp.ndarray  # [K, R] concurrencies in [low_b, b_max], ascending along K (see `knots`)
    knot_slot_s: jnp.ndarray  # [K, R] slot time there (s)
    knot_rate: jnp.ndarray  # [K, R] running max over knots of b / slot time: requests/s per replica
    knot_row: jnp.ndarray  # [C] int32: the candidate's row of the knot tables

    def take(self, index) -> "Prepared":
        """The Prepared of candidates whose demand-independent part is row `index` [C'] of this one
        (int32); the knot tables stay shared."""
        pick = lambda x: x[index]  # noqa: E731
        return self._replace(b_max=pick(self.b_max), bound=pick(self.bound), full_slot_s=pick(self.full_slot_s),
                             admission=pick(self.admission), knot_row=pick(self.knot_row))


def knots(layout: Layout, w: WorkloadParams, low_b, b_max):
    """[K, C] concurrencies at which `prepare` prices the slot time, so that slot_time(b) is smooth and
    nearly quadratic between neighbouring knots: the ends low_b and b_max; the kinks of slot_time(b);
    and GRID_KNOTS points b_max (i / (GRID_KNOTS + 1))^2 (denser at small b, where MoE expert coverage
    bends the step time). Kinks (they mirror `_steps`: keep them in step with it; tests/test_solver.py
    checks the accuracy): prefill saturation (the chunk fraction f reaches 1 at b = OSL x chunk /
    ISL_eff while the chunk is the whole prompt or budget), the chunk starting to shrink with the room
    the decodes leave (b = PP x budget - ISL_eff, or - budget), and the first CEIL_JUMPS jumps of the
    chunk count ceil(ISL_eff / chunk) (tokens) at b >= 0; two knots per kink, KINK_SPREAD either side, so that the
    piece holding a kink is tiny and the others are smooth. Each clipped to [low_b, b_max]; not sorted."""
    isl_eff = w.isl_tokens * (1.0 - w.prefix_hit_rate)
    tokens = layout.pipeline_parallel_size * layout.max_num_batched_tokens
    full_chunk = jnp.minimum(layout.max_num_batched_tokens, isl_eff)
    kinks = [w.osl_tokens * full_chunk / jnp.maximum(isl_eff, 1e-6), w.osl_tokens, tokens - isl_eff, tokens - layout.max_num_batched_tokens]
    # The count jumps from j to j + 1 at b = tokens - ISL_eff / j, at b >= 0 from j = ceil(ISL_eff /
    # tokens) on: a prompt longer than the room has its first jumps below 0, where knots are wasted.
    first = jnp.maximum(jnp.ceil(isl_eff / jnp.maximum(tokens, 1.0) - 1e-4), 1.0)
    kinks += [tokens - isl_eff / (first + jumps + 1e-4) for jumps in range(CEIL_JUMPS)]  # ste_ceil's 1e-4
    grid = [b_max * (i / (GRID_KNOTS + 1.0)) ** 2 for i in range(1, GRID_KNOTS + 1)]
    spread = [b * (1.0 + side * KINK_SPREAD) for b in kinks for side in (-1.0, 1.0)]
    return jnp.stack([low_b, b_max] + [jnp.clip(b, low_b, b_max) for b in spread + grid])


def _slot_times_s(model, hw, layout, w, b):
    """slot_time_s at concurrencies b [K, C] in one vectorised call. (Under bench_baseline.py's scalar
    shim, jnp.stack makes a list of K Python floats: priced one by one.)"""
    if isinstance(b, list):
        return [_slot_times_s(model, hw, layout, w, x) for x in b]
    # A leading unit axis on every array field (explicit broadcasting against the knot axis).
    model, hw, layout, w = (t._make(x[None] if jnp.ndim(x) else x for x in t) for t in (model, hw, layout, w))
    return slot_time_s(_steps(model, hw, layout, w, b), w)


def prepare(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization, capacity=None) -> Prepared:
    """The demand-independent part of `estimate` (ignores layout.data_parallel_size)."""
    b_max, bound = capacity if capacity is not None else max_concurrency(model, hw, layout, w, gpu_memory_utilization)
    b_max = jnp.maximum(b_max, 1e-3)
    knot_b = knots(layout, w, jnp.minimum(b_max, 1e-2), b_max)  # [K, ...C]
    knot_slot_s = _slot_times_s(model, hw, layout, w, knot_b)
    full_slot_s = knot_slot_s[1]
    order = jnp.argsort(knot_b, axis=0)
    knot_b, knot_slot_s = (jnp.take_along_axis(x, order, axis=0) for x in (knot_b, knot_slot_s))
    rows = jnp.size(b_max)
    table = lambda x: jnp.reshape(x, (x.shape[0], rows))  # noqa: E731
    return Prepared(
        b_max, bound, full_slot_s, admission_limit(model, hw, layout, w, gpu_memory_utilization),
        table(knot_b), table(knot_slot_s), table(jnp.maximum.accumulate(knot_b / knot_slot_s, axis=0)),
        jnp.reshape(jnp.arange(rows, dtype=jnp.int32), jnp.shape(b_max)),
    )


def _knot_bracket(rate, prep: Prepared):
    """(b_lo, g_lo, b_hi, g_hi) [C]: the neighbouring knots around the smallest root of
    g(b) = rate x slot_time(b) - b. g < 0 at a knot iff rate < b / slot time there, so the first knot
    with g < 0 is the first whose running max `knot_rate` exceeds the rate: a binary search of
    log2(K) probes. b_hi is that knot, b_lo the one before (g >= 0 there); both low_b where
    g(low_b) < 0, both b_max where g >= 0 at every knot (saturated)."""
    num_knots = prep.knot_rate.shape[0]
    row = prep.knot_row
    below = jnp.zeros(jnp.shape(row), jnp.int32)  # knots whose running max is <= rate
    step = 1 << (num_knots.bit_length() - 1)
    while step:  # over the bits of K, not over candidates
        probe = jnp.minimum(below + step, num_knots)
        below = jnp.where((below + step <= num_knots) & (prep.knot_rate[probe - 1, row] <= rate), probe, below)
        step >>= 1
    lo, hi = jnp.maximum(below - 1, 0), jnp.minimum(below, num_knots - 1)
    b_lo, b_hi = prep.knot_b[lo, row], prep.knot_b[hi, row]
    return b_lo, rate * prep.knot_slot_s[lo, row] - b_lo, b_hi, rate * prep.knot_slot_s[hi, row] - b_hi


def _regula_falsi(b_lo, g_lo, b_hi, g_hi):
    """Root of the chord through (b_lo, g_lo) and (b_hi, g_hi), clipped to [b_lo, b_hi]."""
    slope_free = jnp.where(g_hi == g_lo, -1e-9, g_hi - g_lo)
    return jnp.clip(b_lo - g_lo * (b_hi - b_lo) / slope_free, b_lo, b_hi)


def _next_point(b_lo, g_lo, b_hi, g_hi, b_old, g_old):
    """Inverse quadratic interpolation through the bracket's ends and the point last dropped from it
    (b at g = 0 of the quadratic b(g)) when it lands strictly inside the bracket, else regula falsi.
    Denominators that vanish (a repeated value, as at the start) are replaced before dividing, so
    the unused branch stays finite (no NaN in the value or the gradient)."""
    scale = g_lo * g_lo + g_hi * g_hi + 1e-30
    dens = (g_lo - g_hi, g_lo - g_old, g_hi - g_old)
    usable = [d * d > 1e-12 * scale for d in dens]
    d_lh, d_lo, d_ho = (jnp.where(ok, d, 1.0) for ok, d in zip(usable, dens))
    quadratic = b_lo * g_hi * g_old / (d_lh * d_lo) - b_hi * g_lo * g_old / (d_lh * d_ho) + b_old * g_lo * g_hi / (d_lo * d_ho)
    inside = usable[0] & usable[1] & usable[2] & (quadratic > b_lo) & (quadratic < b_hi)
    return jnp.where(inside, quadratic, _regula_falsi(b_lo, g_lo, b_hi, g_hi))


def _saturated(rate, prep: Prepared):
    """Whether the demand reaches b_max before Little's law balances (g >= 0 at b_max)."""
    return rate * prep.full_slot_s - prep.b_max >= 0


def poisson_concurrency(model, hw, layout, w, rate, prep: Prepared):
    """Solve Little's law b = rate x slot_time(b) for its smallest root (b_max when saturated).

    slot_time(b) is smooth but for kinks (prefill saturation, the chunk shrinking with the room the
    decodes leave) and small jumps (the chunk count), and between those close to affine; a MoE batch
    bends it at small b (expert coverage). `prepare` prices it at knots placed on every kink and on a
    grid (`knots`), so the root's bracket comes from the knots for free and holds a smooth piece.
    Inside it, SECANT_ITERATIONS steps of safeguarded inverse quadratic interpolation (regula falsi
    first), and one more interpolated point that needs no evaluation, give b within 1e-3 relative of
    the converged root on tests/test_solver.py's cases (median ~1e-7).

    Its derivative is the root's, by the implicit function theorem (db = -dg / (dg/db) at the root;
    b_max's where saturated), not the iterations': near convergence the interpolation's points
    nearly coincide, and differentiating through them gave slopes that moved by half with float
    rounding (tests/test_sensitivity.py). The values are the iterations'.
    """

    def g(hw, layout, w, rate, b):
        return rate * slot_time_s(_steps(model, hw, layout, w, b), w) - b

    @jax.custom_jvp
    def solve(hw, layout, w, rate, prep):
        b_lo, g_lo, b_hi, g_hi = _knot_bracket(rate, prep)
        saturated = _saturated(rate, prep)

        def step(_, carry):  # the new point replaces the bracket's end of its sign
            b_lo, g_lo, b_hi, g_hi, _, _ = carry
            b = _next_point(*carry)
            g_b = g(hw, layout, w, rate, b)
            above = g_b >= 0
            dropped_b, dropped_g = jnp.where(above, b_lo, b_hi), jnp.where(above, g_lo, g_hi)
            b_lo, g_lo = jnp.where(above, b, b_lo), jnp.where(above, g_b, g_lo)
            b_hi, g_hi = jnp.where(above, b_hi, b), jnp.where(above, g_hi, g_b)
            return b_lo, g_lo, b_hi, g_hi, dropped_b, dropped_g

        # A loop, not unrolled: 8 unrolled steps made XLA compile the gradient for minutes.
        carry = jax.lax.fori_loop(0, SECANT_ITERATIONS, step, (b_lo, g_lo, b_hi, g_hi, b_lo, g_lo))
        return jnp.where(saturated, prep.b_max, _next_point(*carry))

    def solve_jvp(primals, tangents):
        hw, layout, w, rate, prep = primals
        b = solve(*primals)
        # g's tangent along the inputs that carry one (symbolic zeros are skipped: a sensitivity
        # moves only the workload, and differentiating every hardware field too doubled the compile).
        leaves, tree = jax.tree.flatten((hw, layout, w, rate))
        leaf_tangents = tree.flatten_up_to(tuple(tangents[:4]))
        live = [i for i, t in enumerate(leaf_tangents) if not isinstance(t, SymbolicZero)]

        def g_of_live(*values):
            merged = list(leaves)
            for i, value in zip(live, values):
                merged[i] = value
            return g(*jax.tree.unflatten(tree, merged), b)

        residual, dg = jax.jvp(g_of_live, [leaves[i] for i in live], [leaf_tangents[i] for i in live])
        _, slope = jax.jvp(lambda b: g(hw, layout, w, rate, b), (b,), (jnp.ones_like(b),))
        # At the smallest root g falls through zero (slope < 0); the floor keeps b's derivative finite
        # where the slope nears zero (on the edge of saturation), and b at the lowest knot, where g is
        # already negative, is no root: it does not move.
        db = -dg / jnp.minimum(slope, -1e-3)
        saturated = _saturated(rate, prep)
        is_root = jnp.abs(residual) <= 1e-2 * jnp.maximum(b, 1.0)
        b_max_dot = tangents[4].b_max
        b_max_dot = jnp.zeros_like(b) if isinstance(b_max_dot, SymbolicZero) else b_max_dot
        return b, jnp.where(saturated, b_max_dot, jnp.where(is_root, db, 0.0))

    solve.defjvp(solve_jvp, symbolic_zeros=True)
    return solve(hw, layout, w, rate, prep)


def wave_makespan_s(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, steps: _Steps, b, requests):
    """Seconds a replica takes for `requests` that all arrive at once, b of them running (the rest
    wait in line, one slot time per b): the line, then the last b prefill (their chunk steps, each
    priced whole) and decode while the batch shrinks as they finish. A decode step is priced as the line through
    one request and b requests, s(n) = s(1) + s1 (n - 1) (step_time_s at both ends), so the shrinking
    batch costs s(1) per step until the longest output is done (OSL x `longest_output_factor` steps)
    plus s1 per output token beyond one a step (b x OSL tokens, at least one a step). A steady state of b running requests, which
    leaves out the drain, is 2-3x too fast for a burst of ShareGPT prompts (A100 runs in ../shared).
    `steps`: `_steps(..., with_light=True)`, which prices s(1) with the other steps."""
    light_s = steps.light_s
    line_s = jnp.maximum(requests - b, 0.0) * slot_time_s(steps, w) / jnp.maximum(b, 1e-3)
    # Every drain step holds the longest request, so its steps carry at least as many tokens as there
    # are steps: light_s per step plus s1 = (s(b) - s(1)) / (b - 1) per token beyond one a step. The
    # b prompts' chunk steps are priced whole (chunk_s each) and the decode steps they stand in for
    # taken out of the decode part, never below none: written in s(1), s(b) and chunk_s, every weight
    # is >= 0, so a faster GPU never lengthens the drain (the chunk's work alone, chunk_s - s(b), would
    # weigh s(b) negatively where the chunk steps outnumber the decode tokens: few outputs, big bursts).
    drain_steps = w.osl_tokens * w.longest_output_factor
    drain_tokens = jnp.maximum(b * w.osl_tokens, drain_steps)
    chunk_steps = b * steps.prompt_chunk_steps
    per_token = (drain_tokens - drain_steps) / jnp.maximum(b - 1.0, 1e-3)  # s(b)'s weight in the decode part
    drain_s = (chunk_steps * steps.chunk_s + jnp.maximum(per_token - chunk_steps, 0.0) * steps.decode_s
               + (drain_steps - per_token) * light_s)
    return line_s + drain_s


def run_drain_s(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, b):
    """Seconds until the b requests a replica holds (`Estimate.concurrency_per_replica`) are done once
    no more arrive: the end of a finite open-loop run, timed as `wave_makespan_s` of b requests."""
    return wave_makespan_s(model, hw, layout, w, _steps(model, hw, layout, w, b, with_light=True), b, b)


def _p99_share(wave):
    """How far into its wait the p99 request of a run is when `wave` of its requests (a fraction) arrive
    together and wait for one another: the slowest 1% / wave of them wait longest, so 0 while the wave
    holds at most 1% of the run, nearly all of it once the run is one wave."""
    return 1.0 - P99_TAIL / jnp.maximum(wave, P99_TAIL)


def as_finite_run(w: WorkloadParams, layout: Layout, prep: Prepared) -> WorkloadParams:
    """`w` as a finite benchmark run: Poisson arrivals faster than a replica serves them (no steady
    state) of no more requests per replica than it has slots become one wave of num_requests clients
    that start together, which is what such a run is (vLLM admits each request as it arrives; nothing
    queues for a slot). `predict_rows` predicts measured rows so (its `all_at_once`); the fit calls
    this so that it sees the same rows instead of an infinite TTFT. Planning keeps the steady state:
    the funnel never calls this."""
    dp = layout.data_parallel_size
    overloaded = w.request_rate_per_s / dp * prep.full_slot_s >= prep.b_max
    flood = (w.arrival_code == 0) & overloaded & (w.num_requests / dp <= prep.b_max)
    return w._replace(arrival_code=jnp.where(flood, 2.0, w.arrival_code), concurrency=jnp.where(flood, w.num_requests, w.concurrency),
                      request_rate_per_s=jnp.where(flood, 0.0, w.request_rate_per_s))


def estimate(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization, capacity=None, prepared: Prepared | None = None) -> Estimate:
    """Steady-state estimate per candidate (elementwise over [C]).

    `capacity` = max_concurrency(...) and `prepared` = prepare(...) may be passed in when known."""
    prep = prepared if prepared is not None else prepare(model, hw, layout, w, gpu_memory_utilization, capacity)
    b_max, bound, full_slot_s = prep.b_max, prep.bound, prep.full_slot_s
    dp = layout.data_parallel_size
    rate = w.request_rate_per_s / dp
    poisson = w.arrival_code == 0

    # A run never holds more requests in flight than it has (num_requests per replica).
    b_poisson = jnp.minimum(poisson_concurrency(model, hw, layout, w, rate, prep), jnp.maximum(w.num_requests / dp, 1e-3))
    b_closed = jnp.minimum(b_max, jnp.maximum(w.concurrency / dp, 1e-3))
    b = jnp.where(poisson, b_poisson, b_closed)
    bound = jnp.where(b < 0.999 * b_max, BOUND_DEMAND, bound)

    steps = _steps(model, hw, layout, w, b, with_light=True)
    slot_s = slot_time_s(steps, w)
    utilization = jnp.where(poisson, rate * full_slot_s / b_max, b / b_max)

    # Waiting before prefill starts.
    rho = jnp.clip(utilization, 0.0, 0.999)
    slot_wait = slot_s / b_max * rho ** (jnp.sqrt(2.0 * (b_max + 1.0)) - 1.0) / (1.0 - rho)
    # The prefill "server" is the token budget the decodes leave (vLLM packs several prompts' chunks into
    # one step): its load is the prompt tokens arriving per step over that room. (The share of steps
    # that carry a chunk is 1 whenever a prompt arrives every step, however little of the room they use.)
    room = jnp.maximum(layout.pipeline_parallel_size * layout.max_num_batched_tokens - b, 1.0)
    isl_eff = w.isl_tokens * (1.0 - w.prefix_hit_rate)
    prefill_rho = jnp.clip(b / w.osl_tokens * isl_eff / room, 0.0, 0.999)
    prefill_wait = prefill_rho / (2.0 * (1.0 - prefill_rho)) * steps.prefill_s
    poisson_wait = slot_wait + prefill_wait
    # A burst's admitted prompts all arrive at once: a backlog that fills each step's room (a decode
    # step plus room tokens at the chunk's cost per token) until it is prefilled. The prompt served
    # last waits for all of it, the mean one half. Only that first wave (b of the burst's requests per
    # replica) meets it; the rest are admitted one by one as slots free, and wait in line instead.
    per_token_s = jnp.maximum(steps.chunk_s - steps.decode_s, 0.0) / jnp.maximum(steps.chunk_tokens, 1.0)
    full_step_s = steps.decode_s + room * per_token_s
    burst_backlog_s = b * isl_eff * full_step_s / room
    burst_wave = jnp.clip(b / jnp.maximum(w.num_requests / dp, 1e-3), 0.0, 1.0)
    # Closed loop / burst: requests beyond what the engine admits wait in line. vLLM admits a request
    # while its prompt's blocks fit (not its mean context): the excess over the steady-state b is
    # admitted and later preempted, which slows throughput (b) rather than the first token.
    admitted = jnp.maximum(b, prep.admission)
    queued = jnp.maximum(w.concurrency / dp - admitted, 0.0)
    line_wait = queued * slot_s / b
    burst = w.arrival_code == 1
    # Closed loops and bursts: arrivals follow completions, so the prefill "server" has no Poisson
    # queue; a new prompt finds another one prefilling with probability f and waits half of it.
    # Prompts that share their steps (several per step) do not queue behind one another: no such wait.
    alone = jnp.minimum(w.isl_tokens * (1.0 - w.prefix_hit_rate) / steps.chunk_tokens, 1.0)
    busy_wait = 0.5 * steps.chunk_fraction * steps.prefill_s * alone
    # Closed-loop benchmark clients all start at t = 0: that first wave of b prompts per replica arrives
    # together and each waits, on average, for half the others' prefill. Later requests arrive as the
    # earlier ones finish, apart (jaxplan.replay.clients). The wave is concurrency / num_requests of
    # the run; its slowest 1% / wave of requests wait longest, so the p99 falls inside the wave once
    # it holds more than 1% of the run.
    closed = w.arrival_code == 2
    wave = jnp.where(closed, jnp.clip(w.concurrency / jnp.maximum(w.num_requests, 1.0), 0.0, 1.0), 0.0)
    wave_prefill_s = jnp.maximum(b - 1.0, 0.0) * steps.prefill_s * alone  # prompts sharing steps prefill together
    wave_wait = wave * 0.5 * wave_prefill_s
    wave_wait_p99 = _p99_share(wave) * wave_prefill_s
    burst_wait = burst_wave * 0.5 * burst_backlog_s
    burst_wait_p99 = _p99_share(burst_wave) * burst_backlog_s
    wait_mean = jnp.where(poisson, poisson_wait, jnp.where(burst, 0.5 * line_wait + burst_wait, line_wait) + busy_wait + wave_wait)
    # A burst's slowest requests are either the first wave's last prompts or the last in line.
    wait_p99 = jnp.where(poisson, LN_100 * poisson_wait,
                         jnp.where(burst, jnp.maximum(line_wait, burst_wait_p99), line_wait) + steps.chunk_fraction * steps.prefill_s * alone + wave_wait_p99)
    # A new request first waits for the step in flight (half a step on average), then its chunks;
    # the API server's per-request work (tokenise, detokenise, HTTP) comes on top.
    first_token_s = 0.5 * steps.mean_s + steps.prefill_latency_s + hw.request_overhead_s
    ttft_mean = wait_mean + first_token_s
    ttft_p99 = wait_p99 + steps.mean_s + steps.prefill_latency_s * w.max_context_factor + hw.request_overhead_s
    overloaded = poisson & (utilization >= 1.0)
    ttft_mean = jnp.where(overloaded, jnp.inf, ttft_mean)
    ttft_p99 = jnp.where(overloaded, jnp.inf, ttft_p99)

    # The floor keeps the gradient finite where f is clipped to 0 or 1 (sqrt'(0) = inf times 0 is NaN).
    variance = jnp.maximum(steps.chunk_fraction * (1.0 - steps.chunk_fraction) / w.osl_tokens, 1e-12)
    spread = (steps.chunk_s - steps.decode_s) * jnp.sqrt(variance)
    # A closed loop's clients each wait for their request: by Little's law a request's whole time is
    # clients / requests per second, so its first token comes no sooner than that less its decode
    # steps (binds where prompts queue for the token budget rather than for slots, e.g. one output token).
    # (In steady state, after the first wave: its wait comes on top.)
    little_ttft = w.concurrency / dp * slot_s / jnp.maximum(b, 1e-3) - (w.osl_tokens - 1.0) * steps.mean_s + hw.request_overhead_s
    ttft_mean = jnp.where(closed & ~overloaded, jnp.maximum(ttft_mean - wave_wait, little_ttft) + wave_wait, ttft_mean)
    ttft_p99 = jnp.maximum(ttft_p99, ttft_mean)
    # In the first wave the prompts are prefilled before the decodes start: those steps count
    # towards TTFT, and the decode steps carry no prefill.
    tpot_mean = wave * steps.decode_s + (1.0 - wave) * steps.mean_s
    # A request's TPOT averages its steps, so it never exceeds a step that carries a chunk: the normal
    # approximation's tail past that (few output tokens, most steps with a chunk) is cut there. Without
    # the cut, faster memory (shorter decode steps, a wider spread) could raise the p99 while every
    # step got shorter.
    tpot_p99 = jnp.minimum(tpot_mean + P99_Z * spread, jnp.maximum(steps.chunk_s, tpot_mean))
    # A stable open loop serves exactly what arrives; otherwise b requests share the slot time.
    served = dp * w.osl_tokens * b / slot_s
    # A run that is one wave (a burst, or a closed loop with a client per request) is not refilled: it
    # drains, and lasts until its longest request is done (`wave_makespan_s`).
    per_replica = w.concurrency / dp
    one_wave = burst | (closed & (per_replica >= w.num_requests / dp))
    makespan_s = wave_makespan_s(model, hw, layout, w, steps, b, per_replica)
    served = jnp.where(one_wave, dp * w.osl_tokens * per_replica / makespan_s, served)
    throughput = jnp.where(poisson & (utilization < 1.0), w.request_rate_per_s * w.osl_tokens, served)
    return Estimate(
        output_tokens_per_s=throughput,
        requests_per_s=throughput / w.osl_tokens,
        ttft_mean_s=ttft_mean,
        ttft_p99_s=ttft_p99,
        tpot_mean_s=tpot_mean,
        tpot_p99_s=tpot_p99,
        concurrency_per_replica=b,
        max_concurrency_per_replica=b_max,
        utilization=utilization,
        bound=bound,
    )
