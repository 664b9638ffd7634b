"""Per-row residuals of a calibration: each measured row next to what jaxplan predicts for it.

`jaxplan calibrate --rows rows.csv` writes them: the rows in the `predict` CSV format (their
measured_* and provenance columns included; the file reads back as input, `rows.WRITTEN_COLUMNS`),
then one column per prediction, in milliseconds and tokens/s like `predict`'s output:

- ttft_ms_mean, tpot_ms_mean, output_tok_s, status: stage 4 with the final (shipped) fit;
- held_out_ttft_ms_mean, held_out_tpot_ms_mean: stage 4 with the fit that did not see the row's
  GPU (blank where no such fit exists: a single fitted GPU, or a row of another backend);
- replay_ttft_ms_mean, replay_tpot_ms_mean, replay_output_tok_s: `predict`'s default step-by-step
  replay with the final fit (blank without the replay check, or for a row it does not replay);
- fitted: whether the fit saw the row; kv_fits: whether its KV cache holds the clients (see
  `run.trained_mask`; where it does not, the measured TTFT depends on how long the benchmark ran).

The aggregate numbers (MAPE, Spearman) are in the report; this file says which rows they come from.
"""

from __future__ import annotations

from pathlib import Path

from jaxplan.calibrate.rows import write_predict_csv
from jaxplan.physics.params import DEFAULTS
from jaxplan.prediction import predict_rows

PREDICTION_COLUMNS = (
    "fitted", "kv_fits", "ttft_ms_mean", "tpot_ms_mean", "output_tok_s", "status",
    "held_out_ttft_ms_mean", "held_out_tpot_ms_mean", "replay_ttft_ms_mean", "replay_tpot_ms_mean", "replay_output_tok_s",
)  # fmt: skip


def row_table(rows: list[dict], params: dict[str, dict[str, float]], report: dict, replayed: dict[int, dict] | None = None) -> list[dict]:
    """Every row with TTFT and TPOT measured (any backend), in input order, with PREDICTION_COLUMNS.

    rows: the normalized serving rows `calibrate` was given. params: the final fit (GPU -> fields).
    report: `calibrate`'s (its held_out_params). replayed: what `run.replay_check` collected."""
    from jaxplan.calibrate import run

    usable = run.measured_rows(rows)
    complete = {g: {**DEFAULTS, **values} for g, values in params.items()}
    final = predict_rows(usable, source="measurements", efficiency=complete)
    fits = run.kv_holds_concurrency(usable, complete)
    evaluated = run.evaluated_rows(rows)
    fit_rows = {id(r) for r in evaluated if not run.fit_excluded(r)}  # the fit sees those of them whose KV holds the clients
    held_out: dict[int, dict] = {}
    for gpu, values in report.get("held_out_params", {}).items():
        group = [r for r in evaluated if r["gpu"] == gpu]
        for row, prediction in zip(group, predict_rows(group, source="measurements", efficiency={gpu: {**DEFAULTS, **values}})):
            held_out[id(row)] = prediction
    table = []
    for row, prediction, kv_fits in zip(usable, final, fits):
        replay = (replayed or {}).get(id(row), {})
        held = held_out.get(id(row), {})
        table.append({
            **row, "fitted": bool(kv_fits) and id(row) in fit_rows, "kv_fits": bool(kv_fits),
            **{c: prediction.get(c) for c in ("ttft_ms_mean", "tpot_ms_mean", "output_tok_s", "status")},
            "held_out_ttft_ms_mean": held.get("ttft_ms_mean"), "held_out_tpot_ms_mean": held.get("tpot_ms_mean"),
            "replay_ttft_ms_mean": replay.get("ttft_ms_mean"), "replay_tpot_ms_mean": replay.get("tpot_ms_mean"),
            "replay_output_tok_s": replay.get("output_tok_s"),
        })  # fmt: skip
    return table


def write_row_table(table: list[dict], path: str | Path) -> Path:
    """`row_table` as CSV (the predict format, blank optional columns left out, then PREDICTION_COLUMNS)."""
    write_predict_csv(table, path, PREDICTION_COLUMNS, drop_blank=True)
    return Path(path)
