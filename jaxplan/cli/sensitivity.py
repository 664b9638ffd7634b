"""`jaxplan sensitivity`: elasticities of the finalists' metrics to the workload."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.cli.common import (
    check_writable,
    BudgetOption,
    KvDtypesOption,
    GpusOption,
    MaxMemoryGibOption,
    ModelOption,
    ParamsOption,
    PrefixCachingOption,
    PriceOption,
    RateOption,
    SpaceOption,
    TargetOption,
    VllmVersionOption,
    WorkloadOption,
    app,
    clean_errors,
    err,
    json_text,
    load_cli_inputs,
    out,
    plan_with_progress,
    write_plots,
    WeightDtypesOption,
    LayoutKindsOption,
)
from jaxplan.errors import NothingSurvived


@app.command()
@clean_errors
def sensitivity(
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
    top: Annotated[int, typer.Option(min=1, max=200, help="Finalists to analyse.")] = 10,
    price: PriceOption = None,
    prefix_caching: PrefixCachingOption = None,
    params: ParamsOption = None,
    vllm_version: VllmVersionOption = None,
    map_axes: Annotated[Optional[str], typer.Option("--winner-map", help="Instead: map the winning layout over workload scenarios, AXIS=LO:HI:N or AXIS=V1,V2,... for 1-3 axes of isl, osl, rate, hit, concurrency (e.g. isl=2000:32000:5,rate=1:16:5).")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", dir_okay=False, help="Write the sensitivities here.")] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", file_okay=False, help="Write figures here (PNG + SVG): the winner's elasticities as a tornado chart.")] = None,
    max_seconds: Annotated[Optional[float], typer.Option(min=0.001, help="Refuse (or stop) a sweep or winner map estimated to take longer (default: no limit).")] = None,
    max_memory_gib: MaxMemoryGibOption = None,
) -> None:
    """How fragile is the answer? Elasticities (d log metric / d log parameter) of each finalist's
    throughput, TTFT, TPOT and cost to ISL, OSL, arrival rate / concurrency and prefix hit rate."""
    from rich.table import Table

    from jaxplan.api import sensitivity as sensitivities
    from jaxplan.plots.labels import split_label

    check_writable(json_path, "--json")
    params_path = str(params) if params else None
    inputs = load_cli_inputs(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes, kv_cache_dtypes, layout_kinds,
                             prefix_caching)
    if plot:
        from jaxplan.plots.save import plot_dir

        plot_dir(plot)  # a bad --plot fails now, not after the sweep
    if map_axes is not None:
        wmap = print_winner_map(inputs.model, inputs.gpus, inputs.workload, inputs.space, map_axes, json_path, max_seconds, max_memory_gib, params_path)
        if plot:
            from jaxplan.plots.figures import winner_map_figures

            write_plots(lambda step: winner_map_figures(wmap), 1, plot)
        return
    plan = plan_with_progress(inputs, top=top, params=params_path, replay=False, max_seconds=max_seconds, max_memory_gib=max_memory_gib)
    if not plan.winner:
        raise NothingSurvived(plan.empty_explanation)
    rows = [f.to_row() for f in plan.finalists]
    with err.status(f"sensitivities of {len(rows)} finalists (forward-mode AD)"):
        sens = sensitivities(plan)
    short = {"isl_tokens": "ISL", "osl_tokens": "OSL", "request_rate_per_s": "rate", "prefix_hit_rate": "hit +10pt", "concurrency": "conc"}
    for m, metric in enumerate(sens.metrics):
        table = Table(title=f"Elasticity of {metric} (d log {metric} / d log parameter; 0.5 = +1% parameter -> +0.5%)")
        table.add_column("#", justify="right")
        table.add_column("finalist")
        table.add_column(f"{metric}", justify="right")
        for p in sens.parameters:
            table.add_column(short[p], justify="right")
        for i, row in enumerate(rows):
            cells = [f"{sens.elasticity[i, m, k]:+.2f}" for k in range(len(sens.parameters))]
            table.add_row(str(i + 1), f"{row['gpu']} {split_label(row)}", f"{sens.values[i, m]:.4g}", *cells)
        out.print(table)
    if json_path:
        payload = {
            "parameters": list(sens.parameters), "metrics": list(sens.metrics),
            "finalists": [{k: v for k, v in r.items() if k != "digits"} for r in rows],
            "values": sens.values.tolist(), "derivative": sens.derivative.tolist(), "elasticity": sens.elasticity.tolist(),
        }
        json_path.write_text(json_text(payload))
        out.print(f"wrote {json_path}")
    if plot:
        from jaxplan.plots.figures import sensitivity_figures

        write_plots(lambda step: sensitivity_figures(sens, rows, step=step), 1, plot)


def print_winner_map(model_spec, gpu_specs, workload_spec, space_spec, map_axes: str, json_path, max_seconds: float | None = None, max_memory_gib: float | None = None,
                     params_path: str | None = None):
    """`--winner-map`: stages 1-4 for every scenario in one pass; the map, its boundaries, and --json.
    max_seconds / max_memory_gib: stop the map once its measured pace projects past the first; refuse
    one whose table needs more than the second."""
    from jaxplan.cli.common import gib_bytes, progress_bar
    from jaxplan.winner_map import map_tables, parse_axes, summary_lines, winner_map

    axes = parse_axes(map_axes)
    out.print(f"[bold]{model_spec.describe()}[/]", highlight=False)
    out.print(workload_spec.describe(), highlight=False)
    with progress_bar() as progress:
        task = progress.add_task("mapping", total=space_spec.size(len(gpu_specs)))
        wmap = winner_map(
            model_spec, gpu_specs, workload_spec, space_spec, axes, progress=lambda done, total: progress.update(task, completed=done),
            max_seconds=max_seconds, max_memory_bytes=gib_bytes(max_memory_gib), params_path=params_path,
        )
    for table in map_tables(wmap):
        out.print(table)
    for line in summary_lines(wmap):
        out.print(line, highlight=False, soft_wrap=True)
    if json_path:
        json_path.write_text(json_text(wmap.to_json()))
        out.print(f"wrote {json_path}")
    return wmap
