"""Which finalists stage 7 replays together, in how many calls.

A replay call's loop steps every lane each iteration until its busiest lane is done, and every lane
works on slot tables as wide as the call's widest finalist needs (under either routing of
independent replicas); a lock-step lane also steps as many replicas as the call's largest group.
A finalist replayed beside wider ones pays for rows and replicas it does not use: an `rl-rollout` sweep whose finalists run 192, 384 and 1,024 requests a
replica stepped 1,024 rows for each of them. So finalists are replayed in calls of similar width
where the loop time that saves, estimated from stage 4's numbers, exceeds CALL_COMPILE_S for each
call's programs. The replayed numbers do not depend on the calls (bench/README.md, "Replay calls").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from jaxplan.buckets import bucket_size
from jaxplan.replay.driver import DEFAULT_WINDOW, replica_work, slot_rows
from jaxplan.replay.routing import routing_policy

# Seconds to trace and compile one more replay call's programs (loop, start, merge) on the
# 2-core VM; a warm run loads them in about 0.2 s, so a call this pays for also pays there.
CALL_COMPILE_S = 5.0
# A loop iteration over independent replicas: ITERATION_S, plus per lane on a device LANE_ITERATION_S
# and SLOT_ITERATION_S per slot row (fitted on 4-20 finalists and 32-512 rows, bench/README.md).
ITERATION_S = 20e-6
LANE_ITERATION_S = 5.3e-6
SLOT_ITERATION_S = 73e-9
# A lock-step call: this much per lane on a device, replica and stage-4 scheduler step.
LOCKSTEP_STEP_S = 25e-6
# A replica whose KV cache bounds its batch (stage 4's `bound`) preempts: vLLM admits on prompt
# blocks, evicts as the admitted requests' KV grows, and recomputes them, each preemption with
# events of its own. Such finalists loop about this many times `replica_work`'s count (bench/README.md).
KV_BOUND_WORK_FACTOR = 3.0


class CallEstimate(NamedTuple):
    """Stage 4's view of each finalist's replay [F], for splitting it into calls (never its results)."""

    steps: np.ndarray  # [F] float: scheduler steps of one replica (inf: unknown)
    work: np.ndarray  # [F] float: loop iterations of one replica (`driver.replica_work`)
    slots: np.ndarray  # [F] int: slot rows its replicas need (`slot_need`)
    routed: np.ndarray  # [F] int: replicas its requests are routed to


def call_estimate(steps, inflight, max_num_seqs, data_parallel_size, requests, closed_concurrency: int = 0, kv_bound=None, routing: str = "round_robin", window: int = DEFAULT_WINDOW) -> CallEstimate:
    """The CallEstimate of finalists [F]: `steps` stage 4's scheduler steps of one replica
    (`replica_steps_hint`), `inflight` its requests in flight per replica (nan: unknown), `kv_bound`
    [F] bool whether its KV cache bounds them (None: no), `routing` how requests reach its replicas."""
    steps = np.asarray(steps, np.float64)
    routed = routing_policy(routing).routed_replicas(np.asarray(data_parallel_size), closed_concurrency)
    work = replica_work(requests, routed, window, steps, inflight)
    if kv_bound is not None:
        work = np.where(np.asarray(kv_bound, bool), KV_BOUND_WORK_FACTOR * work, work)
    return CallEstimate(steps, work, slot_need(inflight, max_num_seqs), np.asarray(routed, np.int64))


def slot_demand(inflight, max_num_seqs) -> np.ndarray:
    """[F] requests a finalist's replica is expected to hold at most: twice stage 4's requests in
    flight per replica, at most its max_num_seqs (a replica never runs more; all of it where stage 4
    gave no estimate). Stage 7 starts each call's slot tables at its finalists' largest
    (`replay_stage.initial_slots_hint`)."""
    inflight, seqs = np.asarray(inflight, np.float64), np.asarray(max_num_seqs, np.float64)
    return np.where(np.isfinite(inflight) & (inflight > 0), np.minimum(2.0 * inflight, seqs), seqs)


def slot_need(inflight, max_num_seqs) -> np.ndarray:
    """[F] slot rows a finalist's replay starts with: its `slot_demand`, rounded as the replay rounds
    them (`driver.slot_rows`)."""
    return np.array([slot_rows(max(int(np.ceil(n)), 1)) for n in slot_demand(inflight, max_num_seqs)], np.int64)


def contiguous_calls(levels, cost: Callable[[np.ndarray], float], compile_s: float | None = None) -> list[np.ndarray]:
    """Positions [N] split into calls of contiguous ranges of the sorted `levels` [N] (a member's
    width), the ranges that minimise the sum of `cost(positions)` (a call's loop seconds) plus
    `compile_s` (default CALL_COMPILE_S) per call beyond the first (dynamic programming over the range
    ends)."""
    compile_s = CALL_COMPILE_S if compile_s is None else compile_s
    levels = np.asarray(levels)
    values = np.unique(levels)
    members = lambda i, j: np.flatnonzero((levels >= values[i]) & (levels <= values[j - 1]))  # noqa: E731
    best = [(0.0, [])] + [None] * values.size  # best[j]: the cheapest calls for the first j values
    for j in range(1, values.size + 1):
        for i in range(j):
            call = members(i, j)
            total = best[i][0] + cost(call) + (compile_s if i else 0.0)
            if best[j] is None or total < best[j][0]:
                best[j] = (total, best[i][1] + [call])
    return best[-1][1]


def independent_calls(estimate: CallEstimate, routing: str = "round_robin", devices: int = 1) -> list[np.ndarray]:
    """Positions (into `estimate`'s finalists of independent replicas, routed by `routing`) replayed
    together, by slot width: one call where the work is not known.

    A lane replays its replicas one after the other (round robin: a range of them, `choose_split`;
    least loaded: all of them, one step of one replica an iteration), so it runs about its replicas
    x `work` iterations, each costing ITERATION_S + lanes per device x (LANE_ITERATION_S +
    SLOT_ITERATION_S x the call's slot rows)."""
    if not np.all(np.isfinite(estimate.steps)) or np.unique(estimate.slots).size == 1:
        return [np.arange(estimate.slots.size)]
    policy = routing_policy(routing)

    def loop_s(call):
        routed, work = estimate.routed[call], estimate.work[call]
        k = policy.choose_split(routed, work, devices=devices)
        iterations = float(np.max(-(-routed // k) * work))
        per_device = -(-policy.lane_count(int(k.sum()), call.size, devices) // devices)  # the driver pads lanes to fill the devices
        return iterations * (ITERATION_S + per_device * (LANE_ITERATION_S + SLOT_ITERATION_S * int(estimate.slots[call].max())))

    return contiguous_calls(estimate.slots, loop_s)


def lockstep_calls(buckets, steps, devices: int = 1) -> list[np.ndarray]:
    """Positions (into `buckets` [N], lock-step finalists' padded replica counts) replayed together,
    by replica count: each call's loop costs LOCKSTEP_STEP_S x its padded replicas x its lanes per
    device x its longest `steps` [N]. One call where `steps` is None or not finite."""
    buckets = np.asarray(buckets, np.int64)
    if steps is None or not np.all(np.isfinite(steps)) or np.unique(buckets).size == 1:
        return [np.arange(buckets.size)]
    steps = np.asarray(steps, np.float64)

    def loop_s(call):
        per_device = -(-call.size // devices)  # the driver pads lanes to fill the devices
        return LOCKSTEP_STEP_S * int(buckets[call].max()) * per_device * float(np.max(steps[call]))

    return contiguous_calls(buckets, loop_s)


def replica_bucket(data_parallel_size) -> np.ndarray:
    """[F] the replica count each finalist's lanes are padded to: the replay's own rule for
    `max_replicas` (`bucket_size(dp, 1)`)."""
    return np.array([bucket_size(int(d), 1) for d in np.asarray(data_parallel_size).reshape(-1)], np.int64)
