"""Stage 2, memory: weights, activations and reserve fit, with room for one longest request's KV."""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.structure import first_failure
from jaxplan.physics.memory import kv_budget_bytes_per_gpu, request_kv_bytes_per_gpu
from jaxplan.physics.shapes import Hardware, Layout, ModelShape


def memory(model: ModelShape, hw: Hardware, layout: Layout, longest_context_tokens, gpu_memory_utilization, block_size_tokens) -> jnp.ndarray:
    """[C] reason code."""
    free = kv_budget_bytes_per_gpu(model, hw, layout, gpu_memory_utilization)
    longest = request_kv_bytes_per_gpu(model, layout, longest_context_tokens, block_size_tokens)
    return first_failure([(free <= 0, Reason.WEIGHTS_DONT_FIT), (free < longest, Reason.NO_KV_FOR_LONGEST_REQUEST)])
