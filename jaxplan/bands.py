"""Uncertainty bands: a p10-p90 range for each prediction, from held-out residuals of its class.

A prediction's class is three labels, "evidence/model/regime":

- evidence: `calibrated` (the GPU's serving rows were fitted), `kernel_tables` (not fitted, but the
  calibration file has its kernel-table priors, `[prior.<gpu>]`), `spec_sheet` (neither: its spec
  sheet and the default efficiencies alone, e.g. MI300X or a GPU spec of your own);
- model: `seen` (the fit saw this model's rows) or `unseen`;
- regime: `kv_fits` (open loop, or each replica's KV cache holds its clients' full contexts) or
  `kv_starved` (it does not: vLLM preempts, and the measured TTFT depends on how long the run lasted).

`jaxplan calibrate` writes, next to the parameter file, a bands file (`bands_path`) holding for every
class the 10th and 90th percentiles of measured / predicted over the held-out rows of that class
(`compute_bands`), and the residuals themselves (`residuals_path`). A prediction x of a class with
ratio quantiles (q10, q90) has the band [x q10, x q90]: where the measurement lay for 80% of that
class's held-out rows. docs/uncertainty.md says which rows each class holds and what is thin.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path

import numpy as np

from jaxplan.errors import PlanError, bad_value
from jaxplan.physics.params import PARAMS_PATH, load_priors
from jaxplan.tomlio import toml_value

METRICS = ("ttft_ms_mean", "tpot_ms_mean", "output_tok_s")  # predicted columns that get a band
BAND_COLUMNS = tuple(f"{m}_{q}" for m in METRICS for q in ("p10", "p90"))
CLASS_COLUMN = "prediction_class"
COLUMNS = BAND_COLUMNS + (CLASS_COLUMN,)  # what `with_bands` adds to a predicted row
EVIDENCE = ("calibrated", "kernel_tables", "spec_sheet")
MODEL_CLASSES = ("seen", "unseen")
REGIMES = ("kv_fits", "kv_starved")
QUANTILES = (0.1, 0.9)
# A class with fewer held-out rows than this borrows the band of its nearest coarser class that has
# them (`pool_keys`), stretched to cover every one of its own rows: below 20 rows the empirical p10 and
# p90 rest on the one or two most extreme rows (a leave-one-out check of 11-14-row classes covered
# 57-64%), fewer than 10 cannot place them at all.
MIN_ROWS = 20
# A spec-sheet GPU's band: the held-out GPUs priced from the spec sheet alone (default efficiencies,
# the runtime overheads of the other GPU's fit), then widened by this factor both ways. The held-out
# GPUs are Hopper and Blackwell, which the defaults were chosen for; an AMD GPU or an unlisted part can
# sit further from them, which no row of the data measures.
SPEC_SHEET_WIDENING = 1.25
# An unseen model's error is shared by all its rows (one model is off in one direction), so a band from
# every row of the class covers a new model's rows less often than 80%. An unseen-model class with rows
# of at least this many models is widened (both ways, by `unseen_model_widening`) until the band made
# from the other models' rows covers 80% of each model's rows, pooled over the models; one with rows of
# fewer models borrows a coarser class's band as a thin class does.
UNSEEN_MIN_MODELS = 3
BANDS_PATH = PARAMS_PATH.parent / "bands.toml"
RESIDUAL_COLUMNS = (
    "gpu", "model", "dataset", "source_id", "evidence", "model_class", "regime",
    *(c for m in METRICS for c in (f"measured_{m}", m)),
)  # fmt: skip


def class_key(evidence: str, model: str, regime: str) -> str:
    return f"{evidence}/{model}/{regime}"


ALL_CLASSES = tuple(class_key(e, m, r) for e in EVIDENCE for m in MODEL_CLASSES for r in REGIMES)


def bands_path(params_path: str | Path | None = None) -> Path:
    """The bands file that goes with a parameter file: `bands.toml` next to a `params.toml`,
    else `<stem>.bands.toml` next to it (the bundled one for None)."""
    if params_path is None:
        return BANDS_PATH
    path = Path(params_path)
    return path.with_name("bands.toml" if path.name == "params.toml" else f"{path.stem}.bands.toml")


def residuals_path(bands_file: str | Path) -> Path:
    """The residual CSV that goes with a bands file: `<stem>.residuals.csv` next to it."""
    path = Path(bands_file)
    return path.with_name(f"{path.stem}.residuals.csv")


# --- computing bands from residuals ---------------------------------------------------------------


def ratios(residuals: list[dict]) -> np.ndarray:
    """[R, 3] measured / predicted of METRICS per residual row (NaN where either is missing or <= 0)."""
    def column(name: str) -> np.ndarray:
        return np.array([np.nan if r.get(name) in (None, "") else float(r[name]) for r in residuals], dtype=np.float64).reshape(len(residuals))

    out = np.full((len(residuals), len(METRICS)), np.nan)
    for j, m in enumerate(METRICS):
        measured, predicted = column(f"measured_{m}"), column(m)
        ok = (measured > 0) & (predicted > 0)
        out[ok, j] = measured[ok] / predicted[ok]
    return out


def ratio_quantiles(values: np.ndarray) -> np.ndarray:
    """[2, M] the QUANTILES (linear interpolation between order statistics, numpy's default) of
    `values` [R, M] per column, ignoring NaN; NaN for a column without values."""
    values = np.asarray(values, dtype=np.float64).reshape(-1, np.shape(values)[-1])
    out = np.full((len(QUANTILES), values.shape[1]), np.nan)
    for j in range(values.shape[1]):  # over the 3 metrics, not over rows
        finite = values[np.isfinite(values[:, j]), j]
        if finite.size:
            out[:, j] = np.quantile(finite, QUANTILES)
    return out


def pool_keys(key: str) -> tuple[str, ...]:
    """Classes to draw a band from, nearest first: the class, then the same evidence and regime over
    both model classes, then the regime over all evidence, then every row ("*" = any)."""
    evidence, _, regime = key.split("/")
    return key, class_key(evidence, "*", regime), class_key("*", "*", regime), class_key("*", "*", "*")


def _matches(pattern: str, keys: np.ndarray) -> np.ndarray:
    """[R] bool: which class keys [R] a pattern ("*" = any label) takes in."""
    labels = np.array([k.split("/") for k in keys.tolist()], dtype=str).reshape(-1, 3)
    ok = np.ones(len(labels), dtype=bool)
    for j, part in enumerate(pattern.split("/")):
        if part != "*":
            ok &= labels[:, j] == part
    return ok


def _round_outward(values: np.ndarray, *, up: bool, digits: int = 6) -> np.ndarray:
    """`values` rounded to `digits` significant digits away from the band's middle (down for p10, up
    for p90), so that the file's 6-digit numbers still hold the rows a band was stretched to."""
    values = np.asarray(values, dtype=np.float64)
    out = values.copy()
    ok = np.isfinite(values) & (values > 0)
    scale = 10.0 ** (np.floor(np.log10(values[ok])) - (digits - 1))
    out[ok] = (np.ceil if up else np.floor)(np.round(values[ok] / scale, 6)) * scale
    return out


