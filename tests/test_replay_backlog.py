"""`replay.backlog`: whether a replayed deployment keeps up with Poisson traffic, judged on its queue.

Checked on hand-built records and on first-come-first-served queues with c slots simulated in plain
Python (`replay.fifo_reference`, an independent reference), whose load rho = arrival rate x service time / slots is
known: stable ones (rho <= 0.8) are never said to fall behind, overloaded ones (rho >= 1.2) always
are; an overload whose slots fill only near the end of the run goes unseen."""

from __future__ import annotations

import numpy as np
import pytest

from jaxplan.replay.backlog import MIN_JUDGED_ARRIVALS, backlog
from jaxplan.replay.fifo_reference import falls_behind_rate


@pytest.mark.parametrize("slots, replicas", [(1, 1), (16, 1), (16, 8)])
def test_stable_queues_keep_up_and_overloaded_ones_fall_behind(slots, replicas):
    assert falls_behind_rate(0.8, slots, 2000, 60, replicas) == 0.0
    assert falls_behind_rate(1.2, slots, 2000, 60, replicas) == 1.0


def test_an_overload_whose_slots_fill_only_near_the_end_goes_unseen():
    # 64 replicas x 16 slots at rho 1.5: 2,000 requests arrive in 13 s, about one 10-s lifetime, and
    # each replica's 16 slots fill about 7 s in: its queue was empty in the judged half (a limit of
    # a short replay, stated in docs/usage.md).
    assert falls_behind_rate(1.5, 16, 2000, 10, replicas=64) == 0.0
    # the same load on 8 replicas lasts long enough to tell
    assert falls_behind_rate(1.5, 16, 2000, 10, replicas=8) == 1.0


def one_replica(arrival, admit, e2e, output=None, replica=None):
    """`backlog` of one finalist's record; each request's first token comes on its admission."""
    arrival, admit, e2e = (np.asarray(x, np.float64)[None, :] for x in (arrival, admit, e2e))
    output = np.ones(arrival.shape[1], np.int64) if output is None else np.asarray(output)
    replica = np.zeros(arrival.shape, np.int64) if replica is None else np.asarray(replica)[None, :]
    return backlog(arrival, admit, admit - arrival, e2e, replica, output)


def test_hand_built_queues():
    n = 40
    arrival = np.arange(n, dtype=np.float64)  # one request a second, t = 0 .. 39; the judged third is [26, 39]
    # One slot, each request 0.5 s: admitted on arrival, the queue empty between requests.
    quick = one_replica(arrival, arrival, np.full(n, 0.5))
    assert not quick.falls_behind[0] and quick.queue_at_last_arrival[0] == 0
    # One slot, each request 2 s: request k is admitted at 2k, so from t = 1 on the queue never
    # empties while requests arrive (it empties at 78 s, when the last is admitted: too late to count);
    # at t = 39, 20 of the 40 have been admitted (at 0, 2, ..., 38) and 20 wait.
    admit = 2.0 * arrival
    slow = one_replica(arrival, admit, admit + 2.0 - arrival, output=np.full(n, 10))
    assert slow.falls_behind[0] and slow.queue_at_last_arrival[0] == 20
    # Output tokens made in [26, 39], 10 a request from its admission (first token) to 2 s later:
    # request 13's last 9, requests 14-18's 10 each, request 19's first 5.5 (1 + 9 x 1/2), over 13 s:
    # about the 5 tokens/s the one slot makes.
    assert slow.sustained_output_tokens_per_s[0] == pytest.approx((9 + 5 * 10 + 5.5) / 13)
    # The same queue, but it empties once in the judged third (request 30 admitted before 31 arrives):
    emptied = admit.copy()
    emptied[30] = 30.5
    assert not one_replica(arrival, emptied, admit + 2.0 - arrival).falls_behind[0]


def test_a_replica_with_few_requests_in_the_judged_third_is_not_judged():
    assert MIN_JUDGED_ARRIVALS == 8
    for n, judged in ((21, False), (22, True)):  # t = 0 .. n - 1: 14 .. 20 (7) or 14 .. 21 (8) in the judged third
        arrival = np.arange(n, dtype=np.float64)
        admit = 2.0 * arrival  # a queue that never empties after t = 1
        assert one_replica(arrival, admit, np.full(n, 0.1) + admit - arrival).falls_behind[0] == judged, n


