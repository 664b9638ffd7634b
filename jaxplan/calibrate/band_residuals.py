"""The held-out residuals behind the uncertainty bands (`jaxplan.bands`), and the bands file.

Every measured vLLM row is predicted (stage 4) by parameters that did not see it, once per kind of
evidence a user's prediction can rest on:

- calibrated: a fitted GPU's rows, each by the per-GPU fit that held its configuration out
  (`run.held_out_configurations`' folds); a fitted GPU's rows the fit excludes (`run.fit_excluded`,
  e.g. a model it does not fit) by the final fit;
- kernel_tables: a fitted GPU's rows by the fit that held the GPU out, the GPU priced from its kernel
  tables (`run.held_out_params`); a GPU no fit sees, with kernel tables, by the final fit;
- spec_sheet: a fitted GPU's rows by the fit that held the GPU out with the GPU priced as one without
  kernel tables (every fitted field from that fit, `run.unfitted_gpu_params` with tables=False, as a
  GPU without tables is shipped); a GPU no fit sees, without kernel tables, by the final fit.

Each residual row is labelled with its model class (the fit saw the model's rows, or not) and regime
(`run.kv_holds_concurrency`). The MoE rows, which no fit sees, are unseen-model rows of every kind of
evidence their GPU offers.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from jaxplan import bands
from jaxplan.calibrate import fit, run
from jaxplan.physics.params import DEFAULTS
from jaxplan.prediction import predict_rows

NO_TABLES = run.PRIOR_SOURCES[2]  # a GPU whose priors are the defaults: no kernel tables


def _six_digits(value):
    """A number to 6 significant digits, as the residual CSV stores it, so that bands computed here and
    bands recomputed from the CSV agree exactly; None stays None."""
    return None if value is None else float(f"{float(value):.6g}")


def _residual(row: dict, predicted: dict, evidence: str, seen: bool, kv_fits: bool) -> dict:
    return {
        "gpu": row["gpu"], "model": row["model"], "dataset": row.get("dataset"), "source_id": row.get("source_id"),
        "evidence": evidence, "model_class": "seen" if seen else "unseen", "regime": "kv_fits" if kv_fits else "kv_starved",
        **{f"measured_{m}": _six_digits(row.get(f"measured_{m}")) for m in bands.METRICS}, **{m: _six_digits(predicted.get(m)) for m in bands.METRICS},
    }  # fmt: skip


def _scored(group: list[dict], params: dict[str, dict[str, float]], evidence: str, models: set[str]) -> list[dict]:
    """Residual rows of `group` predicted with `params` (GPU -> fields) as `evidence`."""
    if not group:
        return []
    complete = {g: {**DEFAULTS, **values} for g, values in params.items()}
    predicted = predict_rows(group, source="measurements", efficiency=complete)
    fits = run.kv_holds_concurrency(group, complete)
    return [_residual(r, p, evidence, r["model"] in models, f) for r, p, f in zip(group, predicted, fits)]


def spec_sheet_params(shared: dict[str, float]) -> dict[str, float]:
    """Parameters of a held-out GPU priced as if it had no kernel tables: what `run.calibrate` ships
    for such a GPU (`run.unfitted_gpu_params` with tables=False), every fitted field from the shared
    fit that held it out (`shared`, report["held_out_shared"]), DEFAULTS for the rest."""
    return {**DEFAULTS, **{f: shared[f] for f in fit.FIT_FIELDS}}


def fitted(rows: list[dict], params: dict[str, dict[str, float]]) -> tuple[set[str], set[str]]:
    """(GPUs, models) whose vLLM rows among `rows` the serving fit saw (`run.trained_rows`: KV capacity
    does not depend on the fitted fields, so the final `params` decide as the priors did)."""
    trained = run.trained_rows([r for r in run.evaluated_rows(rows) if not run.fit_excluded(r)], params)
    return {r["gpu"] for r in trained}, {r["model"] for r in trained}


def held_out_residuals(rows: list[dict], params: dict[str, dict[str, float]], report: dict, configuration_predictions: dict[int, dict],
                       moe_rows: list[dict] = ()) -> list[dict]:
    """Residual rows (`bands.RESIDUAL_COLUMNS`) of the vLLM rows among `rows` (what `run.calibrate` was
    given), from its `params` and `report` (held_out_params, prior_sources) and the per-row predictions
    its held-out-configuration fits made (`configuration_predictions`, id(row) -> predicted row); and of
    `moe_rows` (`moe_rows.load_moe_rows`), which no fit sees: scored as the fit-excluded rows are, so
    the unseen-model classes rest on every model the fit never saw."""
    evaluated = run.evaluated_rows(rows) + run.measured_rows(list(moe_rows))
    unfitted = {id(r) for r in moe_rows}
    complete = {g: {**DEFAULTS, **values} for g, values in params.items()}
    fit_rows = [r for r in evaluated if not run.fit_excluded(r) and id(r) not in unfitted]
    fitted_gpus, models = fitted(rows, params)
    sources = report.get("prior_sources", {})
    out = []
    scored = [r for r in fit_rows if id(r) in configuration_predictions]
    fits = run.kv_holds_concurrency(scored, complete) if scored else []
    out += [_residual(r, configuration_predictions[id(r)], "calibrated", r["model"] in models, f) for r, f in zip(scored, fits)]
    for gpu in sorted({r["gpu"] for r in evaluated}):
        mine = [r for r in evaluated if r["gpu"] == gpu]
        if gpu in fitted_gpus:
            out += _scored([r for r in mine if run.fit_excluded(r) or id(r) in unfitted], {gpu: params[gpu]}, "calibrated", models)
            if gpu in report.get("held_out_params", {}):
                held = report["held_out_params"][gpu]
                out += _scored(mine, {gpu: held}, "kernel_tables", models)
                out += _scored(mine, {gpu: spec_sheet_params(report["held_out_shared"][gpu])}, "spec_sheet", models)
        else:
            out += _scored(mine, {gpu: params[gpu]}, "spec_sheet" if sources.get(gpu) == NO_TABLES else "kernel_tables", models)
    return out


def write_calibration_bands(rows: list[dict], params: dict[str, dict[str, float]], report: dict, configuration_predictions: dict[int, dict],
                            params_output: str | Path, data: list[str], folds: int, moe_rows: list[dict] = ()) -> Path | None:
    """Compute the bands from `held_out_residuals` and write them (with the residual CSV) next to the
    parameter file `params_output` (`bands.bands_path`); returns the bands file, or None where no row
    was held out or fewer than `bands.MIN_ROWS` (a band from a handful of rows would claim a precision
    they do not have: predict then uses the bundled bands). Also puts the bands' class sizes and
    quantiles in report["bands"]."""
    residuals = held_out_residuals(rows, params, report, configuration_predictions, moe_rows)
    if len(residuals) < bands.MIN_ROWS:
        return None
    table = bands.compute_bands(residuals)
    fitted_gpus, fitted_models = fitted(rows, params)
    record = {
        "date": datetime.date.today().isoformat(), "command": "jaxplan calibrate", "data": data,
        "params": Path(params_output).name, "method": "stage 4 (predict --method analytical)",
        "quantiles": list(bands.QUANTILES), "min_rows": bands.MIN_ROWS, "spec_sheet_widening": bands.SPEC_SHEET_WIDENING,
        "held_out_folds": folds, "fitted_gpus": sorted(fitted_gpus), "fitted_models": sorted(fitted_models),
        "prior_gpus": sorted(g for g, source in report.get("prior_sources", {}).items() if source != NO_TABLES),
        "residual_rows": len(residuals),
    }  # fmt: skip
    path = bands.write_bands(table, bands.bands_path(params_output), record, residuals)
    report["bands"] = {key: {"rows": entry["rows"], "pooled_from": entry["pooled_from"], **{m: entry[m] for m in bands.METRICS}} for key, entry in table.items()}
    return path
