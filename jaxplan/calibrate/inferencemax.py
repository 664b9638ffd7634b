"""InferenceMAX v1 vLLM runs on AMD GPUs (`<data_root>/inferencemax_amd/`), as predict-CSV rows.

Source: SemiAnalysis InferenceMAX nightly sweeps of October 2025 (see the folder's SOURCE.txt): vLLM
0.10.1 in AMD's ROCm 7.0 image, single node, TP only, a closed loop of `concurrency` clients sending
`10 x concurrency` prompts of random lengths uniform in [0.8 L, L] (mean 0.9 L) with ignore_eos.

Engine settings are inputs of each row, read from the data where it states them: max_num_seqs,
max_num_batched_tokens and the KV cache dtype from the CSV's columns; gpu_memory_utilization and
block_size from the launch flags SOURCE.txt transcribes (`ENGINE_FLAGS`, by checkpoint); where the
flags do not set one, vLLM 0.10.1's default on ROCm (docs/data.md).

Repeats: the same configuration was measured on several nights (and runners). By default the loader
returns one row per configuration with the mean of its repeats (the notes give how many and the
TTFT/TPOT spread); `repeats=True` returns every measurement.
"""

from __future__ import annotations

import csv
import functools
import statistics
from collections import Counter
from pathlib import Path

from jaxplan.calibrate._data import require_file, resolve_root
from jaxplan.calibrate.rows import make_row

INFERENCEMAX_AMD = "inferencemax_amd"
CSV_PATH = Path(INFERENCEMAX_AMD) / "inferencemax_amd_vllm.csv"

# Checkpoint -> (bundled model, launch flags as SOURCE.txt transcribes them from upstream's
# benchmarks/*.sh). Llama-3.3-70B has the Llama-3.1-70B architecture.
ENGINE_FLAGS = {
    "amd/llama-3.3-70b-instruct-fp8-kv": ("llama-3.1-70b", {"gpu_memory_utilization": 0.94}),
    "openai/gpt-oss-120b": ("gpt-oss-120b", {"block_size": 64}),
}
# MoE checkpoints: their rows are scored with the other MoE rows (`moe_rows.load_moe_rows`), never fitted.
MOE_CHECKPOINTS = frozenset({"openai/gpt-oss-120b"})
# vLLM 0.10.1's values where the flags leave a setting out (EngineArgs / CacheConfig defaults; the
# ROCm platform keeps the 16-token block for models without MLA).
VLLM_DEFAULTS = {"gpu_memory_utilization": 0.9, "block_size": 16}
GPU_LABELS = {"mi300x": "mi300x", "mi325x": "mi325x", "mi355x": "mi355x"}
# The benchmark client draws each length uniformly in [RANGE_RATIO x L, L] (--random-range-ratio 0.8).
RANGE_RATIO = 0.8
LENGTH_MEAN_FRACTION = (1.0 + RANGE_RATIO) / 2.0
# Uniform spread as a workload file gives it (mean +- spread x mean): half the range over the mean.
LENGTH_SPREAD = (1.0 - RANGE_RATIO) / 2.0 / LENGTH_MEAN_FRACTION
CONFIG_COLUMNS = ("model", "gpu", "weight_dtype", "kv_cache_dtype", "tensor_parallel_size", "isl", "osl", "concurrency", "max_num_seqs", "max_num_batched_tokens")


def _float(text: str) -> float | None:
    return float(text) if text not in ("", None) else None


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _spread(values) -> float:
    """(max - min) / mean of a repeat group's values, 0 for one value."""
    return (max(values) - min(values)) / statistics.fmean(values) if len(values) > 1 else 0.0


def _drop_reason(raw: dict, moe: bool) -> str | None:
    """Why the dense loader (moe=False) or the MoE one (moe=True) leaves a CSV row out; None: it keeps it."""
    if raw["backend"] != "vllm":
        return f"backend {raw['backend']}"
    if raw["gpu"] not in GPU_LABELS:
        return f"GPU {raw['gpu']} is not a jaxplan GPU"
    checkpoint = raw["model"].lower()
    if checkpoint not in ENGINE_FLAGS:
        return f"{raw['model']} ({raw['weight_dtype']} weights): " + (
            "MXFP4 in every layer of a dense model is not modeled (jaxplan's mxfp4 is a MoE model's experts)" if raw["weight_dtype"] == "mxfp4" else "not a calibration model")
    if (checkpoint in MOE_CHECKPOINTS) != moe:
        return "a MoE model: scored with the MoE rows (moe_rows), not fitted" if not moe else "a dense model: in the dense loader"
    if raw["pipeline_parallel_size"] not in ("", "1") or raw["data_parallel_size"] not in ("", "1"):
        return "not pure tensor parallel"
    return None