def unseen_model_widening(values: np.ndarray, models: np.ndarray, target: float = 0.8) -> float:
    """The least factor w (a 1% grid from 1 to 10) for which bands from the other models' rows, [p10 / w,
    p90 x w], cover `target` of the rows [R, M] `values` of each model (`models` [R]), pooled over the
    models and the metrics (leave-one-model-out); 1 with fewer than UNSEEN_MIN_MODELS models."""
    names = sorted(set(models.tolist()))
    if len(names) < UNSEEN_MIN_MODELS:
        return 1.0
    ratio_pairs = []  # (the model's ratios [n, M], the others' quantiles [2, M])
    for name in names:
        mine = models == name
        ratio_pairs.append((values[mine], ratio_quantiles(values[~mine])))
    for w in np.round(np.arange(1.0, 10.0, 0.01), 2):
        inside = total = 0
        for mine, q in ratio_pairs:
            finite = np.isfinite(mine) & np.isfinite(q[0])
            inside += int(np.sum(finite & (mine >= q[0] / w) & (mine <= q[1] * w)))
            total += int(np.sum(finite))
        if total and inside >= target * total:
            return float(w)
    return 10.0


def compute_bands(residuals: list[dict], *, min_rows: int = MIN_ROWS, widening: float = SPEC_SHEET_WIDENING) -> dict[str, dict]:
    """Class key -> {"rows": its own held-out rows, "pooled_from": the class the quantiles come from
    (`pool_keys`), "pooled_rows", "stretched" (whether its own rows widened a pooled band),
    "widened" (SPEC_SHEET_WIDENING for spec_sheet classes, times `unseen_model_widening` for an
    unseen-model class with its own rows, else 1), "sources" ("gpu/model/dataset: n"),
    and per metric [p10, p90] ratio quantiles (None without data)}, for every class in ALL_CLASSES.

    residuals: rows with RESIDUAL_COLUMNS (evidence, model_class, regime, measured_* and predicted)."""
    if not residuals:
        raise bad_value("residuals", 0, "no held-out rows to compute bands from; calibrate on measured rows first")
    keys = np.array([class_key(r["evidence"], r["model_class"], r["regime"]) for r in residuals])
    models = np.array([str(r["model"]) for r in residuals])
    values = ratios(residuals)

    def enough(key: str, pool: str) -> bool:
        """Whether `pool` can give `key` its band: MIN_ROWS rows, and an unseen-model class's own rows
        from UNSEEN_MIN_MODELS models (with fewer, nothing says how far a new model falls off)."""
        hit = _matches(pool, keys)
        if hit.sum() < min_rows:
            return False
        return pool != key or "/unseen/" not in key or len(set(models[hit].tolist())) >= UNSEEN_MIN_MODELS

    out = {}
    for key in ALL_CLASSES:
        own = _matches(key, keys)
        source = next((p for p in pool_keys(key) if enough(key, p)), pool_keys(key)[-1])
        pooled = _matches(source, keys)
        q = ratio_quantiles(values[pooled])
        stretched = False
        if source != key and own.any():  # a pooled band must still hold every row of the class itself
            mine = np.where(np.isfinite(values[own]), values[own], np.nan)
            low = np.array([np.min(c[np.isfinite(c)]) if np.isfinite(c).any() else np.nan for c in mine.T])
            high = np.array([np.max(c[np.isfinite(c)]) if np.isfinite(c).any() else np.nan for c in mine.T])
            wider = np.vstack([np.fmin(q[0], low), np.fmax(q[1], high)])
            stretched = bool(np.any(np.nan_to_num(wider) != np.nan_to_num(q)))
            q = wider
        factor = widening if key.startswith("spec_sheet/") else 1.0
        if source == key and "/unseen/" in key:
            factor *= unseen_model_widening(values[own], models[own])
        q = np.vstack([_round_outward(q[0] / factor, up=False), _round_outward(q[1] * factor, up=True)])
        counts: dict[str, int] = {}
        for r in (r for r, hit in zip(residuals, own) if hit):
            label = f"{r['gpu']}/{r['model']}/{r.get('dataset') or '?'}"
            counts[label] = counts.get(label, 0) + 1
        out[key] = {
            "rows": int(own.sum()), "pooled_from": source, "pooled_rows": int(pooled.sum()), "stretched": stretched, "widened": factor,
            "sources": [f"{label}: {n}" for label, n in sorted(counts.items())],
            **{m: None if not np.all(np.isfinite(q[:, j])) else [float(q[0, j]), float(q[1, j])] for j, m in enumerate(METRICS)},
        }  # fmt: skip
    return out


