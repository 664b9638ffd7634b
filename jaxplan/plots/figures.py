"""Which figures each command draws, from its results: {file stem: Figure}, plus writing them out.

`step(text)` is called before each costly piece (for a progress bar); `count_*` say how many steps.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from jaxplan.plots.labels import gpu_label, layout_label

DEFAULT_TIMELINES = 3  # finalists whose replay timeline is drawn (each is replayed again)
_noop = lambda text: None  # noqa: E731


def count_sweep(replayed, timelines: int = DEFAULT_TIMELINES) -> int:
    return 3 + (1 + min(timelines, len(replayed)) if replayed and timelines else 0)


def sweep_figures(result, replayed: list[dict] | None = None, *, replay: tuple[int, int, float] | None = None, seed: int = 0,
                  timelines: int = DEFAULT_TIMELINES, num_gpus: int | None = None, step: Callable[[str], None] = _noop) -> dict:
    """funnel, frontier, splits (at `num_gpus`, default the winner's) and, when the replay ran,
    timeline_1..N of the top N finalists. replay: (finalists, requests each, seconds) of stage 7."""
    from jaxplan.plots.frontier import frontier_figure
    from jaxplan.plots.funnel import funnel_figure
    from jaxplan.plots.splits import best_per_split, splits_figure

    figures = {}
    final = replayed or result.shortlist
    step("funnel figure")
    figures["funnel"] = funnel_figure(result, replay)
    if result.frontier or final:
        step("frontier figure")
        figures["frontier"] = frontier_figure(result.frontier, final)
    if final:
        step("best of each TP x PP x DP split")
        winner = final[0]
        rows = best_per_split(result, num_gpus or winner["num_gpus"])
        figures["splits"] = splits_figure(rows, result.workload, highlight=winner)
    if replayed and timelines:
        figures.update(timeline_figures(result, replayed[:timelines], num_requests=replay[1] if replay else None, seed=seed, step=step))
    return figures


def timeline_figures(result, rows: list[dict], *, num_requests: int | None, seed: int, step: Callable[[str], None] = _noop) -> dict:
    """timeline_1..N for sweep rows (best first), replayed again to get their traces."""
    from jaxplan.plots.timeline import timeline_figure
    from jaxplan.plots.traces import sweep_traces
    from jaxplan.replay.timeline import timeline

    step(f"replaying {len(rows)} finalists for their timelines")
    trace, block_size = sweep_traces(result, rows, num_requests=num_requests, seed=seed)
    tl = timeline(trace, block_size=block_size)
    offered = result.workload.offered_output_tokens_per_s
    figures = {}
    for i, row in enumerate(rows):
        step(f"timeline of finalist {i + 1}")
        slots = row["max_num_seqs"] * row["data_parallel_size"]
        figures[f"timeline_{i + 1}"] = timeline_figure(tl, i, f"#{i + 1} {layout_label(row)}", max_running=slots, offered_tokens_per_s=offered)
    return figures


def simulate_figures(rows: list[dict], traced: list[tuple], step: Callable[[str], None] = _noop) -> dict:
    """timeline_<row> for each replayed CSV row: traced = [(row index, trace, block size, workload)]."""
    from jaxplan.plots.timeline import timeline_figure
    from jaxplan.replay.timeline import timeline

    figures = {}
    for i, trace, block_size, workload in traced:
        row = rows[i]
        step(f"timeline of row {i + 1}")
        dp = int(float(row.get("data_parallel_size") or 1))
        seqs = float(row.get("max_num_seqs") or 1024)
        label = f"row {i + 1}: {gpu_label(str(row['gpu']))} TP{row['tensor_parallel_size']}xPP{row.get('pipeline_parallel_size') or 1}xDP{dp}"
        figures[f"timeline_row{i + 1}"] = timeline_figure(timeline(trace, block_size=block_size), 0, label, max_running=seqs * dp,
                                                         offered_tokens_per_s=workload.offered_output_tokens_per_s)
    return figures


def sensitivity_figures(sens, rows: list[dict], index: int = 0, step: Callable[[str], None] = _noop) -> dict:
    """tornado: the elasticities of finalist `index` (default the winner)."""
    from jaxplan.plots.sensitivity import tornado_figure

    step("tornado chart of the elasticities")
    return {"tornado": tornado_figure(sens, index, f"#{index + 1} {layout_label(rows[index])}")}


def plan_figures(plan, *, timelines: int = DEFAULT_TIMELINES, step: Callable[[str], None] = _noop) -> dict:
    """`sweep_figures` of a live `jaxplan.plan.Plan` (one read from JSON has no sweep to draw from)."""
    from jaxplan.errors import PlanError

    if plan.sweep is None:
        raise PlanError("this plan was read from JSON: its figures need the live sweep; run jaxplan.sweep (or jaxplan sweep --plot)")
    replayed = [f.to_row() for f in plan.finalists] if plan.replayed else None
    replay = (len(replayed), plan.finalists[0].replay.requests, plan.replay_s or 0.0) if replayed else None
    return sweep_figures(plan.sweep, replayed, replay=replay, seed=plan.seed, timelines=timelines, step=step)


def winner_map_figures(wmap) -> dict:
    """winner_map: the heat map of a WinnerMap's plane at the current workload."""
    from jaxplan.plots.sensitivity import winner_map_figure

    plane = wmap.plane()
    title = f"Which layout wins where ({wmap.workload.name})" + (f", {plane.z_name} = {plane.z_value:g}" if plane.z_name else "")
    figure = winner_map_figure(
        plane.x_label, plane.x_values, plane.y_label if plane.y_name else "", plane.y_values, plane.winner_labels, plane.margin,
        current=plane.current, title=title,
    )
    return {"winner_map": figure}


def write_figures(figures: dict, directory: Path | str, step: Callable[[str], None] = _noop) -> list[Path]:
    """PNG and SVG of every figure under `directory`; returns the paths written."""
    from jaxplan.plots.save import plot_dir, save

    directory = plot_dir(directory)
    paths = []
    for name, fig in figures.items():
        step(f"writing {name}.png/.svg")
        paths += save(fig, directory, name)
    return paths