def _row(group: list[dict]) -> dict:
    """One predict row from a group of repeat measurements of one configuration."""
    first = group[0]
    model, flags = ENGINE_FLAGS[first["model"].lower()]
    settings = {**VLLM_DEFAULTS, **flags}
    isl, osl = (float(first[side]) * LENGTH_MEAN_FRACTION for side in ("isl", "osl"))
    ttfts = [float(r["ttft_ms_mean"]) for r in group]
    tpots = [float(r["tpot_ms_mean"]) for r in group]
    output = _mean(_float(r["output_tok_s"]) for r in group)
    derived = output is None  # older artifacts have only the total (input + output) throughput
    if derived:
        output = _mean(float(r["total_tok_s"]) for r in group) * osl / (isl + osl)
    runs = sorted({r["source_run_id"] for r in group})
    notes = [
        f"vLLM {first['backend_version']}", f"mean of {len(group)} nightly run(s) (TTFT spread {_spread(ttfts):.0%}, TPOT {_spread(tpots):.0%})",
        f"nominal {first['isl']}/{first['osl']}, lengths ~U[{RANGE_RATIO:g} L, L]",
        f"gpu_memory_utilization {settings['gpu_memory_utilization']:g}" + ("" if "gpu_memory_utilization" in flags else " (vLLM default)"),
        f"block_size {settings['block_size']}" + ("" if "block_size" in flags else " (vLLM default)"),
    ]
    if derived:
        notes.append("output tok/s derived from the total tok/s x osl / (isl + osl)")
    return make_row(
        model=model, gpu=GPU_LABELS[first["gpu"]], tensor_parallel_size=int(first["tensor_parallel_size"]),
        pipeline_parallel_size=1, data_parallel_size=1, weight_dtype=first["weight_dtype"], kv_cache_dtype=first["kv_cache_dtype"] or "auto",
        isl=isl, osl=osl, isl_distribution="uniform", isl_spread=LENGTH_SPREAD, osl_distribution="uniform", osl_spread=LENGTH_SPREAD,
        concurrency=int(first["concurrency"]), num_prompts=int(first["num_prompts"]),
        max_num_seqs=int(first["max_num_seqs"]) if first["max_num_seqs"] else None,
        max_num_batched_tokens=int(first["max_num_batched_tokens"]) if first["max_num_batched_tokens"] else None,
        gpu_memory_utilization=settings["gpu_memory_utilization"], block_size=settings["block_size"],
        measured_ttft_ms_mean=statistics.fmean(ttfts), measured_tpot_ms_mean=statistics.fmean(tpots),
        measured_ttft_ms_p99=_mean(_float(r["ttft_ms_p99"]) for r in group), measured_tpot_ms_p99=_mean(_float(r["tpot_ms_p99"]) for r in group),
        measured_output_tok_s=output, measured_output_tok_s_derived=derived,
        dataset=INFERENCEMAX_AMD, backend="vllm",
        source_id=f"{first['gpu']}:tp{first['tensor_parallel_size']}:{first['isl']}x{first['osl']}:c{first['concurrency']}:runs" + "+".join(runs),
        notes="; ".join(notes),
    )


@functools.cache
def _inferencemax(root: Path, repeats: bool, moe: bool = False) -> tuple[tuple[dict, ...], tuple]:
    with open(require_file(root / CSV_PATH), newline="") as handle:
        raws = list(csv.DictReader(handle))
    dropped, groups = Counter(), {}
    for raw in raws:
        reason = _drop_reason(raw, moe)
        if reason:
            dropped[reason] += 1
            continue
        key = tuple(raw[c] for c in CONFIG_COLUMNS)
        groups.setdefault(key if not repeats else (*key, len(groups)), []).append(raw)
    return tuple(_row(group) for group in groups.values()), tuple(sorted(dropped.items()))


def inferencemax_rows(root: Path, repeats: bool = False) -> tuple[tuple[dict, ...], tuple]:
    """(rows, (reason, rows dropped) pairs) of the InferenceMAX AMD vLLM runs under `root` (resolved)."""
    return _inferencemax(root, repeats)


def load_inferencemax_rows(data_root: str | Path | None = None, *, repeats: bool = False) -> list[dict]:
    """The InferenceMAX AMD vLLM rows of dense models jaxplan can model (Llama-3.3-70B FP8 on MI300X and
    MI355X): one per configuration, the mean of its repeat runs (repeats=True: one per measurement)."""
    rows, _ = inferencemax_rows(resolve_root(data_root).resolve(), repeats)
    return [dict(row) for row in rows]


def inferencemax_moe_rows(root: Path) -> tuple[tuple[dict, ...], tuple]:
    """(rows, (reason, rows dropped) pairs) of the MoE runs (gpt-oss-120b, its MXFP4 checkpoint, TP only,
    on MI300X and MI355X) under `root` (resolved), one per configuration: `moe_rows` scores them."""
    return _inferencemax(root, False, moe=True)
