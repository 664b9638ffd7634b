"""`jaxplan report`: the sweep, its replay and sensitivities as one self-contained HTML file.

Also the figure-writing glue that `sweep --plot`, `simulate --plot` and `sensitivity --plot` share.
"""

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
    PriceOption,
    RateOption,
    Routing,
    RoutingOption,
    SpaceOption,
    TargetOption,
    WorkloadOption,
    app,
    check_writable,
    clean_errors,
    err,
    gib_bytes,
    out,
    progress_bar,
    run_sweep,
    stage7_deadline,
    sweep_options,
    WeightDtypesOption,
)
from jaxplan.errors import NothingSurvived

PlotOption = Annotated[Optional[Path], typer.Option("--plot", file_okay=False, help="Write the figures here as PNG and SVG (created if needed).")]


def _steps(progress, description: str, total: int):
    task = progress.add_task(description, total=total)

    def step(text: str) -> None:
        progress.update(task, description=text)
        progress.advance(task)

    return step


def write_plots(make, total: int, directory: Path) -> list[Path]:
    """Draw with `make(step)` -> {name: Figure} and write PNG + SVG under `directory`, with a progress bar."""
    from jaxplan.plots.figures import write_figures
    from jaxplan.plots.save import plot_dir

    plot_dir(directory)
    with progress_bar() as progress:
        figures = make(_steps(progress, "drawing", total))
        paths = write_figures(figures, directory, _steps(progress, "writing", len(figures)))
    out.print(f"wrote {len(figures)} figures (PNG + SVG) to {directory}")
    return paths


def plot_sweep(result, replayed, directory: Path, *, replay_seconds: float | None = None, seed: int = 0) -> list[Path]:
    """`sweep --plot DIR`: the funnel, the frontier, the splits at the winner's GPU count, and the top
    finalists' replay timelines (when stage 7 ran)."""
    from jaxplan.plots.figures import count_sweep, sweep_figures

    replay = (len(replayed), replayed[0]["replay_requests"], replay_seconds or 0.0) if replayed else None
    return write_plots(lambda step: sweep_figures(result, replayed, replay=replay, seed=seed, step=step), count_sweep(replayed), directory)


@app.command()
@clean_errors
def report(
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False, help="The HTML file to write (self-contained, opens offline).")] = Path("report.html"),
    model: ModelOption = "llama-3.1-70b",
    gpus: GpusOption = "h100_sxm,h200_sxm",
    workload: WorkloadOption = "coding",
    space: SpaceOption = "default",
    budget: BudgetOption = None,
    weight_dtypes: WeightDtypesOption = None,
    kv_cache_dtypes: KvDtypesOption = None,
    target_throughput: TargetOption = None,
    rate: RateOption = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Finalists to keep (one per GPU/TP/PP/DP layout).")] = 20,
    price: PriceOption = None,
    params: ParamsOption = None,
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
    from jaxplan.cli.sweep import sweep_report
    from jaxplan.funnel.replay_stage import replay_rows
    from jaxplan.plots.figures import count_sweep, sensitivity_figures, sweep_figures, write_figures
    from jaxplan.report.html import write_report
    from jaxplan.report.vllm_command import vllm_serve_command
    from jaxplan.sensitivity import for_rows

    check_writable(output, "-o")
    if plot:
        from jaxplan.plots.save import plot_dir

        plot_dir(plot)
    model_spec, gpu_specs, workload_spec, space_spec = sweep_options(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes, kv_cache_dtypes)
    started = time.perf_counter()
    result = run_sweep(model_spec, gpu_specs, workload_spec, space_spec, top, params=params, max_seconds=max_seconds, max_memory_gib=max_memory_gib)
    if not result.shortlist:
        raise NothingSurvived(result.empty_explanation())
    replayed, replay_info = None, None
    if replay:
        t0 = time.perf_counter()
        with err.status(f"stage 7: replaying {len(result.shortlist)} finalists x {replay_requests:,} requests"):
            deadline = stage7_deadline(max_seconds, started, len(result.shortlist), replay_requests)
            replayed = replay_rows(result, result.shortlist, num_requests=replay_requests, seed=seed, routing=routing.value, progress=deadline)
        replay_info = (len(replayed), replayed[0]["replay_requests"], time.perf_counter() - t0)
    final = replayed or result.shortlist
    with progress_bar() as progress:
        step = _steps(progress, "drawing", count_sweep(replayed, timelines) + 2 + (map_axes is not None))
        figures = sweep_figures(result, replayed, replay=replay_info, seed=seed, timelines=timelines, step=step)
        step("sensitivities of the winner")
        sens = for_rows(result, final)  # all finalists: the same shapes as `jaxplan sensitivity --top K`
        figures.update(sensitivity_figures(sens, final))
        if map_axes is not None:
            from jaxplan.cli.sensitivity import winner_map_plot
            from jaxplan.winner_map import parse_axes, winner_map

            step("the winner map")
            wmap = winner_map(
                model_spec, gpu_specs, workload_spec, space_spec, parse_axes(map_axes),
                max_seconds=max_seconds, started=started, max_memory_bytes=gib_bytes(max_memory_gib), params_path=str(params) if params else None,
            )
            figures["winner_map"] = winner_map_plot(wmap)
        step("writing the HTML report")
        summary = sweep_report(result, space_spec.gpu_memory_utilization, vllm_serve_command, replayed)
        write_report(output, result, summary, figures, sens, space_name=space)
    from jaxplan.cli.sweep import print_winner

    print_winner(summary["winner"])
    out.print(f"wrote {output}")
    if plot:
        write_figures(figures, plot)
        out.print(f"wrote {len(figures)} figures (PNG + SVG) to {plot}")

