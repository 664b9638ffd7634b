"""Stage 1, structure: vLLM's own rules (`funnel.rules`), node fit, GPU budget, FP8 / FP4 / MXFP4 / INT4
support, and expert parallelism that has nothing to split."""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.rules import BUDGET_BELOW_SEQS, LAYOUT_RULES
from jaxplan.grid import Candidates
from jaxplan.physics.shapes import Hardware, ModelShape
from jaxplan.physics.step_time import fp4_weights, fp8_weights
from jaxplan.specs.formats import INT4, MXFP4

# Checked before the GPU budget, and true of every DP value of a configuration: the funnel's DP
# factorisation (`chunk.reason_counts`) counts them once per configuration.
BEFORE_BUDGET = (*(rule.reason for rule in LAYOUT_RULES), Reason.EP_ONE_GPU, Reason.NODE_FIT)
# vLLM's Marlin and MXFP4 MoE kernels need compute capability 8.0 (`Mxfp4Config.get_min_capability`).
EXPERT_FORMAT_MIN_CAPABILITY = 8.0


def before_budget(code: jnp.ndarray) -> jnp.ndarray:
    """[C] bool: the reason code is one of BEFORE_BUDGET."""
    hit = jnp.zeros(jnp.shape(code), bool)
    for reason in BEFORE_BUDGET:
        hit = hit | (code == reason)
    return hit


def first_failure(checks: list[tuple[jnp.ndarray, Reason]]) -> jnp.ndarray:
    """[C] int32: the first failed check's reason (checks in priority order), else ADMITTED."""
    code = jnp.int32(Reason.ADMITTED)
    for failed, reason in reversed(checks):
        code = jnp.where(failed, jnp.int32(reason), code)
    return code


def structure(model: ModelShape, hw: Hardware, c: Candidates, gpu_budget, allow_multi_node) -> jnp.ndarray:
    """[C] reason code; hw is gathered per candidate."""
    tp, pp = c.tensor_parallel_size, c.pipeline_parallel_size
    engine = (model, tp, pp, c.max_num_seqs, c.max_num_batched_tokens)
    gpus_per_replica = tp * pp
    # A lock-step server's ranks must sit on one node when multi-node is off.
    gpus_per_server = gpus_per_replica * c.lockstep_ranks
    expert_only = (c.expert_weight_format == MXFP4.code) | (c.expert_weight_format == INT4.code)
    old_cuda = (hw.compute_capability > 0) & (hw.compute_capability < EXPERT_FORMAT_MIN_CAPABILITY)
    checks = [
        *((rule.fails(*engine), rule.reason) for rule in LAYOUT_RULES),
        ((c.expert_parallel > 0) & (tp * c.lockstep_ranks <= 1), Reason.EP_ONE_GPU),
        ((gpus_per_server > hw.gpus_per_node) & ~allow_multi_node, Reason.NODE_FIT),
        (gpus_per_replica * c.data_parallel_size > gpu_budget, Reason.GPU_BUDGET),
        (fp8_weights(c.weight_bytes_per_param) & (hw.fp8_flops_per_s <= 0), Reason.FP8_UNSUPPORTED),
        (fp4_weights(c.weight_bytes_per_param) & (hw.fp4_flops_per_s <= 0), Reason.FP4_UNSUPPORTED),
        (expert_only & old_cuda, Reason.EXPERT_FORMAT_UNSUPPORTED),
        (BUDGET_BELOW_SEQS.fails(*engine), BUDGET_BELOW_SEQS.reason),
    ]
    return first_failure(checks)
