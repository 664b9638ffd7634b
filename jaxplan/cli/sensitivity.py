"""`jaxplan sensitivity`: elasticities of the finalists' metrics to the workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.cli.common import (
    BudgetOption,
    GpusOption,
    ModelOption,
    PriceOption,
    RateOption,
    SpaceOption,
    TargetOption,
    WorkloadOption,
    app,
    clean_errors,
    json_default,
    out,
    run_sweep,
    sweep_options,
)
from jaxplan.errors import PlanError


@app.command()
@clean_errors
def sensitivity(
    model: ModelOption = "llama-3.1-70b",
    gpus: GpusOption = "h100_sxm,h200_sxm",
    workload: WorkloadOption = "coding",
    space: SpaceOption = "default",
    budget: BudgetOption = None,
    target_throughput: TargetOption = None,
    rate: RateOption = None,
    top: Annotated[int, typer.Option(min=1, max=200, help="Finalists to analyse.")] = 10,
    price: PriceOption = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", dir_okay=False, help="Write the sensitivities here.")] = None,
) -> None:
    """How fragile is the answer? Elasticities (d log metric / d log parameter) of each finalist's
    throughput, TTFT, TPOT and cost to ISL, OSL, arrival rate / concurrency and prefix hit rate."""
    from rich.table import Table

    from jaxplan.report.tables import layout_label
    from jaxplan.sensitivity import for_rows

    model_spec, gpu_specs, workload_spec, space_spec = sweep_options(model, gpus, workload, space, budget, target_throughput, rate, price)
    result = run_sweep(model_spec, gpu_specs, workload_spec, space_spec, top)
    if not result.shortlist:
        raise PlanError(result.empty_explanation())
    sens = for_rows(result, result.shortlist)
    short = {"isl_tokens": "ISL", "osl_tokens": "OSL", "request_rate_per_s": "rate", "prefix_hit_rate": "hit +10pt", "concurrency": "conc"}
    for m, metric in enumerate(sens.metrics):
        table = Table(title=f"Elasticity of {metric} (d log {metric} / d log parameter; 0.5 = +1% parameter -> +0.5%)")
        table.add_column("#", justify="right")
        table.add_column("finalist")
        table.add_column(f"{metric}", justify="right")
        for p in sens.parameters:
            table.add_column(short[p], justify="right")
        for i, row in enumerate(result.shortlist):
            cells = [f"{sens.elasticity[i, m, k]:+.2f}" for k in range(len(sens.parameters))]
            table.add_row(str(i + 1), f"{row['gpu']} {layout_label(row)}", f"{sens.values[i, m]:.4g}", *cells)
        out.print(table)
    if json_path:
        payload = {
            "parameters": list(sens.parameters), "metrics": list(sens.metrics),
            "finalists": [{k: v for k, v in r.items() if k != "digits"} for r in result.shortlist],
            "values": sens.values.tolist(), "derivative": sens.derivative.tolist(), "elasticity": sens.elasticity.tolist(),
        }
        json_path.write_text(json.dumps(payload, indent=2, default=json_default))
        out.print(f"wrote {json_path}")
