"""ReplayConfig: the per-finalist scheduler capacities the replay needs.

Every field but `block_size` and `routing` is an int32 array of shape [F] (one
entry per finalist); they are traced values inside the replay, so finalists
that differ in any of them share one compiled program. `block_size` and
`routing` are static (one program each).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxplan.errors import bad_value
from jaxplan.replay.routing import routing_policy

# Most allowed per field. Token and block sums stay below 2**24 so that the
# replay's float32 prefix sums are exact; 4,096 running requests per replica.
LIMITS = {"max_num_seqs": 4096, "max_num_batched_tokens": 2**24, "num_kv_blocks": 2**24, "data_parallel_size": 1024, "pipeline_parallel_size": 64, "lockstep_ranks": 1024}
def check_routing(routing) -> str:
    """`routing` if it names a routing policy (routing.POLICIES), else a one-line PlanError listing the known ones."""
    return routing_policy(routing).name


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """vLLM scheduler capacities per finalist, each an int32 array [F].

    max_num_seqs: most running requests per replica (vLLM `max_num_seqs`).
    max_num_batched_tokens: token budget of one scheduler step (one micro-batch) per replica.
    num_kv_blocks: KV-cache blocks per replica (from the physics' memory model).
    data_parallel_size: replicas, each with its own scheduler and KV cache.
    pipeline_parallel_size: PP micro-batches in flight per replica (vLLM's batch queue). One
        replica step (the physics' `step_time_s`) carries PP micro-batches, each with its own
        token budget: pp x max_num_batched_tokens tokens in all, at most one budget per request
        (a request sits in one micro-batch), as stage 4 assumes.
    lockstep_ranks: DP ranks of a MoE deployment that step together (vLLM's
        `--data-parallel-size` for a MoE model): replica r is in group r // lockstep_ranks, which
        divides data_parallel_size; 1 = independent replicas. Only the "dp_coordinator" routing
        runs groups of more than one (lockstep.py).
    block_size: tokens per KV block (static, shared by all finalists).
    prefix_caching: vLLM's prefix cache is on (static): a preempted request's blocks stay cached
        until reused, so readmitted it recomputes only what other requests took (scheduler.py).
    routing: the routing policy's name (routing.POLICIES): "round_robin" (request i to replica
        i % dp), "least_loaded" (to the replica with the fewest waiting + running requests at
        its arrival) or "dp_coordinator" (vLLM's DP load balancing, to the rank with the lowest
        4 x waiting + running, over lock-step groups); static.
    """

    max_num_seqs: np.ndarray
    max_num_batched_tokens: np.ndarray
    num_kv_blocks: np.ndarray
    data_parallel_size: np.ndarray
    pipeline_parallel_size: np.ndarray
    lockstep_ranks: np.ndarray
    block_size: int = dataclasses.field(default=16, metadata={"static": True})
    routing: str = dataclasses.field(default="round_robin", metadata={"static": True})
    prefix_caching: bool = dataclasses.field(default=True, metadata={"static": True})

    @staticmethod
    def create(max_num_seqs, max_num_batched_tokens, num_kv_blocks, data_parallel_size=1, block_size: int = 16, routing: str = "round_robin", pipeline_parallel_size=1, lockstep_ranks=1, prefix_caching: bool = True) -> ReplayConfig:
        """Broadcast scalars / sequences to int32 arrays [F] and validate them (PlanError naming the field)."""
        raw = (max_num_seqs, max_num_batched_tokens, num_kv_blocks, data_parallel_size, pipeline_parallel_size, lockstep_ranks)
        try:
            values = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in raw))
        except (TypeError, ValueError) as err:
            raise bad_value("ReplayConfig fields", [np.shape(v) for v in raw], f"must be numbers broadcasting to one [F] shape ({err})") from None
        fields = {}
        for (name, most), value in zip(LIMITS.items(), values):
            if value.ndim != 1:
                raise bad_value(name, value.shape, "must be a scalar or a 1-D array [F]", where="ReplayConfig")
            if not np.all(np.isfinite(value)) or np.any(value != np.round(value)) or np.any(value < 1) or np.any(value > most):
                raise bad_value(name, value.tolist()[:8], f"must be integers in 1..{most:,}", where="ReplayConfig")
            fields[name] = value.astype(np.int32)
        step_tokens = fields["max_num_batched_tokens"].astype(np.int64) * fields["pipeline_parallel_size"]
        if np.any(step_tokens > LIMITS["max_num_batched_tokens"]):
            raise bad_value("pipeline_parallel_size x max_num_batched_tokens", step_tokens.tolist()[:8], f"must be at most {LIMITS['max_num_batched_tokens']:,} tokens per step", where="ReplayConfig")
        if np.any(fields["data_parallel_size"] % fields["lockstep_ranks"]):
            raise bad_value("lockstep_ranks", fields["lockstep_ranks"].tolist()[:8], f"must divide data_parallel_size {fields['data_parallel_size'].tolist()[:8]} (groups of lock-step ranks)", where="ReplayConfig")
        routing = check_routing(routing)
        if routing != "dp_coordinator" and np.any(fields["lockstep_ranks"] > 1):
            raise bad_value("routing", routing, "runs independent replicas; lock-step ranks (lockstep_ranks > 1) need routing 'dp_coordinator'", where="ReplayConfig")
        if not isinstance(block_size, int) or isinstance(block_size, bool) or not 1 <= block_size <= 4096:
            raise bad_value("block_size", block_size, "must be an integer in 1..4096 tokens", where="ReplayConfig")
        return ReplayConfig(**fields, block_size=block_size, routing=routing, prefix_caching=bool(prefix_caching))

    @property
    def num_finalists(self) -> int:
        return int(np.shape(self.max_num_seqs)[0])
