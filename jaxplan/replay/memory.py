"""How much memory a replay call needs, from its array shapes, before anything is allocated.

The estimate is deliberately generous (every phase's arrays summed, loop
carries counted twice); finalists run in chunks when all of them at once would
exceed the limit, and a request count that does not fit even for one finalist
is refused with a one-line PlanError.
"""

from __future__ import annotations

from typing import NamedTuple

from jaxplan.errors import bad_value
from jaxplan.replay.routing import routing_policy
from jaxplan.replay.state import ITL_BINS, NF, NI
from jaxplan.replay.traffic import request_bucket
from jaxplan.system import available_memory_bytes

MEMORY_FRACTION = 0.5  # default limit: this fraction of the machine's available memory
SERIES_POINTS = 64  # summarize's queue-length samples


class ReplayShape(NamedTuple):
    """The sizes that fix a replay call's arrays."""

    num_finalists: int  # F
    num_requests: int  # R (the replay pads it to `request_bucket(R)`, which the estimate counts)
    max_replicas: int  # D (padded)
    num_slots: int  # S, the most slot rows per replica the call may grow to
    window: int  # decode-jump window
    routing: str  # the routing policy's name (routing.POLICIES)
    lanes_per_finalist: float = 1.0  # round robin: lanes (padded) / F when replicas are split over lanes


def replay_bytes(shape: ReplayShape) -> tuple[int, int]:
    """(bytes per finalist, bytes shared by every finalist) of one replay call."""
    r, d, s = request_bucket(shape.num_requests), shape.max_replicas, shape.num_slots
    policy = routing_policy(shape.routing)
    # Per request and finalist: lanes and padded stream, arrivals and records (loop carry twice),
    # the trace and its gathers, summarize's sorts and series. Measured on XLA:CPU (peak RSS growth
    # of 1M chat requests x 2..16 finalists, dp 4): ~580 bytes; 640 leaves a margin. Routing adds
    # its own per-replica arrays (least loaded: routed lists; round robin: [R, D] comparisons).
    per_request = 640 + policy.route_bytes_per_replica * d
    # Per slot row: the running and preempted tables (int32 NI + float32 NF, carry twice) of every
    # replica held at once (all of them when least-loaded, one otherwise), and ~64 [S] temporaries.
    tables = 2 * 2 * (NI + NF) * 4
    per_slot = tables * (d if policy.tables_of_every_replica else 1) + 64 * 4
    per_finalist = r * per_request + s * per_slot + 2 * ITL_BINS * 4 + 64 * shape.window + 256 * d
    # Every lane past the first holds its own lane arrays: stream (padded copy too), arrivals,
    # records and positions (loop carry twice) per request, and its slot tables.
    per_finalist += int(max(shape.lanes_per_finalist - 1.0, 0.0) * lane_bytes(shape))
    # Shared: the request set on host and device, the trace's per-request fields, numpy copies
    # (measured ~290 bytes per request), and cumsum's triangular matrix [S, S] float32.
    shared = 320 * r + 2 * s * s * 4
    return per_finalist, shared


def lane_bytes(shape: ReplayShape) -> int:
    """Bytes of one more lane (round robin): its share of the loop arrays, not of the trace."""
    r, d, s = request_bucket(shape.num_requests), shape.max_replicas, shape.num_slots
    return r * (LANE_REQUEST_BYTES + d) + s * (2 * 2 * (NI + NF) * 4 + 64 * 4) + 2 * ITL_BINS * 4 + 64 * shape.window + 256 * d


# Per request of one lane: its stream row (int32 x NI) and the lanes' [R, 3] source, arrival and records (1 + 6 words,
# loop carry twice), positions and ids, and the lane gathers of the merge: ~150 bytes; with a margin.
LANE_REQUEST_BYTES = 256


def lanes_per_call(shape: ReplayShape, finalists: int) -> int:
    """Lanes one call of `finalists` finalists gets when they run in chunks (the same for every chunk)."""
    return max(finalists, int(shape.lanes_per_finalist * finalists))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def finalists_per_call(shape: ReplayShape, limit_bytes: int | None = None) -> int:
    """How many finalists one replay call may hold within `limit_bytes` (default
    MEMORY_FRACTION of available memory): all of them, or fewer (run in chunks).
    PlanError if not even one finalist fits."""
    if limit_bytes is None:
        available = available_memory_bytes()
        if available is None:
            return shape.num_finalists
        limit_bytes, source = int(available * MEMORY_FRACTION), f"{MEMORY_FRACTION:.0%} of the available memory"
    else:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, (int, float)) or not limit_bytes > 0:
            raise bad_value("memory_limit_bytes", limit_bytes, "must be a number of bytes > 0")
        source = "the given limit"
    per_finalist, shared = replay_bytes(shape)
    fit = int((limit_bytes - shared) // per_finalist)
    if fit < 1:
        total = shape.num_finalists * per_finalist + shared
        raise bad_value(
            "num_requests",
            shape.num_requests,
            f"a replay of {shape.num_requests:,} requests x {shape.num_finalists} finalists needs about {_gib(total)} "
            f"({_gib(per_finalist + shared)} for one finalist), over {_gib(limit_bytes)} ({source}); replay fewer requests or finalists",
            where="replay",
        )
    return min(fit, shape.num_finalists)
