"""`jaxplan predict` and `jaxplan simulate`: explicit configurations from a CSV."""

from __future__ import annotations

import enum
import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.cli import engine_settings
from jaxplan.cli.common import ParamsOption, ReplayMaxSecondsOption, Routing, RoutingOption, VllmVersionOption, app, check_writable, clean_errors, err, out, progress_bar, write_plots
from jaxplan.cli.engine_settings import (
    DataParallelSetting, GpuSetting, KvCacheDtypeSetting, MaxNumBatchedTokensSetting, MaxNumSeqsSetting, ModelSetting,
    ExpertParallelSetting, PipelineParallelSetting, TensorParallelSetting, WeightDtypeSetting,
)  # fmt: skip
from jaxplan.deadline import check_limit
from jaxplan.errors import bad_value


class Method(str, enum.Enum):
    ANALYTICAL = "analytical"
    REPLAY = "replay"


@app.command()
@clean_errors
def predict(
    input_csv: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="One row per configuration (columns: docs/usage.md), or a `vllm bench serve --save-result` JSON file: its runs are predicted next to their measured columns.")],
    output: Annotated[Path, typer.Option("-o", "--output", dir_okay=False, help="Where to write the rows with predictions.")],
    method: Annotated[Method, typer.Option(help="replay: step-by-step scheduler replay per row; analytical: stage 4's steady-state model (instant).")] = Method.REPLAY,
    requests: Annotated[Optional[int], typer.Option(min=10, max=1_000_000, help="Replay: requests per row (default: the row's num_prompts, or 1000).")] = None,
    params: ParamsOption = None,
    vllm_version: VllmVersionOption = None,
    routing: RoutingOption = Routing.ROUND_ROBIN,
    max_seconds: ReplayMaxSecondsOption = None,
    model: ModelSetting = None,
    gpu: GpuSetting = None,
    tensor_parallel_size: TensorParallelSetting = None,
    pipeline_parallel_size: PipelineParallelSetting = None,
    data_parallel_size: DataParallelSetting = None,
    enable_expert_parallel: ExpertParallelSetting = None,
    weight_dtype: WeightDtypeSetting = None,
    kv_cache_dtype: KvCacheDtypeSetting = None,
    max_num_seqs: MaxNumSeqsSetting = None,
    max_num_batched_tokens: MaxNumBatchedTokensSetting = None,
) -> None:
    """Predict TTFT, TPOT and throughput for explicit configurations in a CSV (or measured vllm bench runs)."""
    from jaxplan.bands import COLUMNS as BAND_COLUMNS, with_bands
    from jaxplan.calibrate.rows import write_predict_csv
    from jaxplan.prediction import OUTPUT_COLUMNS, predict_rows

    settings = engine_settings.given([input_csv], locals())
    check_limit(max_seconds)
    check_writable(output, "-o")
    rows = engine_settings.read_rows(input_csv, settings)
    if not rows:
        raise bad_value("rows", 0, "the CSV has a header but no rows", where=str(input_csv))
    params_path = str(params) if params else None
    if method == Method.REPLAY:
        predicted = replay_rows_with_progress(rows, "predicting", params_path=params_path, source=str(input_csv), num_requests=requests, routing=routing.value, max_seconds=max_seconds)
    else:
        with err.status(f"predicting {len(rows)} rows ({method.value})"):
            predicted = predict_rows(rows, params_path=params_path, source=str(input_csv))
    predicted = with_bands(predicted, params_path)  # p10-p90 of each metric from its class's held-out rows
    write_predict_csv(predicted, output, extra_columns=OUTPUT_COLUMNS + BAND_COLUMNS, drop_blank=True)
    out.print(f"wrote {len(predicted)} rows to {output}")


