"""One jitted step of the funnel: decode a chunk, run stages 1-4, fold it into the streaming tables.

This is the thin composer (brax `pipeline.py` style): each stage lives in its
own module; this file only threads their outputs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from jaxplan import compile_ahead, program_cache
from jaxplan.funnel.capacity import capacity
from jaxplan.funnel.estimate import estimate_stage
from jaxplan.funnel.memory import memory
from jaxplan.funnel.reasons import NUM_REASONS, Reason
from jaxplan.funnel.structure import before_budget, structure
from jaxplan.funnel.tables import NEG_INF, BestTable, merge_chunk
from jaxplan.grid import DP_AXIS, Candidates, candidates_from_digits, decode_digits, layout_index, padded_axis
from jaxplan.physics.shapes import Hardware, Layout, ModelShape, take, traced
from jaxplan.physics.steady_state import Prepared, prepare
from jaxplan.physics.traffic import WorkloadParams, max_context_tokens
from jaxplan.xla_options import LEAN_COMPILE, ONE_SHOT_COMPILE

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
        c.expert_weight_format, c.lockstep_ranks, c.expert_parallel,
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


def fold(state: SweepState, ctx: SweepContext, c: Candidates, ev: Evaluated, first_layout=0) -> SweepState:
    """Fold evaluated candidates into the state, whose layout table holds the layouts from
    `first_layout` on (a window of the full table: see `device_chunk`)."""
    # Invalid candidates (padding) may decode to layouts outside the window; their score is -inf,
    # so clipping them onto an edge row changes nothing.
    window = state.layouts.score.shape[0]
    row = jnp.clip(layout_index(c.digits, ctx.sizes) - first_layout, 0, window - 1)
    layouts = merge_chunk(state.layouts, row, ev.score, c.digits)
    per_gpu = ev.estimate.output_tokens_per_s / ev.layout.num_gpus
    frontier_score = jnp.where(ev.score > NEG_INF, per_gpu, NEG_INF)
    frontier = merge_chunk(state.frontier, frontier_bin(ev.layout, ev.estimate.tpot_p99_s), frontier_score, c.digits)
    return SweepState(layouts, frontier)


def workload_sieves(ctx: SweepContext, hw, layout: Layout, w: WorkloadParams):
    """Stages 2-3 and the demand-independent part of stage 4 for DP-less configurations [Co] under
    one workload: (memory/capacity reason [Co], KV blocks [Co], Prepared)."""
    s2 = memory(ctx.model, hw, layout, max_context_tokens(w), ctx.gpu_memory_utilization, ctx.block_size_tokens)
    s3, b_max, bound, blocks = capacity(ctx.model, hw, layout, w, ctx.gpu_memory_utilization, ctx.block_size_tokens)
    later = jnp.where(s2 == Reason.ADMITTED, s3, s2)
    return later, blocks, prepare(ctx.model, hw, layout, w, ctx.gpu_memory_utilization, (b_max, bound))


def scenario_rows(prepared: Prepared) -> Prepared:
    """Per-scenario Prepared ([S, Co] fields, [S, K, Co] knot tables) as one: row s x Co + c."""
    flat = lambda x: jnp.reshape(x, (-1,))  # noqa: E731
    table = lambda x: jnp.reshape(jnp.moveaxis(x, 0, 1), (x.shape[1], -1))  # noqa: E731
    return Prepared(
        flat(prepared.b_max), flat(prepared.bound), flat(prepared.full_slot_s), flat(prepared.admission),
        table(prepared.knot_b), table(prepared.knot_slot_s), table(prepared.knot_rate),
        jnp.arange(prepared.b_max.size, dtype=jnp.int32),
    )


def reason_counts(s1, later, valid, within, num_dp: int):
    """Reason histogram [NUM_REASONS] of a chunk's [Co x DP] candidates before the rest of stage 4,
    from per-configuration values [Co], and the survivors per configuration [Co].

    within: DP values whose replicas fit the GPU budget (a prefix). Survivors count as PADDING here;
    stage 4 counts them with their own reason."""
    rejected_per_configuration = before_budget(s1)
    rest = jnp.where(s1 == Reason.ADMITTED, later, s1)  # the reason of the candidates within the budget
    open_row = valid & ~rejected_per_configuration
    survive = open_row & (rest == Reason.ADMITTED)
    add = lambda h, reason, n: h.at[reason].add(n)  # noqa: E731
    counts = jnp.zeros(NUM_REASONS, jnp.int32)
    counts = add(counts, jnp.int32(Reason.PADDING), jnp.sum(jnp.where(~valid, num_dp, 0)) + jnp.sum(jnp.where(survive, within, 0)))
    counts = add(counts, s1, jnp.where(valid & rejected_per_configuration, num_dp, 0))
    counts = add(counts, jnp.int32(Reason.GPU_BUDGET), jnp.sum(jnp.where(open_row, num_dp - within, 0)))
    counts = add(counts, rest, jnp.where(open_row & ~survive, within, 0))
    return counts, jnp.where(survive, within, 0).astype(jnp.int32)


def survivor_pages(carry, ctx: SweepContext, scenarios: WorkloadParams | None, base_digits, offsets, page_size: int, fold_page):
    """The funnel's kernel for one device's share of a chunk, factorised over DP (the innermost axis),
    under one workload (`scenarios` None: ctx.workload) or each of S workloads (fields [S]).

    The chunk is Co DP-less configurations x |DP|. Stage 1 runs once per configuration [Co]; stages
    2-3 and the demand-independent part of stage 4 once per (scenario, configuration) [S x Co]; the
    GPU-budget check on [Co, DP]; the rest of stage 4 only on the survivors, gathered into pages of
    `page_size` (a while loop runs as many pages as needed), each under its own scenario's workload.
    Every page goes to `fold_page(carry, picked, ev, scenario [P], digits [P, A]) -> carry`.
    Offsets are contiguous and start at a multiple of |DP|.

    Returns (carry, reason histogram [NUM_REASONS] of the candidates x scenarios before stage 4's rest)."""
    num_dp = ctx.axis_values[DP_AXIS].shape[0]
    outer_offsets = offsets[::num_dp] // num_dp
    outer_digits, outer_valid = decode_digits(ctx.sizes[:DP_AXIS], base_digits[:DP_AXIS], outer_offsets)
    num_outer = outer_digits.shape[0]
    first_dp = jnp.zeros((num_outer, 1), jnp.int32)
    outer = candidates_from_digits(ctx.axis_values, jnp.concatenate([outer_digits, first_dp], axis=1), outer_valid)
    hw, layout = take(ctx.hardware, outer.gpu_index), layout_of(outer)
    # Workload-independent: stage 1 without the budget, once per configuration for every scenario.
    s1 = structure(ctx.model, hw, outer, jnp.inf, ctx.allow_multi_node)
    if scenarios is None:
        num_s = 1
        later, _, prepared = workload_sieves(ctx, hw, layout, ctx.workload)
    else:
        num_s = scenarios.isl_tokens.shape[0]
        later, _, prepared = jax.vmap(lambda w: workload_sieves(ctx, hw, layout, w))(scenarios)  # [S, Co]
        later, prepared = later.reshape(-1), scenario_rows(prepared)  # row s x Co + c

    # DP values ascend (SearchSpace sorts them), and every reason but the GPU budget is per
    # configuration, so a (scenario, configuration) row's survivors are a prefix of its DP values:
    # count them per row, and find a page position's row by a search over the rows' running totals
    # (no [S x Co x DP] mask, cumsum or scatter). Rows run scenario-major, so survivors come in
    # (scenario, grid index) order.
    dp_values = ctx.axis_values[DP_AXIS]
    gpus_per_server = outer.tensor_parallel_size * outer.pipeline_parallel_size * outer.lockstep_ranks
    within = jnp.sum(gpus_per_server[:, None] * dp_values[None, :] <= ctx.gpu_budget, axis=1, dtype=jnp.int32)  # [Co]
    tile = lambda x: jnp.tile(x, num_s)  # noqa: E731
    counts, survivors_per_row = reason_counts(tile(s1), later, tile(outer_valid), tile(within), num_dp)
    row_end = jnp.cumsum(survivors_per_row)
    survivors = row_end[-1]

    def body(loop):
        page, carry, counts = loop
        position = page * page_size + jnp.arange(page_size, dtype=jnp.int32)
        row = jnp.minimum(jnp.searchsorted(row_end, position, side="right"), row_end.shape[0] - 1).astype(jnp.int32)
        scenario, which = row // num_outer, row % num_outer
        dp_digit = position - (row_end[row] - survivors_per_row[row])
        digits = jnp.concatenate([outer_digits[which], dp_digit[:, None]], axis=1)
        picked = candidates_from_digits(ctx.axis_values, digits, position < survivors)
        page_ctx = ctx if scenarios is None else ctx._replace(workload=jax.tree.map(lambda f: f[scenario], scenarios))
        ev = evaluate_survivors(page_ctx, picked, prepared.take(row))
        return page + 1, fold_page(carry, picked, ev, scenario, digits), counts + histogram(ev.reason)

    _, carry, counts = jax.lax.while_loop(lambda loop: loop[0] * page_size < survivors, body, (jnp.int32(0), carry, counts))
    return carry, counts


def device_chunk(state: SweepState, ctx: SweepContext, base_digits: jnp.ndarray, offsets: jnp.ndarray, page_size: int, window_rows: int):
    """One device's share of a chunk under the sweep's workload: (state, reason histogram).

    The share is a contiguous run of candidates starting at a multiple of |DP|, so its layouts are
    `window_rows` (`Grid.layout_window`) consecutive rows of the table from its first candidate's
    layout on: only those rows are sliced out, folded page by page, and written back, so the work
    per chunk does not grow with the table (whose size grows with the DP range)."""
    num_layouts = state.layouts.score.shape[0]
    first_digits, _ = decode_digits(ctx.sizes, base_digits, offsets[:1])
    # Near the table's end the window is shifted back so that it stays inside; it still covers the share.
    first = jnp.minimum(layout_index(first_digits, ctx.sizes)[0], num_layouts - window_rows)
    window = jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, first, window_rows), state.layouts)
    carry = SweepState(window, state.frontier)
    carry, counts = survivor_pages(carry, ctx, None, base_digits, offsets, page_size, lambda carry, picked, ev, _, __: fold(carry, ctx, picked, ev, first))
    layouts = jax.tree.map(lambda full, part: jax.lax.dynamic_update_slice_in_dim(full, part, first, 0), state.layouts, carry.layouts)
    return SweepState(layouts, carry.frontier), counts


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


