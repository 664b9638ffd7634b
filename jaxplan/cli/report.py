"""`jaxplan report`: the sweep, its replay and sensitivities as one self-contained HTML file, or
(`--from sweep.json`) a saved sweep rendered without recomputing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.cli.common import (
    BudgetOption,
    KvDtypesOption,
    GpusOption,
    MaxMemoryGibOption,
    ModelOption,
    ParamsOption,
    PrefixCachingOption,
    PriceOption,
    RateOption,
    Routing,
    RoutingOption,
    SpaceOption,
    TargetOption,
    VllmVersionOption,
    WorkloadOption,
    app,
    check_writable,
    clean_errors,
    gib_bytes,
    load_cli_inputs,
    out,
    plan_with_progress,
    progress_bar,
    progress_steps,
    WeightDtypesOption,
    LayoutKindsOption,
)
from jaxplan.cli.sweep import print_winner
from jaxplan.errors import NothingSurvived, PlanError

PlotOption = Annotated[Optional[Path], typer.Option("--plot", file_okay=False, help="Write the figures here as PNG and SVG (created if needed).")]
FROM_JSON_NOTE = "rendered from a saved sweep (--from): figures, replay timelines and sensitivities need the live sweep; run jaxplan report without --from for them"


@app.command()
@clean_errors
def report(
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False, help="The HTML file to write (self-contained, opens offline).")] = Path("report.html"),
    from_json: Annotated[Optional[Path], typer.Option("--from", exists=True, dir_okay=False, help="Render this saved `jaxplan sweep --json` file instead of sweeping (no figures or sensitivities).")] = None,
    model: ModelOption = "llama-3.1-70b",
    gpus: GpusOption = "h100_sxm,h200_sxm",
    workload: WorkloadOption = "coding",
    space: SpaceOption = "default",
    budget: BudgetOption = None,
    weight_dtypes: WeightDtypesOption = None,
    kv_cache_dtypes: KvDtypesOption = None,
    layout_kinds: LayoutKindsOption = None,
    target_throughput: TargetOption = None,
    rate: RateOption = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Finalists to keep (one per GPU/TP/PP/DP layout).")] = 20,
    price: PriceOption = None,
    prefix_caching: PrefixCachingOption = None,
    params: ParamsOption = None,
    vllm_version: VllmVersionOption = None,
    replay: Annotated[bool, typer.Option(help="Stage 7: replay the finalists step by step, re-rank them, and draw their timelines.")] = True,
    replay_requests: Annotated[int, typer.Option(min=10, max=1_000_000, help="Requests per replay (sampled from the workload, seeded).")] = 2000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the replay's request sample.")] = 0,
    timelines: Annotated[int, typer.Option(min=0, max=20, help="Finalists whose replay timeline is drawn (each is replayed once more).")] = 3,
    plot: PlotOption = None,
    routing: RoutingOption = Routing.ROUND_ROBIN,
    map_axes: Annotated[Optional[str], typer.Option("--winner-map", help="Also map the winner over workload scenarios, e.g. isl=2000:32000:5,rate=1:16:5 (see `jaxplan sensitivity --winner-map`).")] = None,
    max_seconds: Annotated[Optional[float], typer.Option(min=0.001, help="Refuse (or stop) the sweep, its replay and the winner map when estimated to take longer (default: no limit; figures and sensitivities come on top).")] = None,
    max_memory_gib: MaxMemoryGibOption = None,
) -> None:
    """One self-contained HTML report of a sweep: inputs, winner (`vllm serve`), funnel, frontier,
    the same GPUs arranged differently, replay timelines and sensitivities."""
    from jaxplan.report.html import write_report

    check_writable(output, "-o")
    if from_json is not None:
        from jaxplan.plan import Plan

        plan = Plan.from_json(from_json)
        write_report(output, plan, {}, None, note=FROM_JSON_NOTE)
        if plan.winner:
            print_winner(plan.winner, plan.verdict)
        out.print(f"wrote {output}")
        return
    if plot:
        from jaxplan.plots.save import plot_dir

        plot_dir(plot)
    inputs = load_cli_inputs(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes, kv_cache_dtypes, layout_kinds,
                             prefix_caching)
    started = time.perf_counter()
    plan = plan_with_progress(
        inputs, top=top, params=params, replay=replay, replay_requests=replay_requests, seed=seed, routing=routing.value,
        max_seconds=max_seconds, max_memory_gib=max_memory_gib,
    )
    if not plan.winner:
        raise NothingSurvived(plan.empty_explanation)
    figures, sens = draw_report(plan, timelines, map_axes, started=started, max_seconds=max_seconds, max_memory_gib=max_memory_gib, params=params)
    write_report(output, plan, figures, sens)
    print_winner(plan.winner, plan.verdict)
    out.print(f"wrote {output}")
    if plot:
        from jaxplan.plots.figures import write_figures

        write_figures(figures, plot)
        out.print(f"wrote {len(figures)} figures (PNG + SVG) to {plot}")


def draw_report(plan, timelines: int, map_axes: str | None, *, started: float, max_seconds, max_memory_gib, params):
    """The report's figures and the finalists' sensitivities (winner first), under a progress bar."""
    from jaxplan.api import sensitivity
    from jaxplan.plots.figures import count_sweep, plan_figures, sensitivity_figures, winner_map_figures

    rows = [f.to_row() for f in plan.finalists]
    with progress_bar() as progress:
        step = progress_steps(progress, "drawing", count_sweep(rows if plan.replayed else None, timelines) + 2 + (map_axes is not None))
        figures = plan_figures(plan, timelines=timelines, step=step)
        step("sensitivities of the winner")
        sens = sensitivity(plan)  # all finalists: the same shapes as `jaxplan sensitivity --top K`
        figures.update(sensitivity_figures(sens, rows))
        if map_axes is not None:
            from jaxplan.winner_map import parse_axes, winner_map

            step("the winner map")
            wmap = winner_map(
                plan.model, plan.gpus, plan.workload, plan.space, parse_axes(map_axes),
                max_seconds=max_seconds, started=started, max_memory_bytes=gib_bytes(max_memory_gib), params_path=str(params) if params else None,
            )
            figures.update(winner_map_figures(wmap))
        step("writing the HTML report")
    return figures, sens