def test_never_admitted_requests_keep_the_queue_from_emptying():
    n = 40
    arrival = np.arange(n, dtype=np.float64)
    admit = np.where(arrival < 10, arrival, np.nan)  # a replica that stalls at t = 10
    e2e = np.where(arrival < 10, 0.5, np.nan)
    stalled = one_replica(arrival, admit, e2e)
    assert stalled.falls_behind[0] and stalled.queue_at_last_arrival[0] == 30


def test_a_replica_whose_first_request_comes_in_the_judged_third_was_empty_there():
    arrival = np.arange(50.0, 75.0)  # 25 requests, the span [50, 74]: the judged third starts at 66
    admit = 51.5 + 2.0 * (arrival - 50.0)  # never empties after the first arrival (each admitted after the next arrives) ...
    assert one_replica(arrival, admit, admit + 2.0 - arrival).falls_behind[0]
    # ... but with an earlier request on another replica, the span is [0, 74] and this replica's
    # queue was empty from 49.3 until its first arrival at 50 (the other replica is not judged).
    both = one_replica(np.r_[0.0, arrival], np.r_[0.0, admit], np.r_[1.0, admit + 2.0 - arrival], replica=np.r_[1, np.zeros(25, int)])
    assert not both.falls_behind[0]


def test_a_deployment_falls_behind_when_most_of_its_replicas_do():
    n = 40
    arrival = np.arange(n, dtype=np.float64)
    stuck = (2.0 * arrival, 2.0 * arrival + 2.0 - arrival)  # admit, e2e of a queue that never empties
    fine = (arrival, np.full(n, 0.5))
    for replicas, falls_behind in (((stuck, fine, fine), False), ((stuck, stuck, fine), True), ((stuck, fine), False), ((stuck, stuck), True)):
        record = (np.tile(arrival, len(replicas)), *(np.concatenate(x) for x in zip(*replicas)))  # arrival, admit, e2e
        replica = np.repeat(np.arange(len(replicas)), n)
        assert one_replica(*record, replica=replica).falls_behind[0] == falls_behind, len(replicas)


def test_only_poisson_traffic_is_judged():
    """The same engine (4 slots, ~0.3 s a request: about 12 requests/s) sent 300 requests three ways:
    Poisson at 40/s falls behind; a burst of 300 and a closed loop of 16 clients also keep requests
    waiting, by design, and get no verdict (False, 0 waiting, no sustained rate)."""
    from jaxplan.replay import ReplayConfig, sample_requests, simulate
    from jaxplan.replay.testing import affine_step_time
    from jaxplan.specs.workload import Arrival, Workload

    config = ReplayConfig.create(max_num_seqs=4, max_num_batched_tokens=512, num_kv_blocks=1000, data_parallel_size=1)
    params = np.array([[2.0**-6, 2.0**-16, 2.0**-10, 2.0**-20]], np.float32)
    shape = dict(isl_mean_tokens=100, osl_mean_tokens=20, num_requests=300)
    for arrival, extra, judged in ((Arrival.POISSON, dict(request_rate_per_s=40.0), True), (Arrival.BURST, {}, False), (Arrival.CLOSED, dict(concurrency=16), False)):
        workload = Workload(name=str(arrival), arrival=arrival, **shape, **extra)
        m = simulate(config, sample_requests(workload, seed=0), workload, affine_step_time, params)
        assert bool(m.falls_behind[0]) == judged and (int(m.queue_at_last_arrival[0]) > 100) == judged, arrival
        assert np.isfinite(m.sustained_output_tokens_per_s[0]) == judged, arrival
        if judged:  # 4 slots x 20 tokens a request / (20 steps of ~17 ms): about 240 tokens/s
            assert 150 < float(m.sustained_output_tokens_per_s[0]) < 300, float(m.sustained_output_tokens_per_s[0])