def _sweep_chunk(state: SweepState, ctx: SweepContext, base_digits: jnp.ndarray, offsets: jnp.ndarray, *, model: ModelShape, mesh, page_size: int, window_rows: int):
    """Per-device (state, reason histogram) after the chunk at base + offsets. `state` is donated.

    window_rows: the layout-table rows one device's share of the chunk can touch (`Grid.layout_window`).

    model: a static `ModelShape`, folded into the kernel (`ctx.model` is then ignored), or None to read
    the traced `ctx.model` (`chunk_model` chooses).
    `state` and the result carry a leading device axis [D, ...]; offsets [D * chunk/D] are split
    contiguously across devices. Tables are merged across devices on the host (`merge_tables`)."""
    spec = PartitionSpec("candidates")
    if model is not None:
        ctx = ctx._replace(model=None)

    def per_device(state, ctx, base_digits, offsets):
        if model is not None:
            ctx = ctx._replace(model=model)
        local = jax.tree.map(lambda x: x[0], state)
        new_state, counts = device_chunk(local, ctx, base_digits, offsets, page_size, window_rows)
        return jax.tree.map(lambda x: x[None], new_state), counts[None]

    return jax.shard_map(per_device, mesh=mesh, in_specs=(spec, PartitionSpec(), PartitionSpec(), spec), out_specs=(spec, spec), check_vma=False)(
        state, ctx, base_digits, offsets
    )


