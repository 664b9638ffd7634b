"""Routing policies: how requests reach a finalist's data-parallel replicas, as one object each.

The driver looks the policy up by name once (`routing_policy`) and from then on calls only its
functions, so adding a policy is adding one `RoutingPolicy` to POLICIES (and its module). The
traceable functions run inside the driver's jitted programs, written for one lane and vmapped
(`step`, `done`, `demand`) or for all lanes at once (`start`, `widen`, `merge`); the policy
itself is a static argument of those programs (one program per policy).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numpy as np

from jaxplan.buckets import bucket_size
from jaxplan.errors import unknown_name
from jaxplan.replay import balance, lockstep, roundrobin, split
from jaxplan.replay.scheduler import lane_done
from jaxplan.replay.step import lane_step
from jaxplan.replay.traffic import routing_dp


@dataclasses.dataclass(frozen=True)
class RoutingPolicy:
    """What a routing policy supplies to the replay. Lanes [L]; finalists [F]; replicas [D] (padded).

    name: the policy's name (ReplayConfig.routing, the CLI's --routing).
    routed_replicas(data_parallel_size [F], closed_concurrency) -> [F] int replicas that receive
        requests (host, NumPy).
    choose_split(dp [F], work [F] | None, *, max_replicas_per_lane, lanes, devices) -> [F] lanes
        per finalist (host); all 1 when a finalist's replicas share one lane.
    lane_count(lanes, num_finalists, devices) -> int: the padded lane count (host).
    start(requests, num_requests, config, closed_concurrency, split, *, max_dp, num_slots) ->
        (Lanes [L], lane states [L], stream position of each request [F, R]).
    step(state, lane, params, freeze_on_overflow, *, step_time_fn, window, block_size) -> state:
        one loop iteration of one lane.
    done(state, lane) -> bool: the lane has nothing left to do.
    lane_state(state) -> LaneState: the scheduler tables inside a lane state.
    demand(state, lane) -> int: most requests one of the lane's replicas wants in flight now.
    widen(inputs [L], states [L], extra) -> (inputs, states) with `extra` more slot rows.
    merge(inputs [L], states [L], position [F, R], split, dp [F], lanes_done [L]) ->
        (inputs [F], LaneState [F], rec_i, rec_f [F, 3, R] by stream position, replica [F, R],
        replica_done [F, D]).
    route_bytes_per_replica: memory estimate, bytes per request and replica of the routing's own
        arrays. tables_of_every_replica: a lane holds every replica's slot tables at once.
    """

    name: str
    routed_replicas: Callable
    choose_split: Callable
    lane_count: Callable
    start: Callable
    step: Callable
    done: Callable
    lane_state: Callable
    demand: Callable
    widen: Callable
    merge: Callable
    route_bytes_per_replica: int
    tables_of_every_replica: bool


def _round_robin_replicas(data_parallel_size, closed_concurrency) -> np.ndarray:
    return np.asarray(routing_dp(np.asarray(data_parallel_size), closed_concurrency, xp=np))


def _every_replica(data_parallel_size, closed_concurrency) -> np.ndarray:
    return np.asarray(data_parallel_size)


def _same_state(state):
    return state


# Request i to replica i % dp (min(dp, clients) replicas in closed loop); replicas independent,
# so they may be split over lanes. Its [R, D] routing comparisons are bools.
ROUND_ROBIN = RoutingPolicy(
    name="round_robin",
    routed_replicas=_round_robin_replicas,
    choose_split=split.choose_split,
    lane_count=split.lane_count_bucket,
    start=roundrobin.start_lanes,
    step=lane_step,
    done=lane_done,
    lane_state=_same_state,
    demand=roundrobin.lane_demand,
    widen=roundrobin.widen_lanes,
    merge=roundrobin.merge_lanes,
    route_bytes_per_replica=1,
    tables_of_every_replica=False,
)

# To the replica with the fewest waiting + running requests at the arrival, ties to the lowest
# index; replicas coupled, one lane per finalist. Its routed lists are int32 [D, R], carried twice.
LEAST_LOADED = RoutingPolicy(
    name="least_loaded",
    routed_replicas=_every_replica,
    choose_split=split.one_lane_each,
    lane_count=split.unpadded_lane_count,
    start=balance.start_balanced,
    step=balance.balanced_step,
    done=balance.balanced_done,
    lane_state=balance.balanced_lane_state,
    demand=balance.balanced_demand,
    widen=balance.balanced_widen,
    merge=balance.merge_balanced,
    route_bytes_per_replica=8,
    tables_of_every_replica=True,
)

# vLLM's DP load balancing (to the rank with the lowest 4 x waiting + running) over lock-step groups
# of ranks (lockstep.py; ReplayConfig.lockstep_ranks, 1: independent replicas): one lane per
# finalist, as least loaded. Its step_time_fn takes the group's tokens as a third argument.
DP_COORDINATOR = RoutingPolicy(
    name="dp_coordinator",
    routed_replicas=_every_replica,
    choose_split=split.one_lane_each,
    lane_count=split.unpadded_lane_count,
    start=lockstep.start_lockstep,
    step=lockstep.lockstep_step,
    done=lockstep.lockstep_done,
    lane_state=lockstep.lockstep_lane_state,
    demand=lockstep.lockstep_demand,
    widen=lockstep.lockstep_widen,
    merge=lockstep.merge_lockstep,
    route_bytes_per_replica=8,
    tables_of_every_replica=True,
)

POLICIES = {policy.name: policy for policy in (ROUND_ROBIN, LEAST_LOADED, DP_COORDINATOR)}


@functools.cache  # one object per size: the policy is a static argument of the replay's programs
def lockstep_policy(max_group: int) -> RoutingPolicy:
    """DP_COORDINATOR for a call whose lanes' lock-step groups have at most `max_group` ranks: each
    iteration schedules and prices that many replicas of a lane instead of all of them
    (`lockstep.lockstep_step`); the same replay, bit for bit."""
    return dataclasses.replace(DP_COORDINATOR, step=functools.partial(lockstep.lockstep_step, max_group=max_group))


def call_policy(policy: RoutingPolicy, lockstep_ranks, max_dp: int) -> RoutingPolicy:
    """The policy one replay call runs, its lanes holding `max_dp` replicas of groups of
    `lockstep_ranks` [F]: DP_COORDINATOR stepping one group's rows (`lockstep_policy`, the largest
    group bucketed) where that is fewer than the lane's; every other policy as it is."""
    if policy is not DP_COORDINATOR:
        return policy
    group = bucket_size(int(np.max(lockstep_ranks)), 1)
    return lockstep_policy(group) if group < max_dp else policy


def routing_policy(name) -> RoutingPolicy:
    """The policy called `name`, else a one-line PlanError listing the known ones."""
    policy = POLICIES.get(name) if isinstance(name, str) else None
    if policy is None:
        raise unknown_name("routing", str(name), POLICIES)
    return policy
