"""The `jaxplan` command line (typer). Bad input: one line on stderr, exit code 1, no traceback."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from jaxplan.errors import PlanError, bad_value

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Plan LLM serving deployments on a CPU: how many GPUs, arranged how, for what traffic.")
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


# Options shared by several commands (one definition each).
ModelOption = Annotated[str, typer.Option(help="Bundled name, Hugging Face id (Qwen/Qwen3-32B) or a config.json path.")]
GpusOption = Annotated[str, typer.Option(help="Comma-separated GPU types: h100_sxm, h200_sxm, a100_sxm, b200_sxm, l40s, mi300x.")]
WorkloadOption = Annotated[str, typer.Option(help="Bundled workload (coding, chat, reasoning, rl-rollout) or a .toml path.")]
SpaceOption = Annotated[str, typer.Option(help="Bundled search space (default, small, huge) or a .toml path.")]
BudgetOption = Annotated[Optional[int], typer.Option(min=1, help="GPU budget (overrides the space's gpu_budget).")]
TargetOption = Annotated[Optional[float], typer.Option(min=0.0, help="Required output tokens/s for the whole deployment.")]
RateOption = Annotated[Optional[float], typer.Option(min=0.0, help="Override the workload's Poisson request rate (requests/s).")]
PriceOption = Annotated[Optional[str], typer.Option(help="Override GPU prices: h100_sxm=2.5,h200_sxm=3.2 (USD per GPU-hour).")]
ParamsOption = Annotated[Optional[Path], typer.Option(exists=True, dir_okay=False, help="Calibration parameters TOML (default: bundled).")]


def clean_errors(command):
    """Turn PlanError (and a few OS errors) into one stderr line and exit code 1."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except PlanError as error:
            err.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=1) from None
        except (OSError, UnicodeDecodeError) as error:
            err.print(f"[bold red]error:[/] {error}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=1) from None
        except (typer.Exit, typer.Abort, KeyboardInterrupt):
            raise
        except Exception as error:  # a bug: one line, and the traceback on request
            if os.environ.get("JAXPLAN_DEBUG"):
                raise
            err.print(f"[bold red]internal error[/] (a bug in jaxplan, please report it): {type(error).__name__}: {error}. Rerun with JAXPLAN_DEBUG=1 for the traceback.", highlight=False, soft_wrap=True)
            raise typer.Exit(code=3) from None

    return wrapper


def parse_prices(text: str | None) -> dict[str, float]:
    """'h100_sxm=2.5,h200_sxm=3.1' -> {name: USD per GPU-hour}."""
    prices = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, _, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            raise bad_value("--price", item, "use GPU=USD_PER_HOUR, e.g. h100_sxm=2.5") from None
        if not math.isfinite(price) or price <= 0:
            raise bad_value("--price", item, "the price must be a positive number of USD per GPU-hour")
        prices[name.strip()] = price
    return prices


def _progress():
    return Progress(TextColumn("[progress.description]{task.description}"), BarColumn(), TextColumn("{task.completed:,}/{task.total:,}"), TimeRemainingColumn(), console=err, transient=True)


def _sweep_options(model, gpus, workload, space, budget, target_throughput, rate, price):
    """Load and validate the inputs shared by sweep and sensitivity."""
    from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
    from jaxplan.specs.workload import Arrival

    model_spec = load_model(model)
    gpu_specs = parse_gpu_list(gpus)
    prices = parse_prices(price)
    unknown = set(prices) - {g.name for g in gpu_specs}
    if unknown:
        raise bad_value("--price", sorted(unknown)[0], f"not among --gpus ({gpus})")
    gpu_specs = tuple(g.with_price(prices[g.name]) if g.name in prices else g for g in gpu_specs)
    workload_spec = load_workload(workload)
    changes = {}
    if target_throughput is not None:
        changes["target_output_tokens_per_s"] = target_throughput
    if rate is not None:
        changes.update(arrival=Arrival.POISSON, request_rate_per_s=rate)
    if changes:
        workload_spec = _replace(workload_spec, **changes)
    space_spec = load_space(space)
    if budget is not None:
        space_spec = space_spec.replace(gpu_budget=budget)
    return model_spec, gpu_specs, workload_spec, space_spec


def _run_sweep(model_spec, gpu_specs, workload_spec, space_spec, top, chunk_size=1 << 16, params=None):
    from jaxplan.funnel.sweep import run_sweep

    out.print(f"[bold]{model_spec.describe()}[/]", highlight=False)
    out.print(workload_spec.describe(), highlight=False)
    with _progress() as progress:
        task = progress.add_task("sweeping", total=space_spec.size(len(gpu_specs)))
        return run_sweep(
            model_spec, gpu_specs, workload_spec, space_spec, top_k=top, chunk_size=chunk_size,
            params_path=str(params) if params else None,
            progress=lambda done, total: progress.update(task, completed=done),
        )


@app.command()
@clean_errors
def sweep(
    model: ModelOption = "llama-3.1-70b",
    gpus: GpusOption = "h100_sxm,h200_sxm",
    workload: WorkloadOption = "coding",
    space: SpaceOption = "default",
    budget: BudgetOption = None,
    target_throughput: TargetOption = None,
    rate: RateOption = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Finalists to keep (one per GPU/TP/PP/DP layout).")] = 20,
    price: PriceOption = None,
    chunk_size: Annotated[int, typer.Option(min=1024, max=1 << 24, help="Candidates per streamed chunk.")] = 1 << 16,
    params: ParamsOption = None,
    replay: Annotated[bool, typer.Option(help="Stage 7: replay the finalists step by step and re-rank them.")] = True,
    replay_requests: Annotated[int, typer.Option(min=10, max=1_000_000, help="Requests per replay (sampled from the workload, seeded).")] = 2000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the replay's request sample.")] = 0,
    json_path: Annotated[Optional[Path], typer.Option("--json", dir_okay=False, help="Write everything machine-readable here.")] = None,
) -> None:
    """Search the whole grid: funnel counts, the top configurations and a ready `vllm serve` command."""
    from jaxplan.report.tables import funnel_table, rows_table
    from jaxplan.report.vllm_command import vllm_serve_command

    model_spec, gpu_specs, workload_spec, space_spec = _sweep_options(model, gpus, workload, space, budget, target_throughput, rate, price)
    result = _run_sweep(model_spec, gpu_specs, workload_spec, space_spec, top, chunk_size, params)
    out.print(funnel_table(result))
    replayed = None
    if replay and result.shortlist:
        import time as _time

        from jaxplan.funnel.replay_stage import replay_rows

        t0 = _time.perf_counter()
        with err.status(f"stage 7: replaying {len(result.shortlist)} finalists x {replay_requests:,} requests"):
            replayed = replay_rows(result, result.shortlist, num_requests=replay_requests, seed=seed)
        from jaxplan.funnel.replay_stage import rank_agreement

        agreement = rank_agreement(replayed)
        out.print(
            f"7 replay: {len(replayed)} finalists x {replayed[0]['replay_requests']:,} requests in {_time.perf_counter() - t0:.1f} s; "
            f"re-ranked by replayed metrics (Spearman rank correlation with stage 4: {agreement:.2f})",
            highlight=False,
        )
    elif not replay:
        out.print("7 replay: skipped (--no-replay); ranking is stage 4's.", style="dim")
    report = sweep_report(result, space_spec.gpu_memory_utilization, vllm_serve_command, replayed)
    if result.shortlist:
        final = replayed or result.shortlist
        title = "re-ranked by the replay" if replayed else "ranked by stage 4"
        out.print(rows_table(final, f"Top {len(final)} configurations (one per GPU/TP/PP/DP layout), {title}"))
        out.print("[bold]Winner:[/] " + report["winner"]["vllm_serve"], highlight=False, soft_wrap=True)
    else:
        err.print(f"[bold red]{result.empty_explanation()}[/]", highlight=False, soft_wrap=True)  # one line, even when piped
    if json_path:
        json_path.write_text(json.dumps(report, indent=2, default=_json_default))
        out.print(f"wrote {json_path}")
    if not result.shortlist:
        raise typer.Exit(code=2)


def _replace(spec, **changes):
    return dataclasses.replace(spec, **changes)


def _json_default(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if hasattr(value, "value"):
        return value.value
    return str(value)


def _finite(value):
    """JSON has no inf: write null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def sweep_report(result, gpu_memory_utilization: float, command, replayed=None) -> dict:
    from jaxplan.funnel.replay_stage import rank_agreement

    clean = lambda row: {k: _finite(v) for k, v in row.items()}  # noqa: E731
    best = replayed[0] if replayed else result.winner
    winner = dict(clean(best), vllm_serve=command(result.model, best, gpu_memory_utilization)) if best else None
    return {
        "model": dataclasses.asdict(result.model),
        "workload": dataclasses.asdict(result.workload),
        "space": dataclasses.asdict(result.grid.space),
        "gpus": [dataclasses.asdict(g) for g in result.grid.gpus],
        "grid_size": result.grid.size,
        "funnel": [dataclasses.asdict(s) for s in result.stages],
        "replay": [clean(r) for r in replayed] if replayed else None,
        "replay_rank_correlation_with_stage4": _finite(rank_agreement(replayed)) if replayed else None,
        "compile_s": result.compile_s,
        "run_s": result.run_s,
        "num_devices": result.num_devices,
        "shortlist": [clean(r) for r in result.shortlist],
        "frontier": [clean(r) for r in result.frontier],
        "winner": winner,
        "empty_explanation": None if result.shortlist else result.empty_explanation(),
    }


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

    model_spec, gpu_specs, workload_spec, space_spec = _sweep_options(model, gpus, workload, space, budget, target_throughput, rate, price)
    result = _run_sweep(model_spec, gpu_specs, workload_spec, space_spec, top)
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
        json_path.write_text(json.dumps(payload, indent=2, default=_json_default))
        out.print(f"wrote {json_path}")


class Method(str, enum.Enum):
    ANALYTICAL = "analytical"
    REPLAY = "replay"


@app.command()
@clean_errors
def predict(
    input_csv: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="One row per configuration (see README for columns).")],
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False, help="Where to write the rows with predictions.")],
    method: Annotated[Method, typer.Option(help="replay: step-by-step scheduler replay per row; analytical: stage 4's steady-state model (instant).")] = Method.REPLAY,
    requests: Annotated[Optional[int], typer.Option(min=10, max=1_000_000, help="Replay: requests per row (default: the row's num_prompts, or 1000).")] = None,
    params: ParamsOption = None,
) -> None:
    """Predict TTFT, TPOT and throughput for explicit configurations in a CSV."""
    from jaxplan.calibrate.rows import read_predict_csv, write_predict_csv
    from jaxplan.predict import OUTPUT_COLUMNS, predict_rows, replay_predict_rows

    rows = read_predict_csv(input_csv)
    if not rows:
        raise bad_value("rows", 0, "the CSV has a header but no rows", where=str(input_csv))
    params_path = str(params) if params else None
    with err.status(f"predicting {len(rows)} rows ({method.value})"):
        if method == Method.REPLAY:
            predicted = replay_predict_rows(rows, params_path=params_path, source=str(input_csv), num_requests=requests)
        else:
            predicted = predict_rows(rows, params_path=params_path, source=str(input_csv))
    write_predict_csv(predicted, output, extra_columns=OUTPUT_COLUMNS)
    out.print(f"wrote {len(predicted)} rows to {output}")


@app.command()
@clean_errors
def simulate(
    input_csv: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Configurations to replay, in the predict CSV format.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", dir_okay=False, help="Also write the rows with replayed metrics here.")] = None,
    requests: Annotated[Optional[int], typer.Option(min=10, max=1_000_000, help="Requests per row (default: num_prompts, or 1000).")] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the sampled requests.")] = 0,
    params: ParamsOption = None,
) -> None:
    """Replay explicit configurations step by step (the vLLM-style scheduler) and print their metrics."""
    from rich.table import Table

    from jaxplan.calibrate.rows import read_predict_csv, write_predict_csv
    from jaxplan.predict import OUTPUT_COLUMNS, replay_predict_rows

    rows = read_predict_csv(input_csv)
    if not rows:
        raise bad_value("rows", 0, "the CSV has a header but no rows", where=str(input_csv))
    with err.status(f"replaying {len(rows)} configurations"):
        replayed = replay_predict_rows(rows, params_path=str(params) if params else None, source=str(input_csv), num_requests=requests, seed=seed)
    table = Table(title=f"Replayed {len(rows)} configurations")
    for name in ("model", "gpu", "TPxPPxDP", "ISL/OSL", "TTFT mean ms", "TTFT p99 ms", "TPOT mean ms", "TPOT p99 ms", "out tok/s", "status"):
        table.add_column(name)
    fmt = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
    for r in replayed:
        table.add_row(
            str(r["model"]), str(r["gpu"]), f"{r['tensor_parallel_size']}x{r.get('pipeline_parallel_size') or 1}x{r.get('data_parallel_size') or 1}",
            f"{r['isl']:g}/{r['osl']:g}", fmt(r["ttft_ms_mean"]), fmt(r["ttft_ms_p99"]), fmt(r["tpot_ms_mean"]), fmt(r["tpot_ms_p99"]), fmt(r["output_tok_s"]), r["status"],
        )
    out.print(table)
    if output:
        write_predict_csv(replayed, output, extra_columns=OUTPUT_COLUMNS)
        out.print(f"wrote {output}")


@app.command()
@clean_errors
def calibrate(
    measurements: Annotated[Optional[list[Path]], typer.Option("--measurements", exists=True, dir_okay=False, help="Your own data: predict-format CSV with measured_* columns, or `vllm bench serve --save-result` JSON (repeatable).")] = None,
    shared_data: Annotated[bool, typer.Option(help="Also use the measurements in ../shared/data (or $JAXPLAN_SHARED_DATA) when present.")] = True,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", dir_okay=False, help="Where to write the parameters (default: the bundled file).")] = None,
    report_path: Annotated[Optional[Path], typer.Option("--report", dir_okay=False, help="Write the accuracy report as JSON here.")] = None,
    steps: Annotated[int, typer.Option(min=1, max=100000, help="Adam steps per fit.")] = 400,
) -> None:
    """Fit the efficiency parameters: kernel tables first, then end-to-end serving rows (optax)."""
    from jaxplan.calibrate._data import data_root_exists
    from jaxplan.calibrate.rows import read_predict_csv
    from jaxplan.calibrate.run import calibrate as run_calibration, default_output, provenance, write_params
    from jaxplan.calibrate.serving import load_serving_rows, read_vllm_bench_json

    rows, sources = [], []
    if shared_data and data_root_exists():
        rows += load_serving_rows()
        sources.append("shared/data: e2e_aiconfigurator_silicon, trtllm_perf_overview, vllm_a100_tp_vs_pp; kernels_aiconfigurator")
    for path in measurements or []:
        rows += read_vllm_bench_json(path) if path.suffix == ".json" else read_predict_csv(path)
        sources.append(str(path))
    if not rows:
        raise bad_value("--measurements", None, "no measurements found: pass --measurements FILE or provide ../shared/data")
    params, report = run_calibration(rows, log=lambda line: err.print(line, highlight=False))
    target = output or default_output()
    write_params(params, target, provenance(rows, report, sources))
    out.print(json.dumps(report, indent=2, default=str))
    if report_path:
        report_path.write_text(json.dumps(report, indent=2, default=str))
    out.print(f"wrote {target}")


@app.command(name="list")
@clean_errors
def list_specs() -> None:
    """List the bundled models, GPUs, workloads and search spaces."""
    from jaxplan.specs import known, load_gpu, load_model, load_space, load_workload

    for name in known("models"):
        out.print(f"model     {load_model(name).describe()}  [dim]({load_model(name).hf_id})[/]", highlight=False)
    for name in known("gpus"):
        g = load_gpu(name)
        out.print(f"gpu       {name}: {g.display_name}, {g.hbm_bytes / 2**30:.0f} GiB, {g.hbm_bandwidth_bytes_per_s / 1e12:.2f} TB/s, ${g.price_usd_per_hour:.2f}/h", highlight=False)
    for name in known("workloads"):
        out.print(f"workload  {load_workload(name).describe()}", highlight=False)
    for name in known("spaces"):
        out.print(f"space     {name}: {load_space(name).size(1):,} candidates per GPU type", highlight=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