_CHUNK_STATIC = dict(static_argnames=("model", "mesh", "page_size", "window_rows"), donate_argnames=("state",))
sweep_chunk = program_cache.jit(_sweep_chunk, **_CHUNK_STATIC)
sweep_chunk_lean = program_cache.jit(_sweep_chunk, options=LEAN_COMPILE, **_CHUNK_STATIC)  # same results, see xla_options

# Up to this many candidates the chunk kernel compiles with `LEAN_COMPILE`: about 4 s less compilation
# on XLA:CPU for streaming about 8% slower, which breaks even near 6e8 candidates (bench/README.md).
LEAN_MAX_CANDIDATES = 500_000_000


def chunk_kernel(grid_size: int):
    """The jitted `sweep_chunk` for a grid of `grid_size` candidates (see LEAN_MAX_CANDIDATES)."""
    return sweep_chunk_lean if grid_size <= LEAN_MAX_CANDIDATES else sweep_chunk


# Up to this many candidates the chunk kernel takes the model as traced arrays, so one compiled program
# serves every model of a space (a second model's sweep loads it from the cache instead of compiling
# for ~5 s); above it the model is folded in as constants, which streams 9-13% faster (bench/README.md).
TRACED_MODEL_MAX_CANDIDATES = 10_000_000


def chunk_model(ctx: SweepContext, grid_size: int) -> tuple[SweepContext, ModelShape | None]:
    """(the context to pass the chunk kernel, its static `model`) for a grid of `grid_size`
    candidates: the model traced in the context, or static (see TRACED_MODEL_MAX_CANDIDATES)."""
    if grid_size <= TRACED_MODEL_MAX_CANDIDATES:
        return ctx._replace(model=traced(ctx.model)), None
    return ctx._replace(model=None), ctx.model


