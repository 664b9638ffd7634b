"""Stage 3, capacity: KV blocks -> concurrent requests per replica (min with max_num_seqs, token budget)."""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.funnel.reasons import Reason
from jaxplan.physics.memory import kv_blocks_per_replica
from jaxplan.physics.shapes import Hardware, Layout, ModelShape
from jaxplan.physics.steady_state import max_concurrency
from jaxplan.physics.traffic import WorkloadParams


def capacity(model: ModelShape, hw: Hardware, layout: Layout, w: WorkloadParams, gpu_memory_utilization, block_size_tokens):
    """(reason [C], slots b_max [C], bound code [C], kv blocks per replica [C])."""
    b_max, bound = max_concurrency(model, hw, layout, w, gpu_memory_utilization)
    blocks = kv_blocks_per_replica(model, hw, layout, gpu_memory_utilization, block_size_tokens)
    reason = jnp.where(b_max < 1.0, jnp.int32(Reason.NO_CONCURRENCY), jnp.int32(Reason.ADMITTED))
    return reason, b_max, bound, blocks
