"""The winner map's kernel: the funnel's kernel (`funnel.chunk.survivor_pages`) under a stacked batch
of scenario workloads, folding each scenario's survivors into its own per-layout best table."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.funnel.budget import effective_chunk
from jaxplan.funnel.chunk import SweepContext, survivor_pages
from jaxplan.funnel.sweep import drive_chunks
from jaxplan.funnel.tables import NEG_INF, BestTable, merge_chunk
from jaxplan.grid import AXES, LAYOUT_AXES, Grid, layout_index
from jaxplan.physics.traffic import WorkloadParams

KNOB_AXES = tuple(a for a in range(len(AXES)) if a not in LAYOUT_AXES)  # seqs, budget, weight and KV dtypes
DEFAULT_CHUNK = 1 << 15  # candidates per chunk; x scenarios evaluated per kernel call
DEFAULT_PAGE = 1 << 14  # stage-4 survivors (of all scenarios) per page


def pack_knobs(digits: jnp.ndarray, sizes: jnp.ndarray) -> jnp.ndarray:
    """[C, 1] int32: the knob digits (seqs, budget, weight dtype, KV dtype) as one mixed-radix number.

    Within one layout, grid-index order is lexicographic in exactly these digits, so comparing the
    packed numbers breaks ties like the sweep (lowest grid index)."""
    packed = jnp.zeros(digits.shape[:-1], jnp.int32)
    for axis in KNOB_AXES:
        packed = packed * sizes[axis] + digits[..., axis]
    return packed[..., None]


def unpack_knobs(layout_ids: np.ndarray, packed: np.ndarray, sizes: tuple[int, ...]) -> np.ndarray:
    """Full digits [K, A] from layout indices [K] and packed knobs [K]."""
    digits = np.zeros((len(layout_ids), len(AXES)), np.int32)
    layout_digits = np.unravel_index(layout_ids, [sizes[a] for a in LAYOUT_AXES])
    knob_digits = np.unravel_index(packed, [sizes[a] for a in KNOB_AXES])
    for axis, d in zip(LAYOUT_AXES, layout_digits):
        digits[:, axis] = d
    for axis, d in zip(KNOB_AXES, knob_digits):
        digits[:, axis] = d
    return digits


@functools.partial(jax.jit, static_argnames=("model", "page_size"))
def map_chunk(table: BestTable, ctx: SweepContext, scenarios: WorkloadParams, base_digits, offsets, *, model, page_size: int):
    """(table [S x L], feasible count [S]) after folding the chunk at base + offsets into every scenario's table.

    The table is flat: segment s * L + layout. The sweep's kernel finds the survivors of stages 1-3 of
    *all* scenarios and runs stage 4 on full pages of them, each under its own scenario's workload."""
    ctx = ctx._replace(model=model)
    num_s = scenarios.isl_tokens.shape[0]
    num_layouts = table.score.shape[0] // num_s

    def fold_page(carry, picked, ev, scenario, digits):
        table, feasible = carry
        segment = scenario * num_layouts + layout_index(digits, ctx.sizes)
        table = merge_chunk(table, segment, ev.score, pack_knobs(digits, ctx.sizes))
        return table, feasible.at[scenario].add((ev.score > NEG_INF).astype(jnp.int32))

    init = (table, jnp.zeros(num_s, jnp.int32))
    (table, feasible), _ = survivor_pages(init, ctx, scenarios, base_digits, offsets, page_size, fold_page)
    return table, feasible


def stream_scenarios(grid: Grid, ctx: SweepContext, scenarios: WorkloadParams, *, chunk_size: int = DEFAULT_CHUNK, page_size: int = DEFAULT_PAGE, progress: Callable[[int, int], None] | None = None):
    """(per-layout tables BestTable [S, L] (digits = packed knobs [S, L, 1]), feasible [S] int64, compile_s, run_s, chunk)."""
    num_scenarios = int(scenarios.isl_tokens.shape[0])
    chunk_size = effective_chunk(grid, chunk_size, 1)
    page_size = max(256, min(int(page_size), chunk_size * num_scenarios))
    offsets = jnp.arange(chunk_size, dtype=jnp.int32)
    cells = num_scenarios * grid.num_layouts
    table = BestTable(jnp.full((cells,), NEG_INF, jnp.float32), jnp.full((cells, 1), -1, jnp.int32))
    arrays = ctx._replace(model=None)

    def run(table, start):
        return map_chunk(table, arrays, scenarios, jnp.asarray(grid.digits_of(start)), offsets, model=ctx.model, page_size=page_size)

    table, feasible, compile_s, t0 = drive_chunks(run, table, range(0, grid.size, chunk_size), chunk_size, grid.size, progress)
    table = jax.device_get(table)
    table = BestTable(table.score.reshape(num_scenarios, -1), table.digits.reshape(num_scenarios, -1, 1))
    total = np.zeros(num_scenarios, np.int64)
    for counts in jax.device_get(feasible):
        total += counts
    return table, total, compile_s, time.perf_counter() - t0, chunk_size


def top_two(table: BestTable, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layout ids [S, 2] (-1: none), scores [S, 2], packed knobs [S, 2]): best two layouts per scenario,
    ties to the lower layout index (like the shortlist)."""
    scores = np.asarray(table.score)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :2]
    if order.shape[1] < 2:
        order = np.concatenate([order, np.zeros((order.shape[0], 2 - order.shape[1]), order.dtype)], axis=1)
    best = np.take_along_axis(scores, order, axis=1)
    if scores.shape[1] < 2:
        best[:, 1] = -np.inf
    packed = np.take_along_axis(np.asarray(table.digits)[..., 0], order, axis=1)
    ids = np.where(np.isfinite(best), order, -1)
    return ids, best, packed
