"""Stage 1, structure: divisibility, node fit, GPU budget, FP8 / FP4 support, vLLM's own rules."""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.funnel.reasons import Reason
from jaxplan.grid import Candidates
from jaxplan.physics.shapes import Hardware, ModelShape
from jaxplan.physics.step_time import fp4_weights, fp8_weights


def first_failure(checks: list[tuple[jnp.ndarray, Reason]]) -> jnp.ndarray:
    """[C] int32: the first failed check's reason (checks in priority order), else ADMITTED."""
    code = jnp.int32(Reason.ADMITTED)
    for failed, reason in reversed(checks):
        code = jnp.where(failed, jnp.int32(reason), code)
    return code


def structure(model: ModelShape, hw: Hardware, c: Candidates, gpu_budget, allow_multi_node) -> jnp.ndarray:
    """[C] reason code; hw is gathered per candidate."""
    tp, pp = c.tensor_parallel_size, c.pipeline_parallel_size
    gpus_per_replica = tp * pp
    checks = [
        ((jnp.mod(model.q_heads, tp) != 0) | (jnp.mod(model.hidden_size, tp) != 0), Reason.TP_HEADS),
        (jnp.mod(model.num_layers, pp) != 0, Reason.PP_LAYERS),
        ((gpus_per_replica > hw.gpus_per_node) & ~allow_multi_node, Reason.NODE_FIT),
        (gpus_per_replica * c.data_parallel_size > gpu_budget, Reason.GPU_BUDGET),
        (fp8_weights(c.weight_bytes_per_param) & (hw.fp8_flops_per_s <= 0), Reason.FP8_UNSUPPORTED),
        (fp4_weights(c.weight_bytes_per_param) & (hw.fp4_flops_per_s <= 0), Reason.FP4_UNSUPPORTED),
        (c.max_num_batched_tokens < c.max_num_seqs, Reason.BUDGET_BELOW_SEQS),
    ]
    return first_failure(checks)
