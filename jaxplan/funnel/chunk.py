"""One jitted step of the funnel: decode a chunk, run stages 1-4, fold it into the streaming tables.

This is the thin composer (brax `pipeline.py` style): each stage lives in its
own module; this file only threads their outputs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from jaxplan.funnel.capacity import capacity
from jaxplan.funnel.estimate import estimate_stage
from jaxplan.funnel.memory import memory
from jaxplan.funnel.reasons import NUM_REASONS, Reason
from jaxplan.funnel.structure import structure
from jaxplan.funnel.tables import NEG_INF, BestTable, merge_chunk
from jaxplan.grid import DP_AXIS, Candidates, candidates_from_digits, decode_digits, layout_index
from jaxplan.physics.shapes import Hardware, Layout, ModelShape, take, traced
from jaxplan.physics.steady_state import prepare
from jaxplan.physics.traffic import WorkloadParams, max_context_tokens

FRONTIER_GPU_BINS = 64  # quarter-octave bins of GPU count
FRONTIER_TPOT_BINS = 64  # 1 ms .. 10 s, log-spaced


class SweepContext(NamedTuple):
    """Everything a chunk needs; all arrays (traced), so one compilation serves every model and GPU set."""

    axis_values: tuple  # per axis [n_a] float32
    sizes: jnp.ndarray  # [A] int32
    model: ModelShape
    hardware: Hardware  # [G] fields
    workload: WorkloadParams
    gpu_budget: jnp.ndarray
    allow_multi_node: jnp.ndarray  # bool
    gpu_memory_utilization: jnp.ndarray
    block_size_tokens: jnp.ndarray


class SweepState(NamedTuple):
    layouts: BestTable  # [num_layouts]: best candidate per (GPU, TP, PP, DP)
    frontier: BestTable  # [GPU bins x TPOT bins]: best throughput per GPU


class Evaluated(NamedTuple):
    """Per-candidate results of stages 1-4 ([C] each)."""

    reason: jnp.ndarray
    score: jnp.ndarray
    layout: Layout
    estimate: object
    cost_per_million_usd: jnp.ndarray
    hourly_usd: jnp.ndarray
    kv_blocks: jnp.ndarray
    bound: jnp.ndarray


def layout_of(c: Candidates) -> Layout:
    return Layout(
        c.tensor_parallel_size, c.pipeline_parallel_size, c.data_parallel_size,
        c.weight_bytes_per_param, c.kv_bytes_per_element, c.max_num_seqs, c.max_num_batched_tokens,
    )


def cheap_sieves(ctx: SweepContext, c: Candidates) -> jnp.ndarray:
    """Stages 1-2 (structure, memory) for a chunk: [C] reason code."""
    hw = take(ctx.hardware, c.gpu_index)
    layout = layout_of(c)
    s1 = structure(ctx.model, hw, c, ctx.gpu_budget, ctx.allow_multi_node)
    s2 = memory(ctx.model, hw, layout, max_context_tokens(ctx.workload), ctx.gpu_memory_utilization, ctx.block_size_tokens)
    reason = jnp.where(s1 == Reason.ADMITTED, s2, s1)
    return jnp.where(c.valid, reason, jnp.int32(Reason.PADDING))


def evaluate(ctx: SweepContext, c: Candidates) -> Evaluated:
    """Stages 1-4 for candidates; the first failing stage's reason is kept."""
    hw = take(ctx.hardware, c.gpu_index)
    layout = layout_of(c)
    reason = cheap_sieves(ctx, c)
    s3, b_max, bound, blocks = capacity(ctx.model, hw, layout, ctx.workload, ctx.gpu_memory_utilization, ctx.block_size_tokens)
    s4, est, per_million, hourly, score = estimate_stage(ctx.model, hw, layout, ctx.workload, ctx.gpu_memory_utilization, (b_max, bound))
    for later in (s3, s4):
        reason = jnp.where(reason == Reason.ADMITTED, later, reason)
    finite = jnp.isfinite(score) & jnp.isfinite(est.output_tokens_per_s)
    score = jnp.where((reason == Reason.ADMITTED) & finite, score, NEG_INF)
    return Evaluated(reason, score, layout, est, per_million, hourly, blocks, est.bound)


def frontier_bin(layout: Layout, tpot_s) -> jnp.ndarray:
    gpu_bin = jnp.clip(jnp.floor(4.0 * jnp.log2(layout.num_gpus)), 0, FRONTIER_GPU_BINS - 1)
    decades = jnp.log10(jnp.maximum(tpot_s, 1e-6) / 1e-3)
    tpot_bin = jnp.clip(jnp.floor(decades / 4.0 * FRONTIER_TPOT_BINS), 0, FRONTIER_TPOT_BINS - 1)
    return (gpu_bin * FRONTIER_TPOT_BINS + tpot_bin).astype(jnp.int32)


