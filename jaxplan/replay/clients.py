"""How the replay runs a closed loop of benchmark clients.

Benchmark clients (`vllm bench serve --max-concurrency`, genai-perf / aiperf
`--concurrency`) all send their first request at t = 0 and each sends its next
one when its previous one finishes; the replay does the same (`build_lanes`).

With identical lengths an exact replay of that loop stays in lock-step for ever:
requests admitted in one step finish in one step, their successors arrive
together, and every wave waits for its own prefill. Measured servers do not stay
so: on the fixed-length vLLM rows of NVIDIA's AIConfigurator silicon data, the
TTFT at 4-64 clients is 1.4-3.5x below a lock-step replay's (docs/accuracy.md).
What breaks the waves in a real server is not in the data. The replay breaks
them by giving a closed loop's fixed output length a small uniform spread,
OSL x (1 +- DESYNC_SPREAD) with the same mean, so that requests admitted
together finish apart. Any spread from 0.05 to 0.3 gives the same TTFT on those
rows (MAPE within 0.4 points; 0.02 leaves some waves together), so the value is
a choice inside a flat range, not a fit. Only the first wave, which starts
together, waits for the others' prefills; its weight is concurrency / requests,
so the request count (`num_prompts`) matters to a benchmark's mean TTFT. Where
the replay runs fewer requests than the workload's run (the sweep replays at most
2,000), the run is extended to its whole length (`extension.extend_run`), which
weighs the first wave at its share; where it cannot be (no steady rate to go by),
`scored_requests` thins the first wave in the latency statistics back to that share.
"""

from __future__ import annotations

import numpy as np

from jaxplan.specs.workload import Arrival, LengthDistribution, Workload

DESYNC_SPREAD = 0.1


def output_length_shape(workload: Workload) -> tuple[LengthDistribution, float]:
    """(distribution, spread) the replay samples output lengths from: the workload's own, except
    that a closed loop's fixed output length gets the uniform +- DESYNC_SPREAD described above."""
    fixed = workload.osl_distribution == LengthDistribution.FIXED or workload.osl_spread == 0
    if workload.arrival == Arrival.CLOSED and fixed:
        return LengthDistribution.UNIFORM, DESYNC_SPREAD
    return workload.osl_distribution, workload.osl_spread


def scored_requests(arrival_s, workload: Workload) -> np.ndarray:
    """Which replayed requests the latency statistics count, [F, R] bool from arrival times [F, R] (s).

    All of them, except in a closed loop replayed with fewer requests R than the workload's run N:
    there the first wave (the c requests submitted at t = 0) would weigh c / R instead of c / N, so
    only m = round(c (R - c) / (N - c)) of them, evenly spread over the wave (whose TTFTs rise with
    its admission order), are counted: m / (m + R - c) = c / N."""
    arrival = np.asarray(arrival_s, np.float64)
    replayed = arrival.shape[-1]
    if workload.arrival != Arrival.CLOSED or workload.num_requests <= replayed:
        return np.ones(arrival.shape, bool)
    wave = arrival <= 0.0
    c = wave.sum(-1, keepdims=True)
    later = np.maximum(replayed - c, 0)
    keep = np.rint(c * later / np.maximum(workload.num_requests - c, 1))
    rank = np.cumsum(wave, -1) - 1  # position in the wave, in request order
    counted = np.floor((rank + 1) * keep / np.maximum(c, 1)) > np.floor(rank * keep / np.maximum(c, 1))
    return ~wave | counted
