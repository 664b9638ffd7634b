"""Metrics: what the replay reports per finalist, computed from a ReplayTrace.

Latencies follow vLLM's benchmark client: TTFT = first token - arrival;
TPOT = (e2e - TTFT) / (output tokens - 1) per request (requests with > 1
output token); ITL pools every gap between consecutive tokens of a request
(its mean is exact; percentiles come from a log-spaced histogram, ~1% bins);
e2e = last token - arrival. Only finished requests count. Throughputs divide
finished requests' tokens by the duration (until the last step of any
replica ended). Goodput counts finished requests meeting both SLOs. A burst or closed loop
longer than the replay (the workload's num_requests above the replayed count) is extended to its
whole length (`extension.extend_run`); a Poisson replay's queue is judged (`backlog`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxplan.replay.backlog import Backlog, backlog
from jaxplan.replay.extension import extend_run
from jaxplan.replay.clients import scored_requests
from jaxplan.replay.state import ITL_BINS, itl_bin_value
from jaxplan.specs.workload import Arrival

PERCENTILES = (50.0, 90.0, 99.0)


class LatencyStats(NamedTuple):
    """Latency distribution over requests (or tokens, for ITL), seconds, each [F]. NaN if empty."""

    mean_s: np.ndarray
    p50_s: np.ndarray
    p90_s: np.ndarray
    p99_s: np.ndarray


class ReplayMetrics(NamedTuple):
    """Per-finalist replay results; every field has leading axis [F]."""

    ttft: LatencyStats  # time to first token
    tpot: LatencyStats  # time per output token after the first
    itl: LatencyStats  # inter-token latency (all gaps pooled)
    e2e: LatencyStats  # end-to-end request latency
    ttft_at_slo_percentile_s: np.ndarray  # TTFT at the workload's slo_percentile
    tpot_at_slo_percentile_s: np.ndarray  # TPOT at the workload's slo_percentile
    output_tokens_per_s: np.ndarray  # finished requests' output tokens / duration
    total_tokens_per_s: np.ndarray  # finished requests' prompt + output tokens / duration
    request_throughput_per_s: np.ndarray  # finished requests / duration
    goodput_req_per_s: np.ndarray  # finished requests meeting both SLOs / duration
    slo_attainment: np.ndarray  # fraction of all requests meeting both SLOs
    duration_s: np.ndarray  # until the last step of any replica ended
    mean_batch_size: np.ndarray  # scheduled requests per step, mean over steps
    kv_utilization_mean: np.ndarray  # KV blocks in use / num_kv_blocks, mean over steps
    kv_utilization_peak: np.ndarray  # most KV blocks in use in one step / num_kv_blocks
    num_preemptions: np.ndarray  # int32, all replicas
    num_steps: np.ndarray  # int32 scheduler steps, all replicas
    completed: np.ndarray  # int32 finished requests (of those replayed)
    unfinished: np.ndarray  # int32 requests not finished (loop limit, or stalled; of those replayed)
    stalled: np.ndarray  # bool: a replica met a request that can never fit its KV cache
    queue_length: np.ndarray  # [F, P] requests arrived and never yet scheduled, at series_time_s
    series_time_s: np.ndarray  # [F, P] sample times, 0 .. duration_s
    # Poisson arrivals only (else False, 0, NaN): `backlog`'s verdict on the waiting queue.
    falls_behind: np.ndarray  # bool: the queue stops emptying while requests arrive
    queue_at_last_arrival: np.ndarray  # int: requests never yet admitted when the last one arrives
    sustained_output_tokens_per_s: np.ndarray  # output tokens made in the arrivals' last third / its length


def _percentiles(values, valid, ps):
    """Percentiles (numpy's linear rule, positions and interpolation in float64) over the valid
    entries of each row, float32. [..., P]; NaN if none."""
    x = np.sort(np.where(valid, values, np.inf), axis=-1).astype(np.float64)
    n = np.sum(valid, axis=-1, keepdims=True)
    fractions = np.asarray(ps, np.float64) / 100.0
    pos = fractions.reshape((1,) * (n.ndim - 1) + (-1,)) * np.maximum(n - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    frac = pos - lo
    x_lo = np.take_along_axis(x, lo, axis=-1)
    x_hi = np.take_along_axis(x, hi, axis=-1)
    return np.where(n > 0, x_lo + frac * (x_hi - x_lo), np.nan).astype(np.float32)


def _hist_quantiles(hist, qs):
    """Quantiles (fractions) of a histogram over ITL bins; NaN when empty. [F, Q]."""
    cdf = np.cumsum(hist.astype(np.float32), axis=-1)
    total = cdf[..., -1:]
    idx = np.sum(cdf[:, None, :] < np.asarray(qs, np.float32)[None, :, None] * total[:, :, None], axis=-1)  # first bin reaching q
    values = itl_bin_value(np.clip(idx, 0, ITL_BINS - 1))
    return np.where(total > 0, values, np.float32(np.nan))


def _summarize(trace, scored, ttft_slo_s, tpot_slo_s, slo_percentile, *, series_points: int, poisson: bool = False, extension=None) -> ReplayMetrics:
    """Metrics of a trace of NumPy arrays; `scored` [F, R] bool: the requests the latency
    distributions count (`clients.scored_requests`); `poisson`: open-loop arrivals, the only ones
    whose queue is judged (`backlog`); `extension`: the requests of a burst or closed loop beyond
    the replayed ones (`extension.extend_run`), counted in the latencies, throughputs and SLO attainment
    (not in the ITL, the step and KV figures, `completed` or the queue series: the replay's own).
    Float32, as the replay's records are; sums and percentiles are taken in float64, so that traces
    equal but for a last bit here and there (loop programs of other widths may round differently)
    summarise alike. Host arithmetic on arrays of F x R: a compiled program would cost more to build
    than this costs to run."""
    f32 = np.float32
    finished = trace.finish_step >= 0  # [F, R]
    osl = np.broadcast_to(trace.output_tokens[None, :].astype(f32), finished.shape)
    isl = np.broadcast_to(trace.prompt_tokens[None, :].astype(f32), finished.shape)
    ttft_s, e2e_s = trace.ttft_s, trace.e2e_s
    counted = finished.shape[-1]  # [F] after an extension: all the requests the metrics stand for
    active = trace.replica_active
    duration = np.max(np.where(active, trace.replica_clock_s, f32(0.0)), -1)
    if extension is not None:  # the rest of a run longer than the replay (`extension.extend_run`)
        ext = extension
        added = np.isfinite(ext.e2e_s)
        finished = np.concatenate([finished, added], -1)
        osl = np.concatenate([osl, trace.output_tokens[ext.source].astype(f32)], -1)
        isl = np.concatenate([isl, trace.prompt_tokens[ext.source].astype(f32)], -1)
        ttft_s, e2e_s = (np.concatenate([x, y.astype(f32)], -1) for x, y in ((ttft_s, ext.ttft_s), (e2e_s, ext.e2e_s)))
        scored = np.concatenate([scored, added], -1)
        counted = counted + np.sum(added, -1)
        duration = (duration + ext.extra_duration_s).astype(f32)
    decode_s = e2e_s - ttft_s
    multi = finished & (osl > 1)
    tpot = decode_s / np.maximum(osl - 1, f32(1))
    # One sort for every per-request distribution: rows TTFT, TPOT, e2e.
    values = np.stack([ttft_s, tpot, e2e_s], axis=1)  # [F, 3, R]
    valid = np.stack([finished, multi, finished], axis=1) & scored[:, None, :]
    n = np.sum(valid, -1)
    means = np.where(n > 0, np.sum(np.where(valid, values, 0.0), -1, dtype=np.float64) / np.maximum(n, 1), np.nan).astype(f32)
    pct = _percentiles(values, valid, PERCENTILES + (float(slo_percentile),))  # [F, 3, 4]
    stats = [LatencyStats(means[:, i], pct[:, i, 0], pct[:, i, 1], pct[:, i, 2]) for i in range(3)]
    real = slice(0, trace.finish_step.shape[-1])  # the replayed requests (the ITL histogram holds theirs)
    gaps = np.sum(np.where(multi[:, real], osl[:, real] - 1, 0.0), -1, dtype=np.float64)
    itl_mean = np.where(gaps > 0, np.sum(np.where(multi[:, real], decode_s[:, real], 0.0), -1, dtype=np.float64) / np.maximum(gaps, 1.0), np.nan).astype(f32)
    itl_q = _hist_quantiles(trace.itl_hist, tuple(q / 100 for q in PERCENTILES))
    itl_stats = LatencyStats(itl_mean, itl_q[:, 0], itl_q[:, 1], itl_q[:, 2])
    per_s = 1.0 / np.maximum(duration.astype(np.float64), 1e-30)
    met = finished & (ttft_s <= f32(ttft_slo_s)) & ((tpot <= f32(tpot_slo_s)) | (osl <= 1))
    steps = np.sum(np.where(active, trace.replica_steps, 0), -1).astype(np.int32)
    nsteps = np.maximum(steps, 1)
    kv_cap = trace.num_kv_blocks.astype(np.float64)
    times = duration[:, None] * np.linspace(0.0, 1.0, series_points, dtype=f32)[None, :]  # [F, P]
    # requests arrived (admitted) by each sample time: a count in the sorted times (nan, never, sorts last)
    arrived = _count_at_or_before(trace.arrival_s, times)
    admitted = _count_at_or_before(trace.admit_s, times)
    num_f = finished.shape[0]
    if poisson:
        queue = backlog(trace.arrival_s, trace.admit_s, trace.ttft_s, trace.e2e_s, trace.replica, trace.output_tokens)
    else:  # a burst or closed loop's clients wait by design: there is no rate to keep up with
        queue = Backlog(np.zeros(num_f, bool), np.zeros(num_f, np.int64), np.full(num_f, np.nan))
    return ReplayMetrics(
        ttft=stats[0],
        tpot=stats[1],
        itl=itl_stats,
        e2e=stats[2],
        ttft_at_slo_percentile_s=pct[:, 0, 3],
        tpot_at_slo_percentile_s=pct[:, 1, 3],
        output_tokens_per_s=(np.sum(np.where(finished, osl, 0.0), -1, dtype=np.float64) * per_s).astype(f32),
        total_tokens_per_s=(np.sum(np.where(finished, osl + isl, 0.0), -1, dtype=np.float64) * per_s).astype(f32),
        request_throughput_per_s=(np.sum(finished, -1) * per_s).astype(f32),
        goodput_req_per_s=(np.sum(met, -1) * per_s).astype(f32),
        slo_attainment=(np.sum(met, -1) / counted).astype(f32),
        duration_s=duration,
        mean_batch_size=(np.sum(np.where(active, trace.replica_batch_sum, 0.0), -1, dtype=np.float64) / nsteps).astype(f32),
        kv_utilization_mean=(np.sum(np.where(active, trace.replica_kv_sum, 0.0), -1, dtype=np.float64) / nsteps / kv_cap).astype(f32),
        kv_utilization_peak=(np.max(np.where(active, trace.replica_peak_kv_blocks, 0), -1) / kv_cap).astype(f32),
        num_preemptions=np.sum(np.where(active, trace.replica_preemptions, 0), -1).astype(np.int32),
        num_steps=steps,
        completed=np.sum(finished[:, real], -1).astype(np.int32),
        unfinished=np.sum(~finished[:, real], -1).astype(np.int32),
        stalled=np.any(active & trace.replica_stalled, -1),
        queue_length=(arrived - admitted).astype(np.int32),
        series_time_s=times,
        falls_behind=queue.falls_behind,
        queue_at_last_arrival=queue.queue_at_last_arrival.astype(np.int32),
        sustained_output_tokens_per_s=queue.sustained_output_tokens_per_s.astype(f32),
    )


def _count_at_or_before(times_s, at_s):
    """[F, P] entries of each row of `times_s` [F, R] that are <= each of `at_s` [F, P] (nan counts
    never). One binary search a finalist (tens of them), where one comparison of every pair would
    hold F x P x R booleans."""
    ordered = np.sort(times_s, axis=-1)
    return np.stack([np.searchsorted(row, at, side="right") for row, at in zip(ordered, at_s)])


def summarize(trace, workload, *, series_points: int = 64) -> ReplayMetrics:
    """ReplayMetrics [F] (NumPy arrays) of a ReplayTrace, against `workload`'s SLOs (inf = none)."""
    trace = type(trace)(*(np.asarray(x) for x in trace))
    scored = scored_requests(trace.arrival_s, workload)
    with np.errstate(invalid="ignore", divide="ignore"):  # unfinished requests' nan and inf are masked
        extension = None
        if workload.arrival != Arrival.POISSON and workload.num_requests > trace.finish_step.shape[-1]:
            closed = workload.arrival == Arrival.CLOSED
            extension = extend_run(trace.admit_s, trace.ttft_s, trace.e2e_s, trace.replica, trace.replica_active, trace.output_tokens,
                                     workload.num_requests, arrival_s=trace.arrival_s if closed else None)
            if closed:  # the added requests dilute the first wave to its share of the run: no thinning
                scored = np.where(np.all(np.isfinite(extension.e2e_s), -1, keepdims=True), True, scored)
        return _summarize(trace, scored, workload.ttft_slo_s, workload.tpot_slo_s, workload.slo_percentile, series_points=series_points,
                          poisson=workload.arrival == Arrival.POISSON, extension=extension)