def histogram(reason: jnp.ndarray) -> jnp.ndarray:
    return jnp.zeros(NUM_REASONS, jnp.int32).at[reason].add(1)


def compact(mask: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(positions of the True entries in order, padded with 0 to [C]; their count)."""
    size = mask.shape[0]
    slot = jnp.where(mask, jnp.cumsum(mask) - 1, size)
    order = jnp.zeros(size, jnp.int32).at[slot].set(jnp.arange(size, dtype=jnp.int32), mode="drop")
    return order, jnp.sum(mask, dtype=jnp.int32)


def fold(state: SweepState, ctx: SweepContext, c: Candidates, ev: Evaluated) -> SweepState:
    layouts = merge_chunk(state.layouts, layout_index(c.digits, ctx.sizes), ev.score, c.digits)
    per_gpu = ev.estimate.output_tokens_per_s / ev.layout.num_gpus
    frontier_score = jnp.where(ev.score > NEG_INF, per_gpu, NEG_INF)
    frontier = merge_chunk(state.frontier, frontier_bin(ev.layout, ev.estimate.tpot_p99_s), frontier_score, c.digits)
    return SweepState(layouts, frontier)


def outer_sieves(ctx: SweepContext, outer: Candidates):
    """Stages 1-3 and the demand-independent part of stage 4 for DP-less configurations [Co].

    Returns (structure reason without the GPU-budget check, memory/capacity reason, blocks, Prepared)."""
    hw = take(ctx.hardware, outer.gpu_index)
    layout = layout_of(outer)
    s1 = structure(ctx.model, hw, outer, jnp.inf, ctx.allow_multi_node)
    s2 = memory(ctx.model, hw, layout, max_context_tokens(ctx.workload), ctx.gpu_memory_utilization, ctx.block_size_tokens)
    s3, b_max, bound, blocks = capacity(ctx.model, hw, layout, ctx.workload, ctx.gpu_memory_utilization, ctx.block_size_tokens)
    later = jnp.where(s2 == Reason.ADMITTED, s3, s2)
    prepared = prepare(ctx.model, hw, layout, ctx.workload, ctx.gpu_memory_utilization, (b_max, bound))
    return s1, later, blocks, prepared


def combine_reasons(s1, later, over_budget) -> jnp.ndarray:
    """The flat funnel's first-failure order: TP/PP/node checks, then the budget, then the rest."""
    before_budget = (s1 == Reason.TP_HEADS) | (s1 == Reason.PP_LAYERS) | (s1 == Reason.NODE_FIT)
    reason = jnp.where(before_budget, s1, jnp.where(over_budget, jnp.int32(Reason.GPU_BUDGET), s1))
    return jnp.where(reason == Reason.ADMITTED, later, reason)


def reason_counts(s1, later, valid, within, num_dp: int):
    """Reason histogram [NUM_REASONS] of a chunk's [Co x DP] candidates before the rest of stage 4,
    from per-configuration values [Co], and the survivors per configuration [Co].

    within: DP values whose replicas fit the GPU budget (a prefix). Survivors count as PADDING here;
    stage 4 counts them with their own reason."""
    before_budget = (s1 == Reason.TP_HEADS) | (s1 == Reason.PP_LAYERS) | (s1 == Reason.NODE_FIT)
    rest = jnp.where(s1 == Reason.ADMITTED, later, s1)  # the reason of the candidates within the budget
    open_row = valid & ~before_budget
    survive = open_row & (rest == Reason.ADMITTED)
    add = lambda h, reason, n: h.at[reason].add(n)  # noqa: E731
    counts = jnp.zeros(NUM_REASONS, jnp.int32)
    counts = add(counts, jnp.int32(Reason.PADDING), jnp.sum(jnp.where(~valid, num_dp, 0)) + jnp.sum(jnp.where(survive, within, 0)))
    counts = add(counts, s1, jnp.where(valid & before_budget, num_dp, 0))
    counts = add(counts, jnp.int32(Reason.GPU_BUDGET), jnp.sum(jnp.where(open_row, num_dp - within, 0)))
    counts = add(counts, rest, jnp.where(open_row & ~survive, within, 0))
    return counts, jnp.where(survive, within, 0).astype(jnp.int32)


def device_chunk(state: SweepState, ctx: SweepContext, base_digits: jnp.ndarray, offsets: jnp.ndarray, page_size: int):
    """One device's share of a chunk, factorised over DP (the innermost axis).

    The chunk is Co DP-less configurations x |DP|. Stages 1-3 and the demand-independent part of
    stage 4 run once per configuration [Co]; the GPU-budget check runs on [Co, DP]; the rest of
    stage 4 runs only on the survivors, gathered into pages of `page_size` (a while loop runs as
    many pages as needed). Offsets are contiguous and start at a multiple of |DP|."""
    num_dp = ctx.axis_values[DP_AXIS].shape[0]
    outer_offsets = offsets[::num_dp] // num_dp
    outer_digits, outer_valid = decode_digits(ctx.sizes[:DP_AXIS], base_digits[:DP_AXIS], outer_offsets)
    first_dp = jnp.zeros((outer_digits.shape[0], 1), jnp.int32)
    outer = candidates_from_digits(ctx.axis_values, jnp.concatenate([outer_digits, first_dp], axis=1), outer_valid)
    s1, later, _, prepared = outer_sieves(ctx, outer)

    # DP values ascend (SearchSpace sorts them), and every reason but the GPU budget is per
    # configuration, so a configuration's survivors are a prefix of its DP values: count them per
    # row, and find a page position's row by a search over the rows' running totals (no [Co x DP]
    # mask, cumsum or scatter).
    dp_values = ctx.axis_values[DP_AXIS]
    gpus_per_replica = outer.tensor_parallel_size * outer.pipeline_parallel_size
    within = jnp.sum(gpus_per_replica[:, None] * dp_values[None, :] <= ctx.gpu_budget, axis=1, dtype=jnp.int32)  # [Co]
    counts, survivors_per_row = reason_counts(s1, later, outer_valid, within, num_dp)
    row_end = jnp.cumsum(survivors_per_row)
    survivors = row_end[-1]

    def body(carry):
        page, state, counts = carry
        position = page * page_size + jnp.arange(page_size, dtype=jnp.int32)
        which = jnp.minimum(jnp.searchsorted(row_end, position, side="right"), row_end.shape[0] - 1).astype(jnp.int32)
        dp_digit = position - (row_end[which] - survivors_per_row[which])
        digits = jnp.concatenate([outer_digits[which], dp_digit[:, None]], axis=1)
        picked = candidates_from_digits(ctx.axis_values, digits, position < survivors)
        ev = evaluate_survivors(ctx, picked, prepared.take(which))
        return page + 1, fold(state, ctx, picked, ev), counts + histogram(ev.reason)

    _, state, counts = jax.lax.while_loop(lambda carry: carry[0] * page_size < survivors, body, (jnp.int32(0), state, counts))
    return state, counts


def evaluate_survivors(ctx: SweepContext, c: Candidates, prepared) -> Evaluated:
    """Stage 4 for candidates that passed stages 1-3 (invalid ones come back as PADDING)."""
    hw = take(ctx.hardware, c.gpu_index)
    layout = layout_of(c)
    capacity_known = (prepared.b_max, prepared.bound)
    s4, est, per_million, hourly, score = estimate_stage(ctx.model, hw, layout, ctx.workload, ctx.gpu_memory_utilization, capacity_known, prepared)
    reason = jnp.where(c.valid, s4, jnp.int32(Reason.PADDING))
    finite = jnp.isfinite(score) & jnp.isfinite(est.output_tokens_per_s)
    score = jnp.where((reason == Reason.ADMITTED) & finite, score, NEG_INF)
    return Evaluated(reason, score, layout, est, per_million, hourly, jnp.zeros_like(score), est.bound)


@functools.partial(jax.jit, static_argnames=("model", "mesh", "page_size"), donate_argnames=("state",))
def sweep_chunk(state: SweepState, ctx: SweepContext, base_digits: jnp.ndarray, offsets: jnp.ndarray, *, model: ModelShape, mesh, page_size: int):
    """Per-device (state, reason histogram) after the chunk at base + offsets. `state` is donated.

    `ctx.model` is ignored (pass None); the static `model` is folded into the kernel.
    `state` and the result carry a leading device axis [D, ...]; offsets [D * chunk/D] are split
    contiguously across devices. Tables are merged across devices on the host (`merge_tables`)."""
    spec = PartitionSpec("candidates")
    ctx = ctx._replace(model=None)

    def per_device(state, ctx, base_digits, offsets):
        ctx = ctx._replace(model=model)
        local = jax.tree.map(lambda x: x[0], state)
        new_state, counts = device_chunk(local, ctx, base_digits, offsets, page_size)
        return jax.tree.map(lambda x: x[None], new_state), counts[None]

    return jax.shard_map(per_device, mesh=mesh, in_specs=(spec, PartitionSpec(), PartitionSpec(), spec), out_specs=(spec, spec), check_vma=False)(
        state, ctx, base_digits, offsets
    )


@jax.jit
def _evaluate_digits(ctx: SweepContext, digits: jnp.ndarray) -> Evaluated:
    c = candidates_from_digits(ctx.axis_values, digits, jnp.ones(digits.shape[0], bool))
    return evaluate(ctx, c)


def evaluate_digits(ctx: SweepContext, digits: jnp.ndarray) -> Evaluated:
    """Stages 1-4 for explicit candidates given by their digits [K, A] (for reports). The model
    shape is traced (a few rows: one program per K serves every model)."""
    return _evaluate_digits(ctx._replace(model=traced(ctx.model)), digits)
