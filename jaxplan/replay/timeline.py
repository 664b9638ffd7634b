"""Time series of a replay, derived after the fact from its per-request results (`ReplayTrace`).

The replay keeps per-request times (arrival, first admission, first token, last token), not
per-step state, so the series are reconstructed from those times. Approximation:

* a request is *running* from its first admission to its last token (preemptions, and the gap
  between them, are ignored); a request unfinished when the replay stops runs to its end;
* its KV cache grows linearly from its prompt (at admission) to prompt + output tokens (at its
  last token); blocks = tokens / block_size + 1/2 (the expected round-up); shared prefix blocks
  count once per request. Each replica's sum is capped at the most blocks that replica held in one
  step (`replica_peak_kv_blocks`, what the replay itself counted): ignoring preemptions, which free
  a request's blocks, the reconstruction near capacity would show more than the replay held. The
  replicas' sum is shown against the deployment's capacity (blocks per replica x replicas);
* the *queue* is the requests arrived and never yet admitted (as `ReplayMetrics.queue_length`);
* *output tokens/s* is a bin average: a finished request's first token is produced at its
  first-token time and the other output tokens evenly until its last token (unfinished requests
  are left out, as in `ReplayMetrics.output_tokens_per_s`, whose value the series averages to,
  except for a burst or closed loop longer than the replay, whose metrics count the requests
  `extension` adds and whose series show the replayed ones).

All quantities sum over replicas. Vectorised: each series is a difference of sorted cumulative
sums looked up with `searchsorted` (O(R log R) per finalist, no loop over requests).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

DEFAULT_POINTS = 120


class Timeline(NamedTuple):
    """Per finalist [F] (or per finalist and time bin [F, P]); all replicas together."""

    time_s: np.ndarray  # [F, P] bin centres, 0 .. duration_s
    running: np.ndarray  # [F, P] requests admitted and not finished
    kv_utilization: np.ndarray  # [F, P] KV blocks in use / (blocks per replica x replicas)
    queue_length: np.ndarray  # [F, P] requests arrived and never admitted
    output_tokens_per_s: np.ndarray  # [F, P] output tokens produced in the bin / bin width
    duration_s: np.ndarray  # [F] until the last step of any replica ended
    capacity_blocks: np.ndarray  # [F] KV blocks of the whole deployment


def cumulative(x: np.ndarray, w: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[..., P] sum of w[..., r] over requests with x_r <= t (x [R] may be inf or nan: never)."""
    x = np.where(np.isnan(x), np.inf, x)
    order = np.argsort(x, kind="stable")
    w = np.asarray(w, np.float64)[..., order]
    sums = np.concatenate([np.zeros(w.shape[:-1] + (1,)), np.cumsum(w, axis=-1)], axis=-1)
    return sums[..., np.searchsorted(x[order], t, side="right")]


def active_sum(start: np.ndarray, end: np.ndarray, w0: np.ndarray, w1: np.ndarray, t: np.ndarray) -> np.ndarray:
    """[..., P] sum over requests with start_r <= t < end_r of w0[..., r] + w1[..., r] * t (needs start_r <= end_r)."""
    inside = lambda w: cumulative(start, w, t) - cumulative(end, w, t)  # noqa: E731
    return inside(w0) + t * inside(w1)


def _one(arrival, admit, first, finish, prompt, output, edges, capacity_blocks, block_size, replica, peak_blocks):
    """The series of one finalist at bin centres (edges [P + 1]); replica [R] routes each request to
    one of the replicas whose most KV blocks in one step are peak_blocks [D]."""
    centres = (edges[:-1] + edges[1:]) / 2
    admitted = np.isfinite(admit)
    start = np.where(admitted, admit, np.inf)
    end = np.where(np.isfinite(finish), finish, edges[-1] * (1 + 1e-6) + 1e-9)  # still in flight at the end
    end = np.maximum(end, start)
    ones = np.ones_like(prompt)
    running = active_sum(start, end, ones, 0 * ones, centres)
    span = np.maximum(end - start, 1e-9)
    slope = np.where(admitted, output / span, 0.0)  # KV tokens per second while running
    member = (replica[None, :] == np.arange(len(peak_blocks))[:, None]).astype(np.float64)  # [D, R]
    kv_tokens = active_sum(start, end, member * (prompt - slope * np.where(admitted, start, 0.0)), member * slope, centres)  # [D, P]
    kv_blocks = kv_tokens / block_size + 0.5 * active_sum(start, end, member, 0 * member, centres)
    kv_blocks = np.minimum(kv_blocks, peak_blocks[:, None]).sum(axis=0)
    queue = cumulative(arrival, ones, centres) - cumulative(admit, ones, centres)
    # output tokens produced by time t: the first token at `first`, the rest evenly until `finish`
    done = np.isfinite(finish) & np.isfinite(first)
    rest = np.where(done, output - 1.0, 0.0)
    rate = rest / np.maximum(finish - first, 1e-9)
    f_start, f_end = np.where(done, first, np.inf), np.where(done, np.maximum(finish, first), np.inf)
    produced = (
        cumulative(f_start, done.astype(float), edges)
        + active_sum(f_start, f_end, -rate * np.where(done, first, 0.0), rate, edges)
        + cumulative(f_end, rest, edges)
    )
    per_s = np.diff(produced) / np.maximum(np.diff(edges), 1e-12)
    return centres, running, kv_blocks / np.maximum(capacity_blocks, 1), queue, per_s


def timeline(trace, *, points: int = DEFAULT_POINTS, block_size: int = 16) -> Timeline:
    """Series over `points` equal time bins from 0 to each finalist's duration (see module docstring)."""
    t = {k: np.asarray(v, np.float64) for k, v in trace._asdict().items()}
    active = t["replica_active"].astype(bool)
    duration = np.max(np.where(active, t["replica_clock_s"], 0.0), axis=-1)
    capacity = t["num_kv_blocks"] * active.sum(-1)
    prompt, output = t["prompt_tokens"], t["output_tokens"]
    series = []
    for f in range(len(duration)):  # finalists (a handful); every series is vectorised over requests
        edges = np.linspace(0.0, max(duration[f], 1e-6), points + 1)
        arrival = t["arrival_s"][f]
        series.append(_one(arrival, t["admit_s"][f], arrival + t["ttft_s"][f], arrival + t["e2e_s"][f], prompt, output, edges, capacity[f], block_size,
                           t["replica"][f], np.where(active[f], t["replica_peak_kv_blocks"][f], 0.0)))
    stacked = [np.stack(s) for s in zip(*series)] if series else [np.zeros((0, points))] * 5
    return Timeline(*stacked, duration_s=duration, capacity_blocks=capacity)
