"""vLLM's own rules for a configuration: the layouts and knobs it refuses to start.

One definition of each rule, vectorised over candidates: the sweep's stage 1 (`funnel.structure`,
[C] candidates inside jit) and `predict`'s rows (`engine_rules`, [R] rows, a batch of one included)
call the same functions. Each rule is tied to its `Reason` (stage, description, fix) and says, for
one row, why vLLM refuses it.

The rules, from vLLM's start-up checks:
  * TP divides the attention heads (ModelConfig.verify_with_parallel_config) and the hidden size
    (vLLM's parallel linear layers shard weight widths that must divide by TP; the hidden size
    stands for them, and is what jaxplan's weight and activation shares divide);
  * GQA's KV heads and TP divide one another: TP ranks split the KV heads, or replicate them once
    TP exceeds them (MLA's latent is replicated on every rank, so it has no such rule);
  * PP is at most the layer count: layers split unevenly when PP does not divide them
    (vllm/distributed/utils.py get_pp_indices: floor(L / PP) layers per stage, one more on L mod PP
    of them), and the physics prices the largest stage (`physics.memory.pipeline_stages`);
  * the token budget holds max_num_seqs (SchedulerConfig: max_num_batched_tokens >= max_num_seqs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax.numpy as jnp

from jaxplan.funnel.reasons import Reason
from jaxplan.physics.shapes import ModelShape


def tp_splits_heads(model: ModelShape, tp, pp, seqs, budget) -> jnp.ndarray:
    """[C] bool: TP does not divide the attention heads or the hidden size."""
    return (jnp.mod(model.q_heads, tp) != 0) | (jnp.mod(model.hidden_size, tp) != 0)


def _tp_heads_says(name: str, m: ModelShape, tp, pp, seqs, budget) -> str:
    if m.q_heads % tp:
        return f"tensor_parallel_size {tp:g} does not divide {name}'s {m.q_heads:g} attention heads (vLLM refuses to start)"
    return f"tensor_parallel_size {tp:g} does not divide {name}'s hidden size of {m.hidden_size:,.0f} (vLLM refuses to start)"


def tp_and_kv_heads(model: ModelShape, tp, pp, seqs, budget) -> jnp.ndarray:
    """[C] bool: GQA's KV heads and TP do not divide one another (never for MLA)."""
    kv = jnp.maximum(model.kv_heads, 1)
    apart = jnp.where(kv >= tp, jnp.mod(kv, tp), jnp.mod(tp, kv)) != 0
    return (model.kv_split_by_tp > 0) & (model.kv_heads > 0) & apart


def pp_exceeds_layers(model: ModelShape, tp, pp, seqs, budget) -> jnp.ndarray:
    """[C] bool: more pipeline stages than layers (a stage without a layer)."""
    return pp > model.num_layers


def budget_below_seqs(model: ModelShape, tp, pp, seqs, budget) -> jnp.ndarray:
    """[C] bool: the token budget is below max_num_seqs (NaN, i.e. not given, never fails)."""
    return budget < seqs


class EngineRule(NamedTuple):
    reason: Reason  # stage, description and fix
    fails: Callable  # (ModelShape, tp, pp, seqs, budget) -> [C] bool; arguments broadcast
    says: Callable  # (model name, ModelShape, tp, pp, seqs, budget as numbers) -> one line


TP_HEADS = EngineRule(Reason.TP_HEADS, tp_splits_heads, _tp_heads_says)
KV_HEADS = EngineRule(
    Reason.KV_HEADS, tp_and_kv_heads,
    lambda name, m, tp, pp, seqs, budget: f"tensor_parallel_size {tp:g} and {name}'s {m.kv_heads:g} KV heads: one must divide the other (vLLM refuses to start)",
)
PP_LAYERS = EngineRule(
    Reason.PP_LAYERS, pp_exceeds_layers,
    lambda name, m, tp, pp, seqs, budget: f"pipeline_parallel_size {pp:g} exceeds {name}'s {m.num_layers:g} layers (vLLM refuses to start)",
)
BUDGET_BELOW_SEQS = EngineRule(
    Reason.BUDGET_BELOW_SEQS, budget_below_seqs,
    lambda name, m, tp, pp, seqs, budget: f"max_num_batched_tokens {budget:,.0f} is below max_num_seqs {seqs:,.0f} (vLLM refuses to start)",
)
# The layout rules (checked before node fit and the GPU budget), then the knob rule.
LAYOUT_RULES = (TP_HEADS, KV_HEADS, PP_LAYERS)
ENGINE_RULES = (*LAYOUT_RULES, BUDGET_BELOW_SEQS)
