"""The winner map's driver: check the inputs, stream the grid once for every scenario, and evaluate
each scenario's winner and runner-up as sweep-style rows."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.errors import PlanError, bad_value
from jaxplan.funnel.chunk import SweepContext
from jaxplan.grid import Grid
from jaxplan.physics.traffic import WorkloadParams, max_context_tokens, workload_params
from jaxplan.specs.workload import Workload
from jaxplan.winner_map.axes import MAX_AXES, ScenarioAxis, parse_axes, scenario_grid, stacked_params
from jaxplan.winner_map.kernel import DEFAULT_CHUNK, DEFAULT_PAGE, stream_scenarios, top_two, unpack_knobs
from jaxplan.winner_map.result import WinnerMap

MAX_SCENARIOS = 4096
MAX_TABLE_BYTES = 1 << 30  # S x layouts x (score + packed knobs)


def rows_under(grid: Grid, ctx: SweepContext, digits: np.ndarray, params: WorkloadParams, kernel_scores: np.ndarray | None = None) -> list[dict]:
    """Sweep-style rows for candidates [K] each evaluated under its own scenario (params fields [K]);
    checked against the map kernel's `kernel_scores` [K] where given (`sweep.checked_rows`)."""
    from jaxplan.funnel.sweep import checked_rows, rows_for

    if len(digits) == 0:
        return []
    ctx = ctx._replace(workload=params)  # rows_for pads the scenarios with the rows
    if kernel_scores is None:
        return rows_for(grid, ctx, digits)
    return checked_rows(grid, ctx, digits, kernel_scores, what="winner map")


def winner_map(
    model,
    gpus,
    workload: Workload,
    space,
    axes: tuple[ScenarioAxis, ...] | str,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    page_size: int = DEFAULT_PAGE,
    params_path: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    max_seconds: float | None = None,
    started: float | None = None,
    max_memory_bytes: float | None = None,
) -> WinnerMap:
    """Stages 1-4 over the grid for every scenario of `axes` (plus the current workload).

    max_seconds: stop (one-line PlanError) once the measured pace projects the map past this many
    seconds from `started` (time.perf_counter(); default: now), like a sweep's --max-seconds.
    max_memory_bytes: refuse a map whose scenario x layout table would not fit (--max-memory-gib);
    MAX_TABLE_BYTES caps it in any case."""
    from jaxplan.deadline import Deadline
    from jaxplan.funnel.sweep import build_context, check_inputs, grid_size_check

    if isinstance(axes, str):
        axes = parse_axes(axes)
    check_inputs(model, workload)
    grid = Grid(tuple(gpus), space.for_model(model))
    grid_size_check(grid)
    workloads = scenario_grid(workload, axes)
    if len(workloads) - 1 > MAX_SCENARIOS:
        raise bad_value("--winner-map", f"{len(workloads) - 1} scenarios", f"at most {MAX_SCENARIOS}; use fewer values per axis")
    table_bytes = len(workloads) * grid.num_layouts * 8
    over_option = max_memory_bytes is not None and table_bytes > max_memory_bytes
    if table_bytes > MAX_TABLE_BYTES or over_option:
        limit = f"the memory limit of {max_memory_bytes / 2**30:,.2f} GiB (--max-memory-gib)" if over_option else f"its cap of {MAX_TABLE_BYTES / 2**30:g} GiB"
        raise PlanError(
            f"the winner map would keep {len(workloads):,} scenarios x {grid.num_layouts:,} layouts ({table_bytes / 2**30:.2f} GiB), above {limit}; "
            "use fewer scenarios or a narrower space (fewer GPU types, TP/PP or DP values)" + (", or raise --max-memory-gib" if over_option else "")
        )
    for w in workloads:
        longest = float(max_context_tokens(workload_params(w)))
        if longest > model.max_position_embeddings:
            raise PlanError(
                f"scenario isl={w.isl_mean_tokens:g}, osl={w.osl_mean_tokens:g}: p99 request length {longest:,.0f} tokens exceeds "
                f"{model.name}'s max_position_embeddings = {model.max_position_embeddings:,}; lower the map's isl/osl range"
            )
    if max_seconds is not None:
        progress = Deadline(
            max_seconds, progress, start=started, what=f"the winner map ({len(workloads) - 1} scenarios)",
            fix="use fewer scenarios, a narrower space or fewer --gpus",
        )
    ctx = build_context(grid, model, workload, params_path)
    params = stacked_params(workloads)
    table, feasible, compile_s, run_s, chunk = stream_scenarios(grid, ctx, params, chunk_size=chunk_size, page_size=page_size, progress=progress)
    ids, best, packed = top_two(table, grid)

    # Evaluate winners and runners-up under their own scenario, in one batched call.
    num_s = len(workloads)
    flat_ids, flat_packed = ids.reshape(-1), packed.reshape(-1)
    have = flat_ids >= 0
    digits = unpack_knobs(flat_ids[have], flat_packed[have], grid.sizes)
    scenario_of = np.repeat(np.arange(num_s), 2)[have]
    rows_flat = rows_under(grid, ctx, digits, jax.tree.map(lambda f: f[jnp.asarray(scenario_of)], params), best.reshape(-1)[have])
    rows: list[dict | None] = [None] * (2 * num_s)
    for slot, row in zip(np.flatnonzero(have), rows_flat):
        rows[slot] = row
    sizes = [len(a.values) for a in axes] + [1] * (MAX_AXES - len(axes))
    nz, ny, nx = sizes[2], sizes[1], sizes[0]
    cells = num_s - 1

    def nest(values):
        return [[values[(iz * ny + iy) * nx: (iz * ny + iy + 1) * nx] for iy in range(ny)] for iz in range(nz)]

    return WinnerMap(
        axes=axes, workload=workload,
        winner=nest(rows[0: 2 * cells: 2]), runner_up=nest(rows[1: 2 * cells: 2]),
        objective=best[:cells, 0].reshape(nz, ny, nx), runner_up_objective=best[:cells, 1].reshape(nz, ny, nx),
        feasible=feasible[:cells].reshape(nz, ny, nx),
        current_winner=rows[2 * cells], current_runner_up=rows[2 * cells + 1],
        current_objective=float(best[cells, 0]), current_runner_up_objective=float(best[cells, 1]),
        current_feasible=int(feasible[cells]),
        num_candidates=grid.size, compile_s=compile_s, run_s=run_s, chunk_size=chunk,
    )
