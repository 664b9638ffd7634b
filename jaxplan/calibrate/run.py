"""`jaxplan calibrate`: kernel priors, the per-GPU fit, held-out accuracy, and the shipped TOML.

Held-out accuracy: for each GPU with serving rows, one shared parameter vector is
fitted on the other GPUs' rows (and their kernel priors) and evaluated on the
held-out GPU's rows, so the reported error is that of a fit that never saw the
evaluated GPU. Other backends (SGLang, TRT-LLM) are reported with the final fit
as out-of-sample checks.
"""

from __future__ import annotations

import datetime
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.calibrate import fit
from jaxplan.calibrate.metrics import mape, spearman
from jaxplan.physics.memory import kv_blocks_per_replica
from jaxplan.physics.params import BOUNDS, DEFAULTS, PARAMS_PATH
from jaxplan.physics.shapes import hardware_table, take
from jaxplan.predict import DEFAULT_GPU_MEMORY_UTILIZATION, predict_rows, row_batches
from jaxplan.specs import known

FIT_BACKEND = "vllm"
KV_BLOCK_TOKENS = 16  # vLLM's default block size


def _usable(rows: list[dict]) -> list[dict]:
    """Rows the physics can price: the jaxplan GPU as specified (no HBM overrides), TTFT and TPOT measured."""
    return [
        r for r in rows
        if r.get("measured_ttft_ms_mean") and r.get("measured_tpot_ms_mean")
        and not r.get("gpu_hbm_bytes_override") and not r.get("gpu_hbm_bandwidth_bytes_per_s_override")
    ]


def kv_holds_concurrency(rows: list[dict], efficiency: dict[str, dict[str, float]]) -> list[bool]:
    """Per row: can each replica's KV cache hold its share of the clients' full contexts
    (concurrency / dp x (ISL + OSL) tokens)? Where it cannot, vLLM admits on prompt blocks
    and preempts later, and the measured TTFT depends on how long the benchmark ran
    (`num_prompts`), which the shared data does not state."""
    fits = [True] * len(rows)
    for batch in row_batches(rows, source="measurements"):
        hw = take(hardware_table(batch.gpus, {g.name: efficiency[g.name] for g in batch.gpus}), jnp.asarray(batch.gpu_index))
        tokens = np.asarray(kv_blocks_per_replica(batch.model, hw, batch.layout, DEFAULT_GPU_MEMORY_UTILIZATION)) * KV_BLOCK_TOKENS
        w = batch.workload
        demand = np.asarray(w.concurrency) / np.asarray(batch.layout.data_parallel_size) * (np.asarray(w.isl_tokens) + np.asarray(w.osl_tokens))
        closed = np.asarray(w.arrival_code) == 2
        for k, i in enumerate(batch.row_ids):
            fits[i] = bool(not closed[k] or tokens[k] >= demand[k])
    return fits


def accuracy(rows: list[dict], params: dict[str, dict[str, float]]) -> dict:
    """MAPE of TTFT and TPOT, Spearman of output throughput, for rows predicted with `params`;
    the same again under "kv_fits" for the rows whose KV cache holds the clients' contexts."""
    if not rows:
        return {"rows": 0}
    complete = {g: {**DEFAULTS, **values} for g, values in params.items()}
    out = _accuracy(rows, complete)
    fits = kv_holds_concurrency(rows, complete)
    if 0 < sum(fits) < len(rows):
        out["kv_fits"] = _accuracy([r for r, f in zip(rows, fits) if f], complete)
    return out


def _accuracy(rows: list[dict], complete: dict[str, dict[str, float]]) -> dict:
    predicted = predict_rows(rows, source="measurements", efficiency=complete)
    out = {"rows": len(rows)}
    for key, measured_key in (("ttft", "measured_ttft_ms_mean"), ("tpot", "measured_tpot_ms_mean")):
        pairs = [(p[f"{key}_ms_mean"], p[measured_key]) for p in predicted if p.get(measured_key)]
        if pairs:
            out[f"{key}_mape"] = mape(*zip(*pairs))
    pairs = [(p["output_tok_s"], p["measured_output_tok_s"]) for p in predicted if p.get("measured_output_tok_s")]
    if len(pairs) >= 3:
        out["throughput_mape"] = mape(*zip(*pairs))
        out["throughput_spearman"] = spearman(*zip(*pairs))
    return out


