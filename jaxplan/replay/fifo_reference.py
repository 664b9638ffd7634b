"""Poisson arrivals into first-come-first-served servers of c slots, simulated in plain Python: the
independent reference that the replay's queue verdict (`backlog`) is checked against, in the tests and
in bench/bench_queue_verdict.py. Its load rho (arrival rate x mean service time / slots) is known
exactly, which a replay of a real deployment's is not."""

from __future__ import annotations

import heapq

import numpy as np


def fifo_queue(rho: float, slots: int, num_requests: int, seed: int, replicas: int = 1, service_s: float = 10.0):
    """(arrival, admit, ttft, e2e, replica) [R] (s, s, s, s, index) of Poisson arrivals at load `rho` sent
    round-robin to `replicas` servers of `slots` slots each, each request holding a slot for an
    exponential time of mean `service_s`; a request is admitted when it and every earlier one on
    its server have found a slot; its first token comes on admission."""
    rng = np.random.default_rng(seed)
    rate = rho * slots * replicas / service_s
    arrival = np.cumsum(rng.exponential(1.0 / rate, num_requests))
    arrival[0] = 0.0
    service = rng.exponential(service_s, num_requests)
    replica = np.arange(num_requests) % replicas
    admit, finish = np.empty(num_requests), np.empty(num_requests)
    for d in range(replicas):
        free_at = [0.0] * slots  # when each slot frees, soonest first
        for i in np.flatnonzero(replica == d):
            admit[i] = max(arrival[i], heapq.heappop(free_at))
            finish[i] = admit[i] + service[i]
            heapq.heappush(free_at, finish[i])
    return arrival, admit, admit - arrival, finish - arrival, replica


def falls_behind_rate(rho: float, slots: int, num_requests: int, seeds: int, replicas: int = 1) -> float:
    """The share of `seeds` simulated runs that `backlog` says fall behind."""
    from jaxplan.replay.backlog import backlog

    records = [fifo_queue(rho, slots, num_requests, seed, replicas) for seed in range(seeds)]
    arrival, admit, ttft, e2e, replica = (np.stack(x) for x in zip(*records))
    return float(np.mean(backlog(arrival, admit, ttft, e2e, replica, np.ones(num_requests, np.int64)).falls_behind))
