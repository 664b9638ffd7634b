"""A burst or closed loop of N requests replayed as its first M < N, and extended to N by its steady state.

The sweep replays at most a few thousand requests (`funnel.replay_stage.DEFAULT_REQUESTS`), and a
burst's latencies grow with its size: every request arrives at t = 0 and waits for the ones ahead
of it, so a replay of the first 2,000 of a 4,096-request batch sees half its queue (its p99 TTFT
half the whole batch's, `rl-rollout`). Under first-come-first-served admission the first M
requests of an N-burst are scheduled as in a burst of M until the M-th is admitted: the requests
behind them wait without taking a slot. After that the M-replay's batch drains while the N-burst's
stays full, so the N-burst's later requests are admitted at the rate each replica frees slots while
full: the output tokens it made over the second half of its admissions over the mean output length
(`extend_run`). Each added request repeats one of its replica's late admissions, lengths, prefill
wait (admission to first token) and TPOT, the TPOT shifted to the replica's full-batch mean; the
whole run lasts each replica's replayed time plus its added admissions'.

A closed loop's clients send each request when their previous one finishes, so its latencies do not
grow with the run, but a shortened run drains for longer against its length (its throughput low,
by 12-16% for the chat traffic of 256 clients replayed at 2,000 of 5,000 requests) and weighs its
first wave more: the added requests repeat late ones' latencies as they are, and the run grows by
the same rate.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxplan.replay.backlog import per_replica
from jaxplan.replay.backlog import tokens_by as _tokens_by


class RunExtension(NamedTuple):
    """The requests a replay of the first M of an N-request run leaves out, [F, E] each (s; NaN where
    a replica's admissions give no rate; E = N - M, or MAX_ADDED_PER_REPLAYED x M of them spread
    evenly), and the run's extra length [F] (s)."""

    ttft_s: np.ndarray
    e2e_s: np.ndarray
    source: np.ndarray  # int: the replayed request whose lengths each repeats
    extra_duration_s: np.ndarray


# At most this many added requests per replayed one are materialised; a longer run's added requests
# are represented by that many spread evenly over them (their latencies then weigh a little less
# against the replayed ones' than they should: at most 1 / (1 + this) of the run).
MAX_ADDED_PER_REPLAYED = 64


def half_of(count):
    """The first of a replica's `count` admissions that counts as late (the second half)."""
    return count // 2