def calibrate(rows: list[dict], *, data_root=None, steps: int = fit.STEPS, log=print) -> tuple[dict, dict]:
    """(params per GPU, report). `rows` are normalized serving rows (see calibrate.rows)."""
    t0 = time.perf_counter()
    gpus = known("gpus")
    priors = {g: fit.kernel_priors(g, data_root) for g in gpus}
    log(f"kernel priors for {len(gpus)} GPUs in {time.perf_counter() - t0:.1f} s")
    fit_rows = _usable([r for r in rows if r.get("backend") == FIT_BACKEND])
    fitted_gpus = sorted({r["gpu"] for r in fit_rows})
    params = {g: dict(priors[g]) for g in gpus}
    report: dict = {"fit_backend": FIT_BACKEND, "fit_rows": len(fit_rows), "held_out": {}, "in_sample": {}, "other_backends": {}}
    if fitted_gpus:
        data = fit.fit_data(fit_rows, fitted_gpus)
        prior = np.stack([fit.free_vector(priors[g]) for g in fitted_gpus])
        z, loss = fit.fit_serving(data, fitted_gpus, prior, steps=steps)
        for g, vector in zip(fitted_gpus, z):
            params[g].update(fit.values_of(vector))
        shared = fit.values_of(z.mean(axis=0))
        for g in gpus:  # GPUs without serving rows: kernel priors for hardware, shared fit for the runtime
            if g not in fitted_gpus:
                params[g].update({k: shared[k] for k in ("step_overhead_s", "per_seq_overhead_s", "request_overhead_s", "closed_loop_sync_fraction", "layer_latency_s")})
        report["in_sample"] = {g: accuracy([r for r in fit_rows if r["gpu"] == g], params) for g in fitted_gpus}
        report["final_loss"] = loss
        log(f"per-GPU fit on {len(fit_rows)} {FIT_BACKEND} rows ({', '.join(fitted_gpus)}) in {time.perf_counter() - t0:.1f} s")
        for held in fitted_gpus if len(fitted_gpus) > 1 else []:
            train_gpus = [g for g in fitted_gpus if g != held]
            train = [r for r in fit_rows if r["gpu"] in train_gpus]
            z_shared, _ = fit.fit_serving(fit.fit_data(train, train_gpus), train_gpus, np.stack([fit.free_vector(priors[g]) for g in train_gpus]), shared=True, steps=steps)
            held_params = {g: dict(priors[g]) for g in gpus}
            held_params[held].update(fit.values_of(z_shared[0]))
            held_rows = [r for r in fit_rows if r["gpu"] == held]
            report["held_out"][held] = accuracy(held_rows, held_params)
            for model in sorted({r["model"] for r in held_rows}):
                report["held_out"][f"{held}/{model}"] = accuracy([r for r in held_rows if r["model"] == model], held_params)
            log(f"held out {held}: {report['held_out'][held]}")
    for backend in sorted({r.get("backend") for r in rows} - {FIT_BACKEND}):
        other = [r for r in _usable(rows) if r.get("backend") == backend]
        report["other_backends"][backend] = accuracy(other, params)
    report["seconds"] = time.perf_counter() - t0
    return params, report


def _fmt(value: float) -> str:
    return f"{value:.6g}"


def write_params(params: dict[str, dict[str, float]], path: Path, record: dict) -> Path:
    """The calibration TOML: [record] provenance, then one [gpu.<name>] table per GPU."""
    lines = ["# Written by `jaxplan calibrate`; efficiencies are fractions of spec-sheet peaks, latencies in seconds.", "[record]"]
    for key, value in record.items():
        lines.append(f"{key} = {_toml_value(value)}")
    for gpu in sorted(params):
        lines.append(f"\n[gpu.{gpu}]")
        for field in BOUNDS:
            value = params[gpu].get(field, DEFAULTS[field])
            lines.append(f"{field} = {_fmt(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _toml_value(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _fmt(value) if math.isfinite(value) else '"inf"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return _toml_value(str(value))


def provenance(rows: list[dict], report: dict, sources: list[str]) -> dict:
    datasets = sorted({r.get("dataset", "?") for r in rows})
    return {
        "date": datetime.date.today().isoformat(),
        "command": "jaxplan calibrate",
        "jax_version": jax.__version__,
        "data": sources,
        "datasets": datasets,
        "fit_backend": report["fit_backend"],
        "fit_rows": report["fit_rows"],
        "final_loss": report.get("final_loss", float("nan")),
    }


def default_output() -> Path:
    return PARAMS_PATH
