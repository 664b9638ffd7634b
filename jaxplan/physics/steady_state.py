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
wait in line for a slot (Little's law). p99s: exponential tail for Poisson
waits; binomial spread of prefill-carrying steps over a request's tokens for
TPOT.

Smoothing for gradients (the sensitivity view): the chunk count uses a
straight-through ceil (exact value, gradient of the unrounded count);
min/max pass the gradient of the binding term; the KV footprint is not
rounded to blocks here (stage 3 rounds).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxplan.physics.batch import StepBatch
from jaxplan.physics.memory import kv_budget_bytes_per_gpu, smooth_request_kv_bytes_per_gpu
from jaxplan.physics.shapes import Hardware, Layout, ModelShape
from jaxplan.physics.step_time import step_time_s
from jaxplan.physics.traffic import P99_Z, WorkloadParams

SECANT_ITERATIONS = 8  # Illinois steps: slot_time(b) has kinks (prefill saturation, MoE expert coverage)
LN_100 = 4.605  # p99 of an exponential = mean x ln(100)

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
    chunk_fraction: jnp.ndarray  # f
    prefill_s: jnp.ndarray  # a request's prefill (all its chunks): what it costs its slot
    prefill_latency_s: jnp.ndarray  # its wall time: under PP one budget per step (>= prefill_s)


def _steps(model, hw, layout, w: WorkloadParams, b) -> _Steps:
    isl_eff = w.isl_tokens * (1.0 - w.prefix_hit_rate)
    cached = w.isl_tokens * w.prefix_hit_rate
    room = jnp.maximum(layout.pipeline_parallel_size * layout.max_num_batched_tokens - b, 1.0)
    chunk = jnp.minimum(room, isl_eff)  # prefill tokens a step carries (several prompts' under PP)
    # Under PP each micro-batch has its own budget, but one request sits in one micro-batch: its
    # own chunk per replica step is at most one budget (the replay's scheduler does the same).
    own_chunk = jnp.minimum(chunk, layout.max_num_batched_tokens)
    decode_context = b * (w.isl_tokens + 0.5 * w.osl_tokens)
    decode = StepBatch.decode_only(b, decode_context)
    with_chunk = decode.merged(StepBatch(chunk, 0.0 * b, 0.0 * b, chunk * (cached + 0.5 * isl_eff), 1.0 + 0.0 * b))
    decode_s = step_time_s(model, hw, layout, decode)
    chunk_s = step_time_s(model, hw, layout, with_chunk)
    fraction = jnp.clip(b / w.osl_tokens * isl_eff / chunk, 0.0, 1.0)
    mean_s = fraction * chunk_s + (1.0 - fraction) * decode_s
    # Every chunk step pays the decode step's cost; the prefill work itself is paid once over all
    # chunks (the last chunk is partial: an 8,192-token prompt next to 4 decodes takes 2 steps).
    work_s = isl_eff / chunk * (chunk_s - decode_s)
    prefill_s = ste_ceil(isl_eff / chunk) * decode_s + work_s
    # The slot time (and with it b, throughput and TPOT) counts a step's prefill capacity; the first
    # token waits for the prompt's own chunks, one budget per step (equal to prefill_s without PP).
    latency_s = ste_ceil(isl_eff / own_chunk) * decode_s + work_s
    return _Steps(mean_s, decode_s, chunk_s, fraction, prefill_s, latency_s)


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
    computed once per (GPU, TP, PP, knobs, dtypes) and shared by every DP value. Fields [C]."""

    b_max: jnp.ndarray
    bound: jnp.ndarray
    full_slot_s: jnp.ndarray  # slot time at b_max
    low_b: jnp.ndarray  # the secant's lower bracket
    low_slot_s: jnp.ndarray  # slot time there
    admission: jnp.ndarray  # admission_limit


def prepare(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization, capacity=None) -> Prepared:
    """The demand-independent part of `estimate` (ignores layout.data_parallel_size)."""
    b_max, bound = capacity if capacity is not None else max_concurrency(model, hw, layout, w, gpu_memory_utilization)
    b_max = jnp.maximum(b_max, 1e-3)
    low_b = jnp.minimum(b_max, 1e-2)
    return Prepared(
        b_max, bound,
        slot_time_s(_steps(model, hw, layout, w, b_max), w),
        low_b,
        slot_time_s(_steps(model, hw, layout, w, low_b), w),
        admission_limit(model, hw, layout, w, gpu_memory_utilization),
    )


def poisson_concurrency(model, hw, layout, w, rate, prep: Prepared):
    """Solve Little's law b = rate x slot_time(b) on [b_lo, b_max] by the Illinois method.

    slot_time(b) is piecewise close to affine, but it has kinks (where prefill chunks fill every
    step, where a MoE batch starts touching every expert), and plain regula falsi then keeps one
    end of the bracket fixed and crawls: two steps left b up to 40% short of the root. Illinois
    halves the stale end's value whenever the same end is kept twice, which restores superlinear
    convergence; SECANT_ITERATIONS steps land within a couple of percent of the root.
    """
    b_max = prep.b_max
    b_lo = prep.low_b
    g_lo = rate * prep.low_slot_s - b_lo
    b_hi, g_hi = b_max, rate * prep.full_slot_s - b_max
    saturated = g_hi >= 0

    def step(_, carry):  # regula falsi: keep the root bracketed
        b_lo, g_lo, b_hi, g_hi, kept, b = carry
        b = jnp.clip(b_lo - g_lo * (b_hi - b_lo) / jnp.where(g_hi == g_lo, -1e-9, g_hi - g_lo), b_lo, b_hi)
        g = rate * slot_time_s(_steps(model, hw, layout, w, b), w) - b
        above = g >= 0
        b_lo, g_lo = jnp.where(above, b, b_lo), jnp.where(above, g, g_lo)
        b_hi, g_hi = jnp.where(above, b_hi, b), jnp.where(above, g_hi, g)
        g_hi = jnp.where(above & (kept > 0), 0.5 * g_hi, g_hi)  # Illinois: the same end kept twice
        g_lo = jnp.where(~above & (kept < 0), 0.5 * g_lo, g_lo)
        return b_lo, g_lo, b_hi, g_hi, jnp.where(above, 1, -1), b

    # A loop, not unrolled: 8 unrolled steps made XLA compile the gradient for minutes.
    start = (b_lo, g_lo, b_hi, g_hi, jnp.zeros(jnp.shape(b_hi), jnp.int32), b_hi)
    *_, b = jax.lax.fori_loop(0, SECANT_ITERATIONS, step, start)
    return jnp.where(saturated, b_max, b)


def estimate(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization, capacity=None, prepared: Prepared | None = None) -> Estimate:
    """Steady-state estimate per candidate (elementwise over [C]).

    `capacity` = max_concurrency(...) and `prepared` = prepare(...) may be passed in when known."""
    prep = prepared if prepared is not None else prepare(model, hw, layout, w, gpu_memory_utilization, capacity)
    b_max, bound, full_slot_s = prep.b_max, prep.bound, prep.full_slot_s
    dp = layout.data_parallel_size
    rate = w.request_rate_per_s / dp
    poisson = w.arrival_code == 0

    b_poisson = poisson_concurrency(model, hw, layout, w, rate, prep)
    b_closed = jnp.minimum(b_max, jnp.maximum(w.concurrency / dp, 1e-3))
    b = jnp.where(poisson, b_poisson, b_closed)
    bound = jnp.where(b < 0.999 * b_max, BOUND_DEMAND, bound)

    steps = _steps(model, hw, layout, w, b)
    slot_s = slot_time_s(steps, w)
    utilization = jnp.where(poisson, rate * full_slot_s / b_max, b / b_max)

    # Waiting before prefill starts.
    rho = jnp.clip(utilization, 0.0, 0.999)
    slot_wait = slot_s / b_max * rho ** (jnp.sqrt(2.0 * (b_max + 1.0)) - 1.0) / (1.0 - rho)
    prefill_rho = jnp.clip(steps.chunk_fraction, 0.0, 0.999)
    prefill_wait = prefill_rho / (2.0 * (1.0 - prefill_rho)) * steps.prefill_s
    poisson_wait = slot_wait + prefill_wait
    # Closed loop / burst: requests beyond what the engine admits wait in line. vLLM admits a request
    # while its prompt's blocks fit (not its mean context): the excess over the steady-state b is
    # admitted and later preempted, which slows throughput (b) rather than the first token.
    admitted = jnp.maximum(b, prep.admission)
    queued = jnp.maximum(w.concurrency / dp - admitted, 0.0)
    line_wait = queued * slot_s / b
    burst = w.arrival_code == 1
    # Closed loops and bursts: arrivals follow completions, so the prefill "server" has no Poisson
    # queue; a new prompt finds another one prefilling with probability f and waits half of it.
    busy_wait = 0.5 * steps.chunk_fraction * steps.prefill_s
    # Benchmark clients with fixed lengths stay partly in lock-step: a wave of b prompts arrives
    # together and each waits, on average, for half the others' prefill. `closed_loop_sync_fraction`
    # (calibrated) is how much of that wave survives; the rest behaves like desynchronised arrivals.
    closed = w.arrival_code == 2
    sync = jnp.where(closed, hw.closed_loop_sync_fraction, 0.0)
    wave_wait = sync * 0.5 * jnp.maximum(b - 1.0, 0.0) * steps.prefill_s
    wait_mean = jnp.where(poisson, poisson_wait, jnp.where(burst, 0.5 * line_wait, line_wait) + busy_wait + wave_wait)
    wait_p99 = jnp.where(poisson, LN_100 * poisson_wait, line_wait + steps.chunk_fraction * steps.prefill_s + 2.0 * wave_wait)
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
    # In a lock-step wave the prompts are prefilled before the decodes start: those steps count
    # towards TTFT, and the decode steps carry no prefill.
    tpot_mean = sync * steps.decode_s + (1.0 - sync) * steps.mean_s
    tpot_p99 = tpot_mean + P99_Z * spread
    # A stable open loop serves exactly what arrives; otherwise b requests share the slot time.
    served = dp * w.osl_tokens * b / slot_s
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
