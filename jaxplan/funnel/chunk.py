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
from jaxplan.grid import Candidates, decode, layout_index
from jaxplan.physics.shapes import Hardware, Layout, ModelShape, take
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


def device_chunk(state: SweepState, ctx: SweepContext, base_digits: jnp.ndarray, offsets: jnp.ndarray, page_size: int):
    """One device's share of a chunk: cheap sieves on all of it, then stages 3-4 only on the
    survivors, gathered into pages of `page_size` (a while loop runs as many pages as needed)."""
    c = decode(ctx.axis_values, ctx.sizes, base_digits, offsets)
    early = cheap_sieves(ctx, c)
    order, survivors = compact(early == Reason.ADMITTED)
    counts = histogram(jnp.where(early == Reason.ADMITTED, jnp.int32(Reason.PADDING), early))

    def body(carry):
        page, state, counts = carry
        position = page * page_size + jnp.arange(page_size, dtype=jnp.int32)
        picked = jax.tree.map(lambda field: field[order[jnp.minimum(position, order.shape[0] - 1)]], c)
        picked = picked._replace(valid=position < survivors)
        ev = evaluate(ctx, picked)
        return page + 1, fold(state, ctx, picked, ev), counts + histogram(ev.reason)

    _, state, counts = jax.lax.while_loop(lambda carry: carry[0] * page_size < survivors, body, (jnp.int32(0), state, counts))
    return state, counts


@functools.partial(jax.jit, static_argnames=("model", "mesh", "page_size"))
def sweep_chunk(state: SweepState, ctx: SweepContext, base_digits: jnp.ndarray, offsets: jnp.ndarray, *, model: ModelShape, mesh, page_size: int):
    """Per-device (state, reason histogram) after the chunk at base + offsets.

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


@functools.partial(jax.jit, static_argnames=("model",))
def _evaluate_digits(ctx: SweepContext, digits: jnp.ndarray, model: ModelShape) -> Evaluated:
    ctx = ctx._replace(model=model)
    columns = [digits[:, a] for a in range(digits.shape[1])]
    values = [ctx.axis_values[a][columns[a]] for a in range(len(columns))]
    c = Candidates(digits, jnp.ones(digits.shape[0], bool), columns[0], *values[1:])
    return evaluate(ctx, c)


def evaluate_digits(ctx: SweepContext, digits: jnp.ndarray) -> Evaluated:
    """Stages 1-4 for explicit candidates given by their digits [K, A] (for reports)."""
    return _evaluate_digits(ctx._replace(model=None), digits, ctx.model)