def extend_run(admit_s, ttft_s, e2e_s, replica, replica_active, output_tokens, num_requests: int, arrival_s=None) -> RunExtension:
    """The rest of an N-request (`num_requests`) run from a replay of its first M: first admission,
    TTFT and e2e times [F, M] (s; NaN: never), replicas [F, M] and output tokens [M] of the replayed
    requests, active replicas [F, D]. Requests M .. N-1 go round-robin, as request i goes to replica
    i mod D. A burst (`arrival_s` None: all at t = 0) queues them: each waits for the ones ahead. A
    closed loop (`arrival_s` [F, M], its clients' submission times) sends each when a client's
    previous request finishes: the added requests repeat their sources' latencies, and only the run
    grows longer."""
    admit = np.asarray(admit_s, np.float64)
    ttft = np.asarray(ttft_s, np.float64)
    e2e = np.asarray(e2e_s, np.float64)
    queued = arrival_s is None
    arrival = np.zeros_like(admit) if queued else np.nan_to_num(np.asarray(arrival_s, np.float64), posinf=np.nan)
    rep = np.asarray(replica, np.int64)
    num_f, num_m = admit.shape
    extra = int(num_requests) - num_m
    d_max = np.asarray(replica_active).shape[1]
    dp = np.maximum(np.sum(replica_active, -1), 1)  # [F]

    # Each replica's requests in admission order (never-admitted ones last): its last admission and
    # the second half of its admissions (`late`), from `mid` on.
    admitted = np.isfinite(admit)
    count = per_replica(admitted, rep, d_max, dtype=np.int64)
    key = np.where(admitted, admit, np.inf)
    order = np.lexsort((key, rep), axis=-1)
    s_admit, s_rep = np.take_along_axis(key, order, -1), np.take_along_axis(rep, order, -1)
    totals = per_replica(1, rep, d_max, dtype=np.int64)  # replayed requests of each replica
    start = np.cumsum(totals, -1) - totals  # where each replica's requests begin in the sorted order
    rank = np.arange(num_m)[None, :] - np.take_along_axis(start, s_rep, -1)  # position within its replica
    half = np.take_along_axis(half_of(count), s_rep, -1)
    late = np.isfinite(s_admit) & (rank >= half)  # the second half of each replica's admissions
    last = per_replica(np.where(np.isfinite(s_admit), s_admit, -np.inf), s_rep, d_max, np.maximum, -np.inf)
    mid = per_replica(np.where(late, s_admit, np.inf), s_rep, d_max, np.minimum, np.inf)
    n_late = per_replica(late, s_rep, d_max, dtype=np.int64)
    # The rate at which slots free while the batch is full: output tokens made over [mid, last] (each
    # request's spread evenly from its first token to its last) over the mean output length.
    # Counting admissions instead follows the waves in which requests admitted together finish.
    finish_s = np.where(np.isfinite(arrival + e2e), arrival + e2e, np.inf)
    first_s = np.where(np.isfinite(arrival + ttft), arrival + ttft, np.inf)
    window = [np.take_along_axis(x, rep, -1) for x in (mid, last)]
    made = _tokens_by(window[1], first_s, finish_s, output_tokens) - _tokens_by(window[0], first_s, finish_s, output_tokens)
    made_by = per_replica(np.where(np.isfinite(window[0]), made, 0.0), rep, d_max)
    mean_osl = float(np.mean(output_tokens))
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where((n_late >= 2) & (last > mid), made_by / (last - mid) / mean_osl, np.nan)  # requests/s

    # The added requests: overall index g = M + j, replica g mod D, the (g div D - M_d + 1)-th beyond
    # the replayed ones on that replica. Each repeats one of its replica's late admissions (in turn):
    # their lengths are the workload's (first come, first served picks no length), and so is their
    # prefill wait; each decodes at its source's TPOT shifted by the replica's full-batch mean TPOT
    # (over the requests that finished before its last admission) minus its late admissions' (who
    # decode partly in the replay's drain, faster).
    kept = min(max(extra, 0), MAX_ADDED_PER_REPLAYED * num_m)
    g = num_m + np.floor((np.arange(kept) + 0.5) * max(extra, 0) / max(kept, 1)).astype(np.int64)[None, :]  # all of them, or evenly spread
    d = g % dp[:, None]
    beyond = g // dp[:, None] - np.take_along_axis(totals, d, -1) + 1
    admit_v = np.take_along_axis(last, d, -1) + beyond / np.take_along_axis(rate, d, -1)
    n_src = np.maximum(np.take_along_axis(n_late, d, -1), 1)
    position = np.take_along_axis(start + half_of(count), d, -1) + (beyond - 1) % n_src
    source = np.take_along_axis(order, np.clip(position, 0, num_m - 1), -1)  # [F, E] replayed request each repeats
    out = np.asarray(output_tokens, np.float64)
    finished_full = admitted & np.isfinite(finish_s) & (finish_s <= np.take_along_axis(last, rep, -1)) & (out[None, :] > 1)
    finished_full = np.where(np.any(finished_full, -1, keepdims=True), finished_full, admitted & np.isfinite(finish_s) & (out[None, :] > 1))
    tpot_all = (e2e - ttft) / np.maximum(out[None, :] - 1, 1)
    full_batch = _mean_by_replica(tpot_all, finished_full, rep, d_max)
    late_by_request = np.zeros((num_f, num_m), bool)
    np.put_along_axis(late_by_request, order, late, -1)
    late_tpot = _mean_by_replica(tpot_all, late_by_request & np.isfinite(tpot_all) & (out[None, :] > 1), rep, d_max)
    # The source's own TPOT, shifted: the spread between requests stays (a p99 over copies of one
    # typical TPOT would understate it).
    shift = np.take_along_axis(np.nan_to_num(full_batch - late_tpot), d, -1)
    src_tpot = np.take_along_axis(tpot_all, source, -1)
    # A burst's added request waits from its admission as its source did; a closed loop's repeats its source's TTFT.
    ttft_v = admit_v + np.take_along_axis(arrival + ttft - admit, source, -1) if queued else np.take_along_axis(ttft, source, -1)
    e2e_v = ttft_v + (out[source] - 1) * (src_tpot + shift)
    # Each replica runs as long as replayed plus its added admissions at its rate: requests M .. N-1
    # with index = d mod D, all of them (also those left out of a long run's spread).
    replica_ids = np.arange(d_max)[None, :]
    added = np.where(replica_ids < dp[:, None], -(-(int(num_requests) - replica_ids) // dp[:, None]) - -(-(num_m - replica_ids) // dp[:, None]), 0)
    with np.errstate(invalid="ignore"):
        extra_s = np.max(np.where(added > 0, added / rate, 0.0), -1, initial=0.0)
    # A replica that admitted all its replayed requests at once has no rate to go by: such a
    # finalist's replay stands for its first M requests only.
    whole = np.all(np.isfinite(e2e_v), -1, keepdims=True)
    return RunExtension(np.where(whole, ttft_v, np.nan), np.where(whole, e2e_v, np.nan), source, np.where(whole[:, 0], extra_s, 0.0))


def _mean_by_replica(values, mask, rep, d_max):
    """[F, D] mean of `values` [F, M] over the entries in `mask` of each replica (NaN where none)."""
    total, count = per_replica(np.where(mask, values, 0.0), rep, d_max), per_replica(mask, rep, d_max)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)
