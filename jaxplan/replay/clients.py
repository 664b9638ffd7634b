"""When closed-loop benchmark clients send their first request.

A closed loop of N clients with fixed ISL/OSL that all start at t = 0 stays in
lock-step for ever in an exact replay: every wave of N prompts is prefilled
together, so each TTFT holds the whole wave's prefill. Measured vLLM benchmarks
do not: tokenisation, HTTP and the API server's event loop spread the requests
over steps, and once spread they finish at different steps and stay spread
(measured TTFTs at concurrency 4-64 are 2-3x below a lock-step replay's; see
docs/accuracy.md). Stage 4 models this with the calibrated
`closed_loop_sync_fraction` s: the part of a wave that stays together.

The replay uses the same number. Clients start in groups of
g = round(1 + s (N - 1)) (the wave that stays together; stage 4's wave wait is
s/2 (N - 1) prefills), and the groups' start times are drawn uniformly (seeded)
over (1 - s) x SPREAD_OF_LIFETIME of one request's lifetime (TTFT + (OSL - 1) x TPOT,
from stage 4), so that random groups collide as desynchronised arrivals do.
Each client then sends its next request when its previous one finishes, as
before; no client sends a second request before every client has started.
"""

from __future__ import annotations

import math

import numpy as np

from jaxplan.errors import bad_value

# Fraction of a request's lifetime over which the groups' first requests are spread. Below 1 so
# that, with stage 4's lifetime a little off, the first completions still come after most starts;
# 0.5 and 0.8 were tried on the shared vLLM rows (docs/accuracy.md): 0.8 fits better.
SPREAD_OF_LIFETIME = 0.8


def closed_loop_start_times(concurrency: int, sync_fraction: float, lifetime_s: float, seed: int = 0) -> np.ndarray:
    """Start time of each client's first request, seconds, nondecreasing, shape [concurrency] float32.

    concurrency: clients N >= 1. sync_fraction: s in [0, 1] (1: all start at 0).
    lifetime_s: one request's expected time from arrival to last token, > 0 (inf or 0: all at 0).
    """
    if not isinstance(concurrency, (int, np.integer)) or concurrency < 1:
        raise bad_value("concurrency", concurrency, "must be an integer >= 1 clients")
    if not 0.0 <= float(sync_fraction) <= 1.0:
        raise bad_value("closed_loop_sync_fraction", sync_fraction, "must be in [0, 1]")
    if math.isnan(lifetime_s) or lifetime_s < 0:
        raise bad_value("lifetime_s", lifetime_s, "must be >= 0 seconds")
    n = int(concurrency)
    group = max(1, int(round(1.0 + sync_fraction * (n - 1))))
    groups = -(-n // group)
    span_s = (1.0 - sync_fraction) * SPREAD_OF_LIFETIME * lifetime_s if math.isfinite(lifetime_s) else 0.0
    starts = np.sort(np.random.default_rng(seed).uniform(0.0, span_s, groups)) if span_s > 0 else np.zeros(groups)
    starts[0] = 0.0  # the benchmark starts when its first client does
    return starts[np.arange(n) // group].astype(np.float32)


def request_lifetime_s(ttft_ms, tpot_ms, osl_tokens) -> float:
    """Stage 4's arrival-to-last-token time, seconds (inf when unknown or overloaded)."""
    if ttft_ms is None or tpot_ms is None:
        return math.inf
    lifetime_s = (float(ttft_ms) + max(float(osl_tokens) - 1.0, 0.0) * float(tpot_ms)) * 1e-3
    return lifetime_s if math.isfinite(lifetime_s) and lifetime_s > 0 else math.inf
