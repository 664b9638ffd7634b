"""How a finalist's replicas are spread over lanes, chosen on the host before the replay.

Under a routing policy whose replicas are independent (round robin), a finalist's replicas may be
replayed on several lanes, each a contiguous range of them, so that the loop, which runs as long
as the busiest lane, is shorter. `choose_split` picks lanes per finalist from a work estimate,
`lane_split` lays them out (`LaneSplit`), padded to `lane_count_bucket` lanes.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from jaxplan.buckets import bucket_size


class LaneSplit(NamedTuple):
    """How finalists' replicas are spread over lanes: lane l replays the replicas
    [first[l], end[l]) of finalist finalist[l], one after the other; end <= first is a padding lane."""

    finalist: jnp.ndarray  # [L] int32
    first: jnp.ndarray  # [L] int32
    end: jnp.ndarray  # [L] int32
    lane_of: jnp.ndarray  # [F, D] int32 lane that replays each finalist's replica (past dp: its last lane)


# Host-side split: a lane costs about as much per loop iteration as any other (vmapped), plus a
# fixed cost per iteration of about LANE_OVERHEAD lanes (measured on XLA:CPU, 1..96 lanes).
LANE_OVERHEAD = 2.0


def lane_count_bucket(lanes: int, num_finalists: int, devices: int = 1) -> int:
    """Padded lane count: F when no finalist is split, else the next power of two (one program per
    bucket); then rounded up to a multiple of `devices`, the devices the lanes are sharded over."""
    padded = num_finalists if lanes <= num_finalists else bucket_size(lanes, 1)
    return -(-padded // devices) * devices


def split_sizes(dp, lanes_per_finalist) -> list[list[int]]:
    """Replicas per lane: finalist f's dp[f] replicas in k[f] contiguous groups, the larger groups first."""
    return [[n // k + (j < n % k) for j in range(k)] for n, k in zip((int(x) for x in dp), (int(x) for x in lanes_per_finalist))]


def choose_split(dp, work=None, *, max_replicas_per_lane: int | None = None, lanes: int | None = None, devices: int = 1) -> np.ndarray:
    """Lanes per finalist k [F] (1 = not split), chosen on the host before the replay.

    dp: routed replicas [F]. work: estimated loop iterations per replica [F] (replicas of one
    finalist see the same traffic, so about the same). The loop runs as long as the busiest lane
    (k[f] lanes of finalist f hold ceil(dp / k) replicas each) and costs about
    (padded lanes / devices + LANE_OVERHEAD) per iteration (each device loops over its share):
    k minimises that product. `lanes` fixes the
    padded lane count (memory chunks); max_replicas_per_lane: k = ceil(dp / it), no estimate.
    Without either `work` or max_replicas_per_lane: k = 1 (the split pays only for a good estimate).
    """
    dp = np.maximum(np.asarray(dp, np.int64), 1)
    num_f = dp.shape[0]
    if max_replicas_per_lane is not None:
        k = -(-dp // max_replicas_per_lane)
        return k if lanes is None or k.sum() <= lanes else np.ones_like(dp)
    if work is None:
        return np.ones_like(dp)
    w = np.maximum(np.asarray(work, np.float64), 1.0)
    # Candidate lane loads: every finalist's work times a replica count; each gives the split
    # with the fewest lanes that keeps every lane at or below it.
    targets = np.unique(np.concatenate([w[f] * np.arange(1, dp[f] + 1) for f in range(num_f)]))
    targets = targets[targets >= w.max() * (1 - 1e-9)]
    per = np.clip(np.floor(targets[:, None] / w[None, :] * (1 + 1e-9)), 1, dp[None, :])  # [T, F] replicas per lane
    k = -(-dp[None, :] // per.astype(np.int64))
    load = np.max(-(-dp[None, :] // k) * w[None, :], axis=1)
    count = k.sum(axis=1)
    if lanes is None:
        padded = np.array([lane_count_bucket(int(c), num_f, devices) for c in count], np.float64)
        cost = (padded / devices + LANE_OVERHEAD) * load
    else:
        cost = np.where(count <= lanes, load, np.inf)
    best = int(np.flatnonzero(cost <= np.min(cost) * (1 + 1e-9))[-1])  # ties: the largest target, fewest lanes
    return k[best] if np.isfinite(cost[best]) else np.ones_like(dp)


def one_lane_each(dp, work=None, **_) -> np.ndarray:
    """Lanes per finalist k [F] for a policy whose replicas are coupled (they share one lane): all 1."""
    return np.ones_like(np.asarray(dp, np.int64))


def unpadded_lane_count(lanes: int, num_finalists: int, devices: int = 1) -> int:
    """Lane count for a policy with one lane per finalist: F, not padded for the devices."""
    return num_finalists


def lane_split(dp, lanes_per_finalist, max_dp: int, lanes: int | None = None) -> LaneSplit:
    """The LaneSplit (numpy) for k [F] lanes per finalist, padded to `lanes` (default lane_count_bucket;
    padding lanes replay nothing)."""
    dp = np.asarray(dp, np.int64)
    num_f = dp.shape[0]
    sizes = split_sizes(dp, lanes_per_finalist)
    count = sum(len(x) for x in sizes)
    total = lane_count_bucket(count, num_f) if lanes is None else lanes
    finalist, first, end = np.zeros(total, np.int32), np.zeros(total, np.int32), np.zeros(total, np.int32)
    lane_of = np.zeros((num_f, max_dp), np.int32)
    lane = 0
    for f, groups in enumerate(sizes):
        start = 0
        for size in groups:
            finalist[lane], first[lane], end[lane] = f, start, start + size
            lane_of[f, start : start + size] = lane
            start += size
            lane += 1
        lane_of[f, start:] = lane - 1
    return LaneSplit(finalist, first, end, lane_of)