@app.command()
@clean_errors
def simulate(
    input_csv: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Configurations to replay, in the predict CSV format.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", dir_okay=False, help="Also write the rows with replayed metrics here.")] = None,
    requests: Annotated[Optional[int], typer.Option(min=10, max=1_000_000, help="Requests per row (default: num_prompts, or 1000).")] = None,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the sampled requests.")] = 0,
    params: ParamsOption = None,
    vllm_version: VllmVersionOption = None,
    routing: RoutingOption = Routing.ROUND_ROBIN,
    plot: Annotated[Optional[Path], typer.Option("--plot", file_okay=False, help="Write each row's replay timeline here (PNG + SVG; replays each row once more).")] = None,
    max_seconds: ReplayMaxSecondsOption = None,
) -> None:
    """Replay explicit configurations step by step (the vLLM-style scheduler) and print their metrics."""
    from rich.table import Table

    from jaxplan.bands import COLUMNS as BAND_COLUMNS, with_bands
    from jaxplan.calibrate.rows import read_predict_csv, write_predict_csv
    from jaxplan.prediction import OUTPUT_COLUMNS

    check_limit(max_seconds)
    check_writable(output, "-o")
    rows = read_predict_csv(input_csv)
    if not rows:
        raise bad_value("rows", 0, "the CSV has a header but no rows", where=str(input_csv))
    if plot:
        from jaxplan.plots.save import plot_dir

        plot_dir(plot)  # a bad --plot fails before the replay
    replayed = replay_rows_with_progress(rows, "replaying", params_path=str(params) if params else None, source=str(input_csv), num_requests=requests, seed=seed, routing=routing.value, max_seconds=max_seconds)
    replayed = with_bands(replayed, str(params) if params else None)
    table = Table(title=f"Replayed {len(rows)} configurations (p10-p90: where 80% of held-out measurements of the row's class fell)")
    for name in ("model", "gpu", "TPxPPxDP", "ISL/OSL", "TTFT mean ms (p10-p90)", "TTFT p99 ms", "TPOT mean ms (p10-p90)", "TPOT p99 ms", "out tok/s (p10-p90)", "KV tokens", "class", "status"):
        table.add_column(name, justify="right" if name.endswith(("ms", "tok/s", "tokens", "(p10-p90)")) else "left")
    fmt = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
    short = lambda v: f"{v:,.0f}" if v >= 100 else f"{v:.3g}"  # noqa: E731
    # The band in the mean's cell: two more columns would push the class and status out of an 80-column terminal.
    banded = lambda r, m: fmt(r[m]) + ("" if r[f"{m}_p10"] is None else f" ({short(r[f'{m}_p10'])}-{short(r[f'{m}_p90'])})")  # noqa: E731
    notes = []
    for n, r in enumerate(replayed, 1):
        # A status's first word in the table, its sentences below it: wrapped into the last column they made rows dozens of lines tall.
        head = re.split(r"[:;]", str(r["status"]), maxsplit=1)[0]
        if head != r["status"]:
            notes.append(f"row {n}: {r['status']}")
        table.add_row(
            str(r["model"]), str(r["gpu"]), f"{r['tensor_parallel_size']}x{r.get('pipeline_parallel_size') or 1}x{r.get('data_parallel_size') or 1}",
            f"{r['isl']:g}/{r['osl']:g}", banded(r, "ttft_ms_mean"), fmt(r["ttft_ms_p99"]), banded(r, "tpot_ms_mean"), fmt(r["tpot_ms_p99"]),
            banded(r, "output_tok_s"), f"{r['kv_cache_tokens']:,}", r["prediction_class"].replace("/", "/ "),  # wraps at the slashes
            head if head == r["status"] else f"{head} (below)",
        )
    out.print(table)
    for note in notes:
        out.print(note, soft_wrap=True)
    if output:
        write_predict_csv(replayed, output, extra_columns=OUTPUT_COLUMNS + BAND_COLUMNS, drop_blank=True)
        out.print(f"wrote {output}")
    if plot:
        from jaxplan.plots.figures import simulate_figures
        from jaxplan.plots.traces import csv_traces

        params_path = str(params) if params else None
        make = lambda step: simulate_figures(rows, csv_traces(rows, num_requests=requests, seed=seed, params_path=params_path, source=str(input_csv), step=step), step)  # noqa: E731
        write_plots(make, 2 * len(rows), plot)


def replay_rows_with_progress(rows: list[dict], label: str, *, source: str, **kwargs) -> list[dict]:
    """`replay_predict_rows` one row at a time under a progress bar (same results: every row is its
    own replay). All rows are validated first, so an error names the right row. A `max_seconds`
    keyword is one limit for all the rows together."""
    import time

    from jaxplan.prediction import replay_predict_rows, row_batches

    row_batches(rows, source)
    kwargs.setdefault("started_at", time.perf_counter())
    done = []
    with progress_bar() as progress:
        task = progress.add_task(f"{label} {len(rows)} configurations", total=len(rows))
        for row in rows:
            done += replay_predict_rows([row], source=source, **kwargs)
            progress.advance(task)
    return done