def coverage(residuals: list[dict], bands: dict[str, dict]) -> dict[str, dict[str, float]]:
    """Class key -> metric -> fraction of `residuals` of that class whose measured / predicted lies in
    the class's [p10, p90] (NaN-free rows only); classes without rows are left out."""
    keys = np.array([class_key(r["evidence"], r["model_class"], r["regime"]) for r in residuals])
    values = ratios(residuals)
    out = {}
    for key in sorted(set(keys.tolist())):
        rows = values[keys == key]
        out[key] = {}
        for j, m in enumerate(METRICS):
            finite = rows[np.isfinite(rows[:, j]), j]
            band = bands[key].get(m)
            if finite.size and band:
                out[key][m] = float(np.mean((finite >= band[0]) & (finite <= band[1])))
    return out


# --- the files ------------------------------------------------------------------------------------


def write_bands(bands: dict[str, dict], path: str | Path, record: dict, residuals: list[dict] | None = None) -> Path:
    """The bands TOML: [record] (provenance, fitted_gpus, fitted_models, how the bands were made), then
    one [class."<key>"] table per class; with `residuals`, also their CSV at `residuals_path`."""
    path = Path(path)
    lines = ["# Written by `jaxplan calibrate`: p10/p90 of measured / predicted over held-out rows, per prediction class (docs/uncertainty.md).", "[record]"]
    lines += [f"{key} = {toml_value(value)}" for key, value in record.items()]
    for key in ALL_CLASSES:
        lines.append(f'\n[class."{key}"]')
        for field, value in bands[key].items():
            if value is not None:
                lines.append(f"{field} = {toml_value(value)}")
    path.write_text("\n".join(lines) + "\n")
    if residuals is not None:
        with open(residuals_path(path), "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(RESIDUAL_COLUMNS)
            for r in residuals:
                writer.writerow(["" if r.get(c) is None else (f"{r[c]:.6g}" if isinstance(r[c], float) else r[c]) for c in RESIDUAL_COLUMNS])
    return path


def read_residuals(path: str | Path) -> list[dict]:
    """The residual CSV `write_bands` wrote (numbers as floats, blanks as None)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    numeric = set(RESIDUAL_COLUMNS[7:])
    return [{c: (None if v == "" else float(v)) if c in numeric else v for c, v in r.items()} for r in rows]


@functools.cache
def load_bands(path: str | None = None) -> dict:
    """{"record": ..., "classes": key -> class table} of a bands file (default: the bundled one).
    A PlanError names the file and the fix when it is missing or lacks a class."""
    from jaxplan.specs.loader import read_toml

    target = Path(path) if path else BANDS_PATH
    if not target.exists():
        raise PlanError(f"bands file {str(target)!r} does not exist; `jaxplan calibrate` writes it next to the parameters")
    raw = read_toml(target)
    classes = raw.get("class", {})
    missing = [k for k in ALL_CLASSES if k not in classes]
    if missing:
        raise bad_value(f'class."{missing[0]}"', None, "missing; rewrite the file with jaxplan calibrate", where=str(target))
    return {"record": raw.get("record", {}), "classes": classes}


def bands_for(params_path: str | None = None) -> dict:
    """The bands that go with the selected parameter file (`params_path`, else $JAXPLAN_PARAMS; `bands_path`),
    else the bundled ones (a parameter file of your own without bands of its own borrows the shipped
    calibration's)."""
    from jaxplan.physics.params import selected_path

    chosen = selected_path(params_path)  # --params, else $JAXPLAN_PARAMS: the bands written beside it
    own = bands_path(chosen) if chosen else None
    return load_bands(str(own) if own is not None and own.exists() else None)


# --- applying bands to predictions ----------------------------------------------------------------


def kv_regime(rows: list[dict]) -> np.ndarray:
    """[R] bool: each predicted row's KV cache holds its clients' full contexts: an open loop, or
    kv_cache_tokens (per replica, `predict`'s output) >= min(concurrency, num_prompts) / data_parallel_size
    x (isl + osl), as `calibrate.run.kv_holds_concurrency` decides for measured rows. False where the
    row has no kv_cache_tokens (it does not fit)."""
    def column(name: str, default: float = np.nan) -> np.ndarray:
        return np.array([default if r.get(name) in (None, "") else float(r[name]) for r in rows], dtype=np.float64).reshape(len(rows))

    concurrency = column("concurrency")
    clients = np.fmin(concurrency, column("num_prompts"))  # vllm bench serve runs at most num_prompts clients
    demand = clients / column("data_parallel_size", 1.0) * (column("isl") + column("osl"))
    closed = np.isfinite(concurrency) & (concurrency > 0)
    return ~closed | (column("kv_cache_tokens") >= demand)


def classify(gpus, models, kv_fits, *, fitted_gpus, prior_gpus, fitted_models) -> np.ndarray:
    """[R] class keys "evidence/model/regime" from per-row GPU names [R], canonical model names [R] and
    KV regime [R] bool; fitted_gpus: GPUs whose serving rows the fit saw; prior_gpus: GPUs with kernel
    priors; fitted_models: models whose rows the fit saw."""
    gpus, models = np.asarray(gpus, dtype=str).reshape(-1), np.asarray(models, dtype=str).reshape(-1)
    kv_fits = np.asarray(kv_fits, dtype=bool).reshape(-1)
    evidence = np.where(np.isin(gpus, list(fitted_gpus)), "calibrated", np.where(np.isin(gpus, list(prior_gpus)), "kernel_tables", "spec_sheet"))
    model = np.where(np.isin(models, list(fitted_models)), "seen", "unseen")
    regime = np.where(kv_fits, "kv_fits", "kv_starved")
    return np.char.add(np.char.add(np.char.add(np.char.add(evidence, "/"), model), "/"), regime)


def ratio_table(classes: np.ndarray, bands: dict) -> np.ndarray:
    """[R, 2, M] the (p10, p90) ratio quantiles of METRICS for each row's class (NaN where a class has none)."""
    names, index = np.unique(np.asarray(classes, dtype=str).reshape(-1), return_inverse=True)
    table = np.full((len(names), 2, len(METRICS)), np.nan)
    for c, name in enumerate(names):
        entry = bands["classes"].get(name, {})
        for j, m in enumerate(METRICS):
            if entry.get(m):
                table[c, :, j] = entry[m]
    return table[index.reshape(-1)]


def _canonical_models(rows: list[dict]) -> list[str]:
    from jaxplan.specs import load_model

    @functools.cache
    def name(value: str) -> str:
        try:
            return load_model(value).name
        except PlanError:
            return value

    return [name(str(r.get("model") or "")) for r in rows]


# A bundled GPU whose measured rows the calibration fits under another name (the rows give its memory and
# bandwidth as overrides, docs/data.md): its predictions are in that GPU's evidence class.
ROWS_FITTED_AS = {"a100_sxm_40gb": "a100_sxm"}


def band_arrays(gpus, models, kv_fits, values, bands: dict, prior_gpus=()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low [R, M], high [R, M], classes [R]) for predictions `values` [R, M] of METRICS (in any unit:
    the bands are ratios; NaN stays NaN) of rows on GPUs `gpus` [R], canonical model names `models`
    [R], KV regime `kv_fits` [R] bool. bands: `load_bands`' dict, whose record names the fitted GPUs,
    models and the GPUs with kernel priors (`prior_gpus` adds to them). What a sweep table or a
    winner-vs-runner-up comparison calls directly."""
    record = bands["record"]
    gpus = [ROWS_FITTED_AS.get(g, g) for g in np.asarray(gpus, dtype=str).reshape(-1).tolist()]
    classes = classify(
        gpus, models, kv_fits, fitted_gpus=record.get("fitted_gpus", []),
        prior_gpus=set(record.get("prior_gpus", [])) | set(prior_gpus), fitted_models=record.get("fitted_models", []),
    )  # fmt: skip
    q = ratio_table(classes, bands)  # [R, 2, M]
    values = np.asarray(values, dtype=np.float64).reshape(len(classes), len(METRICS))
    return values * q[:, 0, :], values * q[:, 1, :], classes


def with_bands(predicted: list[dict], params_path: str | None = None, bands: dict | None = None) -> list[dict]:
    """`predicted` rows (predict's output columns) with COLUMNS added: each metric's p10 and p90 (None
    where the prediction is None) and the row's class. A class starting "spec_sheet" is a GPU priced
    from its spec sheet alone. bands: `load_bands`' dict (default: `bands_for(params_path)`); the
    parameter file's [prior.<gpu>] tables count as kernel tables too."""
    if not predicted:
        return []
    bands = bands if bands is not None else bands_for(params_path)
    values = np.array([[np.nan if r.get(m) is None else float(r[m]) for m in METRICS] for r in predicted], dtype=np.float64).reshape(len(predicted), len(METRICS))
    low, high, classes = band_arrays(
        [str(r.get("gpu") or "") for r in predicted], _canonical_models(predicted), kv_regime(predicted), values, bands, prior_gpus=load_priors(params_path),
    )  # fmt: skip
    ok = np.isfinite(low) & np.isfinite(high)
    out = []
    for i, row in enumerate(predicted):
        cells = {}
        for j, m in enumerate(METRICS):
            cells[f"{m}_p10"], cells[f"{m}_p90"] = (float(low[i, j]), float(high[i, j])) if ok[i, j] else (None, None)
        out.append({**row, **cells, CLASS_COLUMN: str(classes[i])})
    return out


__all__ = [
    "ALL_CLASSES", "BAND_COLUMNS", "band_arrays", "BANDS_PATH", "CLASS_COLUMN", "COLUMNS", "METRICS", "MIN_ROWS", "QUANTILES", "SPEC_SHEET_WIDENING",
    "bands_for", "bands_path", "classify", "compute_bands", "coverage", "kv_regime", "load_bands", "ratio_quantiles",
    "ratio_table", "read_residuals", "residuals_path", "with_bands", "write_bands",
]  # fmt: skip