# The programs that price explicit rows read each axis's value by a gather, so an axis's length costs
# them nothing: every axis is padded to at least this many entries (the bundled spaces' longest axis,
# `huge`'s DP, has 1,024), so that spaces with axes of other lengths share their programs.
ROWS_AXIS_ENTRIES = 1024


def rows_context(ctx: SweepContext) -> SweepContext:
    """`ctx` as the programs that price explicit rows (digits) take it: the model traced and every
    axis padded to ROWS_AXIS_ENTRIES (these programs do not factorise over DP and no digit reaches
    the padding), so one program serves every model and every space."""
    axis_values = tuple(jnp.asarray(padded_axis(v, ROWS_AXIS_ENTRIES)) for v in ctx.axis_values)
    return ctx._replace(axis_values=axis_values, model=traced(ctx.model))


def per_row_workload(workload: WorkloadParams, num_rows: int) -> WorkloadParams:
    """Every workload field as [num_rows] float32 (a scalar repeated), so that the report rows of one
    workload and a winner map's rows, each under its own scenario, share one program."""
    return WorkloadParams(*(np.broadcast_to(np.asarray(field, np.float32), (num_rows,)) for field in workload))


def _report_context(ctx: SweepContext, num_rows: int) -> SweepContext:
    """`rows_context` with `per_row_workload`: the context the report rows' program takes."""
    return rows_context(ctx._replace(workload=per_row_workload(ctx.workload, num_rows)))


def _evaluate_rows(ctx: SweepContext, digits: jnp.ndarray) -> Evaluated:
    c = candidates_from_digits(ctx.axis_values, digits, jnp.ones(digits.shape[0], bool))
    return evaluate(ctx, c)


_evaluate_digits = program_cache.jit(_evaluate_rows, options=ONE_SHOT_COMPILE)  # compiled beside the chunk kernel, run once: see xla_options
# The same rows at XLA's defaults (-O2): what the shortlist falls back to where the one-shot program
# and the chunk kernel disagree on its scores (`sweep.checked_rows`); compiled only then.
_evaluate_digits_default = program_cache.jit(_evaluate_rows)


def evaluate_digits(ctx: SweepContext, digits: jnp.ndarray, *, default_compile: bool = False) -> Evaluated:
    """Stages 1-4 for explicit candidates given by their digits [K, A] (for reports; `rows_context`:
    one program per K serves every model and space). default_compile: the program compiled at XLA's
    defaults instead of the one-shot options."""
    ctx = _report_context(ctx, digits.shape[0])
    if default_compile:
        return _evaluate_digits_default(ctx, digits)
    compile_ahead.wait("evaluate_digits")
    return _evaluate_digits(ctx, digits)


def evaluate_digits_ahead(ctx: SweepContext, num_rows: int, num_axes: int) -> None:
    """Start compiling `evaluate_digits` for [num_rows, num_axes] digits in the background (the
    reports' rows come after the chunks, and their program is as large as the chunk kernel)."""
    ctx = _report_context(ctx, num_rows)
    compile_ahead.ahead("evaluate_digits", _evaluate_digits, ctx, jax.ShapeDtypeStruct((num_rows, num_axes), jnp.int32))
