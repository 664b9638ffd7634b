"""`jaxplan calibrate`: fit the efficiency parameters to measurements."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.cli import engine_settings
from jaxplan.cli.common import app, check_writable, clean_errors, out, progress_bar
from jaxplan.cli.engine_settings import (
    DataParallelSetting, GpuSetting, KvCacheDtypeSetting, MaxNumBatchedTokensSetting, MaxNumSeqsSetting, ModelSetting,
    ExpertParallelSetting, PipelineParallelSetting, TensorParallelSetting, WeightDtypeSetting,
)  # fmt: skip
from jaxplan.errors import PlanError, bad_value


@app.command()
@clean_errors
def calibrate(
    files: Annotated[Optional[list[Path]], typer.Argument(exists=True, dir_okay=False, show_default=False, help="Your own measurement files, as --measurements takes them (e.g. runs/*.json).")] = None,
    measurements: Annotated[Optional[list[Path]], typer.Option("--measurements", exists=True, dir_okay=False, help="Your own data: predict-format CSV with measured_* columns, or `vllm bench serve --save-result` JSON (repeatable).")] = None,
    shared_data: Annotated[bool, typer.Option(help="Also use the measurements in ../shared/data (or $JAXPLAN_SHARED_DATA) when present.")] = True,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", dir_okay=False, help="Where to write the parameters (default: $XDG_CONFIG_HOME/jaxplan/params.toml, else ~/.config/jaxplan/params.toml; never the bundled file). Commands read it when --params or $JAXPLAN_PARAMS names it.")] = None,
    write_bundled: Annotated[bool, typer.Option("--write-bundled", hidden=True, help="Maintainers: write the parameter file that ships with jaxplan (docs/calibration.md).")] = False,
    report_path: Annotated[Optional[Path], typer.Option("--report", dir_okay=False, help="Write the accuracy report as JSON here.")] = None,
    steps: Annotated[int, typer.Option(min=1, max=100000, help="Adam steps per fit.")] = 400,
    replay_check: Annotated[bool, typer.Option(help="Also replay the rows step by step (predict's default method): each fitted GPU's and those of GPUs no fit sees with the final fit, and where several GPUs are fitted each held-out GPU's with the parameters fitted without it; adds `in_sample_replay`, `not_fitted_replay` and `held_out_replay` to the report (~30 s, ~50 s the first time, on the shared data); the parameters are written before it.")] = True,
    held_out_folds: Annotated[int, typer.Option(min=1, max=4, help="Held-out configurations: fit without a quarter of each GPU's layouts and score them (`held_out_configurations` in the report); 4 scores every layout once, by 4 fits (~15 s each).")] = 1,
    table_path: Annotated[Optional[Path], typer.Option("--accuracy-table", dir_okay=False, help="Write the held-out accuracy table (leave-one-GPU-out and leave-one-model-out, by model, GPU, dtype, ISL/OSL and concurrency band, with signed bias) as Markdown here: the table of docs/accuracy.md.")] = None,
    rows_path: Annotated[Optional[Path], typer.Option("--rows", dir_okay=False, help="Write every measured row next to its predictions as CSV (the predict format, then stage 4 with the fit, with the fit that held its GPU out, and replayed): which rows the report's errors come from.")] = None,
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
    """Fit the efficiency parameters: kernel tables first, then end-to-end serving rows (optax)."""
    from jaxplan.calibrate._data import data_root_exists
    from jaxplan.calibrate.run import FIT_BACKEND, calibrate as run_calibration, evaluated_rows, fit_excluded, measured_rows, output_path, provenance, replay_check as run_replay_check, write_params
    from jaxplan.calibrate.serving import load_serving_rows
    from jaxplan.prediction import resolve_capped_rates

    paths = [*(files or []), *(measurements or [])]
    settings = engine_settings.given(paths, locals())
    target = output_path(output, write_bundled)
    if output is None and not write_bundled:  # the user's config directory may not exist yet
        target.parent.mkdir(parents=True, exist_ok=True)
    check_writable(target, "-o")
    check_writable(report_path, "--report")
    check_writable(rows_path, "--rows")
    check_writable(table_path, "--accuracy-table")
    rows, sources, moe_rows = [], [], []
    if shared_data and data_root_exists():
        from jaxplan.calibrate.moe_rows import load_moe_rows

        rows += load_serving_rows()
        moe_rows = load_moe_rows()  # scored into the report, not fitted
        sources.append("shared/data: e2e_aiconfigurator_silicon, trtllm_perf_overview, vllm_a100_tp_vs_pp, inferencemax_amd; kernels_aiconfigurator")
    for path in paths:
        found = engine_settings.read_rows(path, settings)
        if not found:
            raise bad_value("rows", 0, "the file has a header but no measurement rows", where=str(path))
        if not measured_rows(found):
            raise PlanError(f"{path}: no row has both measured_ttft_ms_mean and measured_tpot_ms_mean; calibrate fits measurements (to predict the rows instead, use jaxplan predict)")
        # A row without a dataset is its file's; without a backend, vLLM's (what jaxplan models and fits).
        rows += [{**r, "dataset": r.get("dataset") or path.name, "backend": r.get("backend") or FIT_BACKEND} for r in found]
        sources.append(str(path))
    if not rows:
        raise bad_value("--measurements", None, "no measurements found: pass measurement files (CSV or vllm bench JSON) or provide ../shared/data")
    rows, capped = resolve_capped_rates(rows)  # --request-rate with --max-concurrency: the regime that binds, by the selected parameters (--params is not an option here: $JAXPLAN_PARAMS, else the bundled file)
    if capped:
        out.print(f"{len(capped)} run(s) with both max_concurrency and a finite request_rate: each fitted as the regime that binds (jaxplan predict says which)", highlight=False)
    evaluated = evaluated_rows(rows)
    if evaluated and all(fit_excluded(r) for r in evaluated):
        first = evaluated[0]
        raise bad_value("measured_tpot_ms_mean", first.get("measured_tpot_ms_mean"), f"no measured {FIT_BACKEND} row is left to fit, this one's and every other's is left out: {fit_excluded(first)}",
                        where=", ".join(map(str, paths)) or None)  # fmt: skip
    if not evaluated:
        backends = sorted({str(r.get("backend")) for r in measured_rows(rows)})
        raise bad_value("backend", ",".join(backends), f"no measured {FIT_BACKEND} row to fit: jaxplan fits vLLM's serving; give {FIT_BACKEND} rows (an empty backend counts as {FIT_BACKEND})", where=", ".join(map(str, paths)) or None)
    with progress_bar() as progress:
        steps_total = fit_step_groups(rows, replay_check)
        task = progress.add_task("calibrating (kernel priors, per-GPU fit, held-out fits)", total=steps_total)

        def log(line: str) -> None:  # one line per finished step group
            progress.console.print(line, highlight=False)
            progress.advance(task)

        configuration_predictions: dict = {}  # id(row) -> its held-out-configuration prediction, for the bands
        params, report = run_calibration(rows, steps=steps, log=log, folds=held_out_folds, held_out_predictions=configuration_predictions, moe_rows=moe_rows)
        replayed: dict = {}
        # The parameters are final here (the replay check only reports on them): write them now.
        write_params(params, target, provenance(rows, report, sources), report.get("priors"))
        if report.get("in_sample"):  # held-out residuals exist only where some GPU was fitted
            from jaxplan.calibrate.band_residuals import write_calibration_bands

            bands_file = write_calibration_bands(rows, params, report, configuration_predictions, target, sources, held_out_folds, moe_rows)
            progress.console.print(f"wrote {bands_file} (p10-p90 bands per prediction class, docs/uncertainty.md)" if bands_file else
                                   "fewer than 10 held-out rows: no bands file written (predict --params uses the bundled bands)", highlight=False)
        if replay_check and report.get("in_sample"):  # some GPU was fitted
            progress.console.print(f"wrote {target} (calibrated in {report['seconds']:.0f} s); replaying rows as a check (--no-replay-check skips it)", highlight=False)
            held_out = run_replay_check(rows, report, params, log=log, replayed=replayed)
            if report.get("held_out_params"):
                report["held_out_replay"] = held_out
        progress.update(task, completed=steps_total)  # a GPU with no fittable row skips its steps
    for gpu, reason in report.get("gpus_not_fitted", {}).items():
        out.print(f"warning: {gpu} not fitted: {reason}", highlight=False)
    for key, entry in report.get("not_fitted", {}).items():  # scored, left out of the fit
        out.print(f"warning: {entry.get('rows', '?')} row(s) of {key} not fitted: {entry['reason']}", highlight=False)
    out.print(json.dumps(report, indent=2, default=str))
    if report_path:
        report_path.write_text(json.dumps(report, indent=2, default=str))
    if table_path and report.get("accuracy_table"):
        from jaxplan.calibrate.accuracy_table import markdown

        table_path.write_text(markdown(report["accuracy_table"]))
        out.print(f"wrote {table_path}")
    if rows_path:
        from jaxplan.calibrate.residuals import row_table, write_row_table

        write_row_table(row_table(rows, params, report, replayed), rows_path)
        out.print(f"wrote {rows_path}")
    out.print(f"wrote {target}", highlight=False)
    if not write_bundled:  # a user's file is read only where selected: say how
        quoted = shlex.quote(str(target.resolve()))
        out.print(f"use it with --params {quoted}, or for every command: export JAXPLAN_PARAMS={quoted}", highlight=False, soft_wrap=True)


def fit_step_groups(rows: list[dict], replay_check: bool = False) -> int:
    """Step groups `calibrate` logs: kernel priors, the per-GPU fit, one held-out fit per GPU (if several),
    one held-out-model score per model with rows, the held-out-configurations fit, and with replay_check one in-sample replay per GPU, one held-out
    replay per GPU (if several) and one replay per campaign on a GPU no fit sees."""
    from jaxplan.calibrate.run import evaluated_rows, fit_excluded, unseen_gpu_groups

    gpus = {r["gpu"] for r in evaluated_rows(rows) if not fit_excluded(r)}
    models = len({r.get("model") for r in evaluated_rows(rows)}) if gpus else 0
    held = len(gpus) if len(gpus) > 1 else 0
    replays = held + len(gpus) + len(unseen_gpu_groups(rows)) if replay_check and gpus else 0
    return 1 + (2 if gpus else 0) + held + models + replays
