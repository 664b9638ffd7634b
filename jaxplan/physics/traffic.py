"""WorkloadParams: the continuous workload numbers as arrays (what gradients are taken against)."""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxplan.specs.workload import Arrival, LengthDistribution, Workload

ARRIVAL_CODES = {Arrival.POISSON: 0, Arrival.BURST: 1, Arrival.CLOSED: 2}
P99_Z = 2.326  # standard normal 99th percentile


class WorkloadParams(NamedTuple):
    """Float32 scalars (or any broadcastable shape, e.g. [S] scenarios)."""

    isl_tokens: jnp.ndarray  # mean prompt length
    osl_tokens: jnp.ndarray  # mean output length
    prefix_hit_rate: jnp.ndarray  # fraction of prompt tokens served from the prefix cache
    request_rate_per_s: jnp.ndarray  # Poisson rate (whole deployment); unused otherwise
    concurrency: jnp.ndarray  # closed loop: requests in flight; burst: requests in the batch
    arrival_code: jnp.ndarray  # 0 Poisson, 1 burst, 2 closed loop
    max_context_factor: jnp.ndarray  # longest (p99) request context / mean context
    length_cv: jnp.ndarray  # coefficient of variation of the output length (for p99 latencies)
    ttft_slo_s: jnp.ndarray  # inf: none
    tpot_slo_s: jnp.ndarray
    target_output_tokens_per_s: jnp.ndarray  # 0: none
    num_requests: jnp.ndarray  # requests in the run; a closed loop's first wave is concurrency / num_requests of them
    longest_output_factor: jnp.ndarray  # the run's longest output / mean output (`longest_output_factor`)


def _p99_factor(distribution: LengthDistribution, spread: float) -> float:
    """p99 length / mean length."""
    if distribution == LengthDistribution.UNIFORM:
        return 1.0 + 0.98 * spread
    if distribution == LengthDistribution.LOGNORMAL and spread > 0:
        sigma = math.sqrt(math.log1p(spread**2))
        return math.exp(-0.5 * sigma**2 + P99_Z * sigma)
    return 1.0


def _cv(distribution: LengthDistribution, spread: float) -> float:
    if distribution == LengthDistribution.UNIFORM:
        return spread / math.sqrt(3.0)
    if distribution == LengthDistribution.LOGNORMAL:
        return spread
    return 0.0


def length_shape(w: Workload) -> tuple[float, float]:
    """(max_context_factor, length_cv) of the Workload's length distributions, plain floats.

    With a `lengths_file`, the file's own p99 / mean of each side (scale-free, so it holds at any
    isl/osl mean) and the CV of its outputs."""
    lengths = w.lengths()
    if lengths is not None:
        isl_factor, osl_factor = lengths.p99_over_mean()
        isl_max, osl_max = w.isl_mean_tokens * isl_factor, w.osl_mean_tokens * osl_factor
        return (isl_max + osl_max) / (w.isl_mean_tokens + w.osl_mean_tokens), lengths.output_cv()
    isl_max = w.isl_mean_tokens * _p99_factor(w.isl_distribution, w.isl_spread)
    osl_max = w.osl_mean_tokens * _p99_factor(w.osl_distribution, w.osl_spread)
    return (isl_max + osl_max) / (w.isl_mean_tokens + w.osl_mean_tokens), _cv(w.osl_distribution, w.osl_spread)


def longest_output_factor(w: Workload, count: float | None = None) -> float:
    """Expected longest output among `count` requests (default the workload's num_requests) / the
    mean output, a plain float: what a burst's last request decodes after the others finished.

    With a `lengths_file`: the file's own longest / mean (its 1 - 1 / (count + 1) quantile when
    `count` is below the file's size). Fixed lengths: 1; uniform +- s: 1 + s (n - 1) / (n + 1), the
    expected maximum of n; lognormal: its 1 - 1 / (n + 1) quantile / mean."""
    n = max(float(count if count is not None else w.num_requests), 1.0)
    lengths = w.lengths()
    if lengths is not None:
        out = np.asarray(lengths.output_tokens, np.float64)
        top = float(np.max(out)) if n >= len(out) else float(np.quantile(out, 1.0 - 1.0 / (n + 1.0)))
        return top / float(np.mean(out))
    if w.osl_distribution == LengthDistribution.UNIFORM:
        return 1.0 + w.osl_spread * (n - 1.0) / (n + 1.0)
    if w.osl_distribution == LengthDistribution.LOGNORMAL and w.osl_spread > 0:
        sigma = math.sqrt(math.log1p(w.osl_spread**2))
        return math.exp(-0.5 * sigma**2 + sigma * statistics.NormalDist().inv_cdf(1.0 - 1.0 / (n + 1.0)))
    return 1.0


def workload_params(w: Workload, **overrides) -> WorkloadParams:
    """The Workload's continuous parameters; keyword overrides replace fields (e.g. for scenarios)."""
    max_context_factor, length_cv = length_shape(w)
    concurrency = {Arrival.CLOSED: w.concurrency, Arrival.BURST: w.num_requests}.get(w.arrival, 0)
    values = dict(
        isl_tokens=w.isl_mean_tokens,
        osl_tokens=w.osl_mean_tokens,
        prefix_hit_rate=w.prefix_hit_rate,
        request_rate_per_s=w.request_rate_per_s if w.arrival == Arrival.POISSON else 0.0,
        concurrency=concurrency,
        arrival_code=ARRIVAL_CODES[w.arrival],
        max_context_factor=max_context_factor,
        length_cv=length_cv,
        ttft_slo_s=w.ttft_slo_s,
        tpot_slo_s=w.tpot_slo_s,
        target_output_tokens_per_s=w.target_output_tokens_per_s,
        num_requests=w.num_requests,
        longest_output_factor=longest_output_factor(w),
    )
    values.update(overrides)
    return WorkloadParams(**{k: jnp.asarray(v, jnp.float32) for k, v in values.items()})


def max_context_tokens(w: WorkloadParams):
    """The longest request (p99 of ISL + OSL) that must fit in KV."""
    return (w.isl_tokens + w.osl_tokens) * w.max_context_factor
