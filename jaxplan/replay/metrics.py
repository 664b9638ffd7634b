"""Metrics: what the replay reports per finalist, computed from a ReplayTrace.

Latencies follow vLLM's benchmark client: TTFT = first token - arrival;
TPOT = (e2e - TTFT) / (output tokens - 1) per request (requests with > 1
output token); ITL pools every gap between consecutive tokens of a request
(its mean is exact; percentiles come from a log-spaced histogram, ~1% bins);
e2e = last token - arrival. Only finished requests count. Throughputs divide
finished requests' tokens by the duration (until the last step of any
replica ended). Goodput counts finished requests meeting both SLOs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan import compile_ahead, program_cache
from jaxplan.replay.clients import scored_requests
from jaxplan.replay.state import ITL_BINS, itl_bin_value
from jaxplan.replay.traffic import request_bucket
from jaxplan.xla_options import ONE_SHOT_COMPILE

PERCENTILES = (50.0, 90.0, 99.0)


class LatencyStats(NamedTuple):
    """Latency distribution over requests (or tokens, for ITL), seconds, each [F]. NaN if empty."""

    mean_s: jnp.ndarray
    p50_s: jnp.ndarray
    p90_s: jnp.ndarray
    p99_s: jnp.ndarray


class ReplayMetrics(NamedTuple):
    """Per-finalist replay results; every field has leading axis [F]."""

    ttft: LatencyStats  # time to first token
    tpot: LatencyStats  # time per output token after the first
    itl: LatencyStats  # inter-token latency (all gaps pooled)
    e2e: LatencyStats  # end-to-end request latency
    ttft_at_slo_percentile_s: jnp.ndarray  # TTFT at the workload's slo_percentile
    tpot_at_slo_percentile_s: jnp.ndarray  # TPOT at the workload's slo_percentile
    output_tokens_per_s: jnp.ndarray  # finished requests' output tokens / duration
    total_tokens_per_s: jnp.ndarray  # finished requests' prompt + output tokens / duration
    request_throughput_per_s: jnp.ndarray  # finished requests / duration
    goodput_req_per_s: jnp.ndarray  # finished requests meeting both SLOs / duration
    slo_attainment: jnp.ndarray  # fraction of all requests meeting both SLOs
    duration_s: jnp.ndarray  # until the last step of any replica ended
    mean_batch_size: jnp.ndarray  # scheduled requests per step, mean over steps
    kv_utilization_mean: jnp.ndarray  # KV blocks in use / num_kv_blocks, mean over steps
    kv_utilization_peak: jnp.ndarray  # most KV blocks in use in one step / num_kv_blocks
    num_preemptions: jnp.ndarray  # int32, all replicas
    num_steps: jnp.ndarray  # int32 scheduler steps, all replicas
    completed: jnp.ndarray  # int32 finished requests
    unfinished: jnp.ndarray  # int32 requests not finished (loop limit, or stalled)
    stalled: jnp.ndarray  # bool: a replica met a request that can never fit its KV cache
    queue_length: jnp.ndarray  # [F, P] requests arrived and never yet scheduled, at series_time_s
    series_time_s: jnp.ndarray  # [F, P] sample times, 0 .. duration_s


def _percentiles(values, valid, ps):
    """Percentiles (numpy's linear rule) over the valid entries of each row. [..., P]; NaN if none."""
    x = jnp.sort(jnp.where(valid, values, jnp.inf), axis=-1)
    n = jnp.sum(valid, axis=-1, keepdims=True)
    fractions = jnp.stack([jnp.asarray(p, jnp.float32) for p in ps]) / 100.0
    pos = fractions.reshape((1,) * (n.ndim - 1) + (-1,)) * jnp.maximum(n - 1, 0).astype(jnp.float32)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    frac = pos - lo
    x_lo = jnp.take_along_axis(x, lo, axis=-1)
    x_hi = jnp.take_along_axis(x, hi, axis=-1)
    return jnp.where(n > 0, x_lo + frac * (x_hi - x_lo), jnp.nan)


def _hist_quantiles(hist, qs):
    """Quantiles (fractions) of a histogram over ITL bins; NaN when empty. [F, Q]."""
    cdf = jnp.cumsum(hist.astype(jnp.float32), axis=-1)
    total = cdf[..., -1:]
    idx = jnp.sum(cdf[:, None, :] < jnp.asarray(qs, jnp.float32)[None, :, None] * total[:, :, None], axis=-1)  # first bin reaching q
    values = itl_bin_value(jnp.clip(idx, 0, ITL_BINS - 1).astype(jnp.float32))
    return jnp.where(total > 0, values, jnp.nan)


# Per-request trace fields [..., R] and the value a request that never arrived has in each.
_NEVER_ARRIVED = {
    "first_token_step": -1, "finish_step": -1, "preemptions": 0, "arrival_s": np.inf, "admit_s": np.nan, "ttft_s": np.nan,
    "e2e_s": np.nan, "replica": -1, "prompt_tokens": 1, "output_tokens": 1,
}  # fmt: skip


def _pad_trace(trace, size: int):
    """The trace with its request axis padded to `size` by requests that never arrived (on the host:
    NumPy, so that no program is compiled per request count)."""
    extra = size - np.shape(trace.prompt_tokens)[-1]
    if extra == 0:
        return trace

    def pad(name):
        x = np.asarray(getattr(trace, name))
        return np.concatenate([x, np.full(x.shape[:-1] + (extra,), _NEVER_ARRIVED[name], x.dtype)], axis=-1)

    return trace._replace(**{name: pad(name) for name in _NEVER_ARRIVED})


@program_cache.jit(options=ONE_SHOT_COMPILE, static_argnames=("series_points",))
def _summarize(trace, num_requests, scored, ttft_slo_s, tpot_slo_s, slo_percentile, *, series_points: int) -> ReplayMetrics:
    """Metrics of a trace whose request axis is padded (past `num_requests`: requests that never arrived);
    `scored` [F, R] bool: the requests the latency distributions count (`clients.scored_requests`)."""
    finished = trace.finish_step >= 0  # [F, R]
    real = (jnp.arange(finished.shape[-1]) < num_requests)[None, :]
    osl = trace.output_tokens[None, :].astype(jnp.float32)
    isl = trace.prompt_tokens[None, :].astype(jnp.float32)
    decode_s = trace.e2e_s - trace.ttft_s
    multi = finished & (osl > 1)
    tpot = decode_s / jnp.maximum(osl - 1, 1)
    # One sort for every per-request distribution: rows TTFT, TPOT, e2e.
    values = jnp.stack([trace.ttft_s, tpot, trace.e2e_s], axis=1)  # [F, 3, R]
    valid = jnp.stack([finished, multi, finished], axis=1) & scored[:, None, :]
    n = jnp.sum(valid, -1)
    means = jnp.where(n > 0, jnp.sum(jnp.where(valid, values, 0.0), -1) / jnp.maximum(n, 1), jnp.nan)
    pct = _percentiles(values, valid, PERCENTILES + (slo_percentile,))  # [F, 3, 4]
    stats = [LatencyStats(means[:, i], pct[:, i, 0], pct[:, i, 1], pct[:, i, 2]) for i in range(3)]
    gaps = jnp.sum(jnp.where(multi, osl - 1, 0.0), -1)
    itl_mean = jnp.where(gaps > 0, jnp.sum(jnp.where(multi, decode_s, 0.0), -1) / jnp.maximum(gaps, 1), jnp.nan)
    itl_q = _hist_quantiles(trace.itl_hist, tuple(q / 100 for q in PERCENTILES))
    itl_stats = LatencyStats(itl_mean, itl_q[:, 0], itl_q[:, 1], itl_q[:, 2])
    active = trace.replica_active
    duration = jnp.max(jnp.where(active, trace.replica_clock_s, 0.0), -1)
    per_s = 1.0 / jnp.maximum(duration, 1e-30)
    met = finished & (trace.ttft_s <= ttft_slo_s) & ((tpot <= tpot_slo_s) | (osl <= 1))
    steps = jnp.sum(jnp.where(active, trace.replica_steps, 0), -1)
    nsteps = jnp.maximum(steps, 1).astype(jnp.float32)
    kv_cap = trace.num_kv_blocks.astype(jnp.float32)
    times = duration[:, None] * jnp.linspace(0.0, 1.0, series_points)[None, :]  # [F, P]
    arrived = jnp.sum(trace.arrival_s[:, None, :] <= times[:, :, None], -1)
    admitted = jnp.sum(trace.admit_s[:, None, :] <= times[:, :, None], -1)
    return ReplayMetrics(
        ttft=stats[0],
        tpot=stats[1],
        itl=itl_stats,
        e2e=stats[2],
        ttft_at_slo_percentile_s=pct[:, 0, 3],
        tpot_at_slo_percentile_s=pct[:, 1, 3],
        output_tokens_per_s=jnp.sum(jnp.where(finished, osl, 0.0), -1) * per_s,
        total_tokens_per_s=jnp.sum(jnp.where(finished, osl + isl, 0.0), -1) * per_s,
        request_throughput_per_s=jnp.sum(finished, -1) * per_s,
        goodput_req_per_s=jnp.sum(met, -1) * per_s,
        slo_attainment=jnp.sum(met, -1) / num_requests.astype(jnp.float32),
        duration_s=duration,
        mean_batch_size=jnp.sum(jnp.where(active, trace.replica_batch_sum, 0.0), -1) / nsteps,
        kv_utilization_mean=jnp.sum(jnp.where(active, trace.replica_kv_sum, 0.0), -1) / nsteps / kv_cap,
        kv_utilization_peak=jnp.max(jnp.where(active, trace.replica_peak_kv_blocks, 0), -1) / kv_cap,
        num_preemptions=jnp.sum(jnp.where(active, trace.replica_preemptions, 0), -1),
        num_steps=steps,
        completed=jnp.sum(finished, -1).astype(jnp.int32),
        unfinished=jnp.sum(real & ~finished, -1).astype(jnp.int32),
        stalled=jnp.any(active & trace.replica_stalled, -1),
        queue_length=(arrived - admitted).astype(jnp.int32),
        series_time_s=times,
    )


def summarize(trace, workload, *, series_points: int = 64) -> ReplayMetrics:
    """ReplayMetrics [F] of a ReplayTrace, against `workload`'s SLOs (inf = none).

    The request axis is padded to `request_bucket(R)` first, so that request counts in one bucket
    share one compiled program."""
    num_r = int(np.shape(trace.prompt_tokens)[-1])
    padded = _pad_trace(trace, request_bucket(num_r))
    scored = scored_requests(trace.arrival_s, workload)
    compile_ahead.wait("replay_summary")
    return _summarize(
        padded,
        jnp.int32(num_r),
        jnp.asarray(np.pad(scored, [(0, 0)] * (scored.ndim - 1) + [(0, padded.arrival_s.shape[-1] - num_r)])),
        jnp.asarray(workload.ttft_slo_s, jnp.float32),
        jnp.asarray(workload.tpot_slo_s, jnp.float32),
        jnp.asarray(workload.slo_percentile, jnp.float32),
        series_points=series_points,
    )


def summarize_ahead(trace_info, workload, *, series_points: int = 64) -> None:
    """Start compiling `summarize`'s program in the background for traces shaped like `trace_info`
    (a ReplayTrace of ShapeDtypeStructs whose request axis is already a bucket, as the replay's are)."""
    host = compile_ahead.on_host(trace_info)  # summarize gets NumPy traces
    scalar = jax.ShapeDtypeStruct((), jnp.float32)
    scored = jax.ShapeDtypeStruct(host.arrival_s.shape, jnp.bool_)
    compile_ahead.ahead("replay_summary", _summarize, host, jax.ShapeDtypeStruct((), jnp.int32), scored, scalar, scalar, scalar, series_points=series_points)
