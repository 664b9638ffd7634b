"""End-to-end serving measurements, normalized to the predict-CSV row format (see `rows.py`).

Sources under `<data_root>` (each folder has a SOURCE.txt):
  e2e_aiconfigurator_silicon/silicon_calibration.csv   NVIDIA AIConfigurator "silicon" rows (agg mode)
  trtllm_perf_overview/*.csv                           TensorRT-LLM published perf tables
  vllm_a100_tp_vs_pp/serving_summary.csv               vLLM benchmark_serving on Azure A100 40GB
  inferencemax_amd/inferencemax_amd_vllm.csv           InferenceMAX vLLM runs on MI300X / MI355X (`inferencemax.py`)
Not normalized (do not map onto TP/PP/DP rows; the evidence is in docs/data.md):
  qwen35_27b_b200_scaling (one "total tok/s" per run and no TTFT; MTP-1 speculative decoding with an
    unstated acceptance rate; client counts stated for one run only; the single-node steps approximate),
  mlperf_inference_llm (no parallelism / batch settings, vendor-tuned, variable-length data sets).

Every loader returns a fresh list of row dicts; parsing is cached per data
root. `serving_drop_counts` says which source rows were left out and why.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from jaxplan.calibrate._data import require_file, resolve_root
from jaxplan.calibrate.inferencemax import INFERENCEMAX_AMD, inferencemax_rows
from jaxplan.calibrate.rows import (
    COLUMNS,
    ServingArrays,
    check_row,
    make_row,
    parse_bool,
    read_predict_csv,
    serving_arrays,
    write_predict_csv,
)
from jaxplan.errors import PlanError, bad_value, short_repr
from jaxplan.specs import load_gpu, load_model
from jaxplan.specs.lengths import json_records

SILICON = "aiconfigurator_silicon"
TRTLLM = "trtllm_perf_overview"
VLLM_A100 = "vllm_a100_tp_vs_pp"
DATASETS = (SILICON, TRTLLM, VLLM_A100, INFERENCEMAX_AMD)

# Source model labels (lower case) that jaxplan's alias table does not know -> bundled model.
# Llama-3.3-70B has the Llama-3.1-70B architecture; DeepSeek-R1 / V3.1 have the DeepSeek-V3 architecture.
MODEL_LABELS = {
    "llama v3.1 70b": "llama-3.1-70b",
    "llama 3.1 70b": "llama-3.1-70b",
    "llama 3.3 70b": "llama-3.1-70b",
    "llama-3.3-70b": "llama-3.1-70b",
    "nvidia/llama-3.3-70b-instruct-fp8": "llama-3.1-70b",
    "llama v3.1 8b": "llama-3.1-8b",
    "llama 3.1 8b": "llama-3.1-8b",
    "nvidia/llama-3.1-8b-instruct-fp8": "llama-3.1-8b",
    "mixtral 8x7b": "mixtral-8x7b",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    "deepseek-ai/deepseek-r1": "deepseek-v3",  # bundled as deepseek-r1 too; its rows calibrate deepseek-v3
    "deepseek-r1-0528": "deepseek-v3",
    "nvidia/deepseek-r1-nvfp4": "deepseek-v3",
    "nvidia/deepseek-v3.1-nvfp4": "deepseek-v3",
    "nvidia/qwen3-32b-nvfp4": "qwen3-32b",
}
# Source GPU labels (lower case) -> jaxplan GPU. Unlisted (GH200, GB200, GB300, B300, RTX PRO 6000) are dropped.
GPU_LABELS = {
    "h100_sxm": "h100_sxm",
    "h200_sxm": "h200_sxm",
    "b200_sxm": "b200_sxm",
    "h100": "h100_sxm",
    "h200": "h200_sxm",
    "b200": "b200_sxm",
    "h100 80gb hbm3": "h100_sxm",
    "h200 141gb hbm3": "h200_sxm",
    "h200 131gb hbm3": "h200_sxm",  # as printed in the TRT-LLM 0.14 online table
    "a100-sxm4-80gb": "a100_sxm",
    "l40s": "l40s",
}
# Requests per trtllm-bench run, by (isl, osl): TensorRT-LLM docs/source/performance/perf-overview.md
# @258c7540 (v0.17) and @00f37686 (v1.0, adds 1000/2000), docs/source/developer-guide/perf-overview.md @03e27c7d.
TRTLLM_NUM_REQUESTS = {
    (128, 128): 30000,
    (128, 2048): 3000,
    (128, 4096): 1500,
    (500, 2000): 3000,
    (1000, 1000): 3000,
    (1000, 2000): 1500,
    (2048, 128): 3000,
    (2048, 2048): 1500,
    (5000, 500): 1500,
    (20000, 2000): 1000,
    (1024, 1024): 3000,
    (8192, 1024): 1500,
    (1024, 8192): 1500,
    (32768, 1024): 1000,
    (1024, 32768): 1000,
}
# Azure ND96asr_v4 GPUs are A100-SXM4-40GB: 40 GiB HBM2 at 1.555 TB/s (NVIDIA A100 datasheet figures, quoted e.g.
# at glennklockwood.com/garden/processors/A100); jaxplan's a100_sxm is the 80 GB part (2.039 TB/s).
A100_40GB_HBM_BYTES = 40 * 1024**3
A100_40GB_HBM_BANDWIDTH_BYTES_PER_S = 1.555e12
# The runs pass no batching flags, so vLLM 0.8.3 took its A100 defaults (`engine_defaults`): 2,048
# tokens a step and 256 sequences. TP4 x PP2 ran on the V0 engine (docs/accuracy.md, "Layout order"),
# which runs one scheduler per virtual engine (PP of them), each with its own max_num_seqs and token
# budget and 1 / PP of the KV blocks: PP x 256 sequences in flight, as the rows state.
A100_0_8_BATCHED_TOKENS, A100_0_8_SEQS_PER_SCHEDULER = 2048, 256
PREFIX_BLOCK_TOKENS = 16  # vLLM's default KV block: the prefix cache hits whole blocks


def _coefficient_of_variation(lengths: list) -> float | None:
    """Standard deviation over mean (population form) of a run's token counts >= 1 (failed requests'
    0 left out); None unless there are two or more plain numbers."""
    values = [float(v) for v in lengths if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 1]
    return float(np.std(values) / np.mean(values)) if len(values) > 1 else None


def cached_prompt_fraction(input_lens: list[int], block_tokens: int = PREFIX_BLOCK_TOKENS) -> float:
    """Fraction of the prompt tokens vLLM's prefix cache serves when every prompt was seen before: the
    whole blocks before each prompt's last token (which is always recomputed), over all prompt tokens."""
    return sum((n - 1) // block_tokens * block_tokens for n in input_lens) / sum(input_lens)


# The bundled models whose measured rows the calibration takes. Models bundled for planning only
# (gpt-oss, MiniMax-M2.5, Qwen3-235B-A22B, Kimi-K2.5, DeepSeek-R1 by its own name) stay out, so that
# bundling a spec does not change the calibration data; adding one here is a calibration change.
CALIBRATION_MODELS = frozenset({
    "llama-3.1-8b", "llama-3.1-70b", "qwen3-32b", "gemma-3-27b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "qwen3.5-27b",
})


def map_model(label: str) -> str | None:
    """Bundled jaxplan model for a source label (HF id, alias or table name) among CALIBRATION_MODELS, or None."""
    key = label.strip().lower()
    key = MODEL_LABELS.get(key, key)
    try:
        name = load_model(key).name
    except PlanError:
        return None
    return name if name in CALIBRATION_MODELS else None


def map_gpu(label: str) -> str | None:
    return GPU_LABELS.get(label.strip().lower())


def _read_csv(path: Path) -> list[dict]:
    with open(require_file(path), newline="") as handle:
        return list(csv.DictReader(handle))


def _derived_output_tok_s(concurrency: float, osl: float, ttft_ms: float, tpot_ms: float) -> float:
    """Closed-loop output tokens/s if every request takes ttft + (osl - 1) * tpot."""
    return concurrency * osl / ((ttft_ms + (osl - 1.0) * tpot_ms) * 1e-3)


# --- (a) AIConfigurator silicon ---------------------------------------------------------------------

# The silicon rows do not state how many requests each run sent. AIConfigurator's own benchmark
# runners send 10 per client: `genai-perf ... --request-count concurrency x 10` (after 2 x concurrency
# warm-up requests) in src/aiconfigurator/eval/benchmarks/genai_perf_runner.py, and `num_prompts =
# concurrency x 10` ("matches genai-perf scale: ~10 requests per active user") in
# bench_serving_runner.py (github.com/ai-dynamo/aiconfigurator). A closed loop's first wave, whose
# clients start together, is 1 / 10 of such a run; the replay's mean TTFT depends on it.
SILICON_REQUESTS_PER_CLIENT = 10


# Nor do they state the KV cache dtype. AIConfigurator pairs an FP8 GEMM with an FP8 KV cache, and its
# generator passes its KV quantisation to every backend (module_bridge.py: kvcache_quant_mode ->
# kv_cache_dtype; config/backend_config_mapping.yaml: vLLM and SGLang `--kv-cache-dtype`, TRT-LLM
# `kv_cache_config.dtype`). The rows say so too: with a BF16 cache, 6 of the 120 vLLM Llama-3.1-70B rows
# cannot hold their clients' contexts and would queue for seconds to minutes where 0.4-40 s was measured
# (H200 TP1 8192/1024 at 32 clients: 32 s with BF16 KV, 3.1 s with FP8, 3.1 s measured; B200 TP1
# 1024/8192 at 64 clients: 18 s replayed with BF16, 0.36 s with FP8, 0.38 s measured).
# NVFP4 checkpoints come with an FP8 KV cache as well (ModelOpt's `kv_cache_quant_algo: FP8`, and
# AIConfigurator's NVFP4 configurations pair `gemm_quant_mode nvfp4` with `kvcache_quant_mode fp8`).
def silicon_kv_cache_dtype(weight_dtype: str) -> str:
    """The KV cache dtype assumed for a silicon row: FP8 with FP8 or NVFP4 weights, else `auto`."""
    return "fp8" if weight_dtype in ("fp8", "nvfp4") else "auto"


def silicon_weight_dtype(precision: str, gemm_quant_mode: str) -> str | None:
    """jaxplan's weight dtype of a silicon row (blank precision: bf16), or None where it is not
    modeled (int4, FP4 other than NVFP4)."""
    if precision in ("", "bf16", "fp8"):
        return precision or "bf16"
    if precision == "fp4" and gemm_quant_mode == "nvfp4":
        return "nvfp4"
    return None


SILICON_CSV = Path("e2e_aiconfigurator_silicon") / "silicon_calibration.csv"


@functools.cache
def silicon_source(root: Path) -> tuple[dict, ...]:
    """The silicon CSV's rows as read (one read per data root; dense and MoE loaders share it; do not
    modify the dicts)."""
    return tuple(_read_csv(root / SILICON_CSV))


def silicon_run_left_out(raw: dict) -> str | None:
    """Why a silicon run is left out whatever its model: disaggregated serving, or marked work in
    progress by its source; None if kept."""
    if raw["mode"] != "agg":
        return "disagg mode (separate prefill/decode workers)"
    if "wip=True" in raw["silicon_data_source"]:
        return "marked wip=True"
    return None


@functools.cache
def _silicon(root: Path) -> tuple[tuple[dict, ...], tuple]:
    dropped = Counter()
    rows, seen = [], set()
    for raw in silicon_source(root):
        if reason := silicon_run_left_out(raw):
            dropped[reason] += 1
            continue
        gpu = map_gpu(raw["system"])
        if gpu is None:
            dropped[f"GPU {raw['system']} is not a calibrated jaxplan GPU"] += 1
            continue
        model = map_model(raw["model_path"])
        if model is None:
            dropped[f"model {raw['model_path']} is not a calibrated jaxplan model"] += 1
            continue
        precision = silicon_weight_dtype(raw["precision"], raw["gemm_quant_mode"])
        if precision is None:
            dropped[f"precision {raw['precision']} / {raw['gemm_quant_mode']} (jaxplan models bf16, fp8 and nvfp4 weights)"] += 1
            continue
        tp = int(raw["tp_size"])
        if raw["pp_size"] not in ("", "1"):
            dropped["pipeline parallel"] += 1
            continue
        if raw["attention_dp_size"] not in ("", "1"):
            dropped["attention data parallel (DEP)"] += 1
            continue
        if load_model(model).num_experts and (raw["moe_ep_size"] not in ("", "1") or raw["moe_tp_size"] != raw["tp_size"]):
            dropped["MoE expert parallel (moe_ep_size > 1 or moe_tp != tp)"] += 1
            continue
        if tp > load_gpu(gpu).gpus_per_node:
            dropped["tensor parallel across nodes"] += 1
            continue
        key = (model, gpu, raw["backend"], precision, tp, raw["isl"], raw["osl"], raw["batch_size"], raw["silicon_ttft_ms"], raw["silicon_tpot_ms"])
        if key in seen:
            dropped["exact duplicate of another row (same config and values, different id)"] += 1
            continue
        seen.add(key)
        concurrency = int(raw["batch_size"])
        isl, osl = float(raw["isl"]), float(raw["osl"])
        ttft, tpot = float(raw["silicon_ttft_ms"]), float(raw["silicon_tpot_ms"])
        kv_dtype = silicon_kv_cache_dtype(precision)
        notes = [f"{raw['backend']} {raw['backend_version'] or '(version not given)'}", f"gemm_quant_mode={raw['gemm_quant_mode'] or '-'}", f"kv dtype not stated ({kv_dtype} assumed)", "TTFT/TPOT statistic (mean vs median) not stated",
                 f"request count not stated: {SILICON_REQUESTS_PER_CLIENT} x concurrency assumed (AIConfigurator's own benchmark runners)"]
        if not raw["precision"]:
            notes.append("precision blank in source: bf16 assumed")
        rows.append(
            make_row(
                model=model, gpu=gpu, tensor_parallel_size=tp, pipeline_parallel_size=1, data_parallel_size=1,
                weight_dtype=precision, kv_cache_dtype=kv_dtype, isl=isl, osl=osl, concurrency=concurrency,
                num_prompts=SILICON_REQUESTS_PER_CLIENT * concurrency, measured_ttft_ms_mean=ttft, measured_tpot_ms_mean=tpot,
                measured_output_tok_s=_derived_output_tok_s(concurrency, osl, ttft, tpot), measured_output_tok_s_derived=True,
                dataset=SILICON, backend=raw["backend"], source_id=raw["id"], notes="; ".join(notes),
            )
        )
    return tuple(rows), tuple(sorted(dropped.items()))


# --- (b) TensorRT-LLM perf overview -----------------------------------------------------------------


def _trtllm_offline_row(file_stem, model, gpu, precision, tp, pp, isl, osl, tput, notes, dropped):
    """One offline max-throughput row (all requests queued at once) or None (reason counted)."""
    weight = {"FP8": "fp8", "FP4": "nvfp4", "FP16": "bf16", "BF16": "bf16"}.get(precision)  # TRT-LLM's FP4 is NVFP4
    if weight is None:
        dropped[f"{file_stem}: precision {precision}"] += 1
        return None
    num_requests = TRTLLM_NUM_REQUESTS.get((int(isl), int(osl)))
    extra = ["FP16 engine mapped to bf16 (same bytes and tensor-core rate)"] if precision == "FP16" else []
    return make_row(
        model=model, gpu=gpu, tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=1,
        weight_dtype=weight, kv_cache_dtype=silicon_kv_cache_dtype(weight), isl=float(isl), osl=float(osl),
        request_rate=math.inf, num_prompts=num_requests, measured_output_tok_s=float(tput),
        dataset=TRTLLM, backend="trtllm", source_id=f"{file_stem}:{model}:{gpu}:tp{tp}pp{pp}:{isl}x{osl}",
        notes="; ".join(notes + extra),
    )


def _map_or_drop(file_stem, model_label, gpu_label, dropped):
    model, gpu = map_model(model_label), map_gpu(gpu_label)
    if model is None:
        dropped[f"{file_stem}: model {model_label} is not a calibrated jaxplan model"] += 1
    elif gpu is None:
        dropped[f"{file_stem}: GPU {gpu_label} is not a calibrated jaxplan GPU"] += 1
    return model, gpu


@functools.cache
def _trtllm(root: Path) -> tuple[tuple[dict, ...], tuple]:
    folder = root / "trtllm_perf_overview"
    dropped, rows = Counter(), []
    for stem, notes in (
        ("trtllm_v0.17_offline_throughput", ["TRT-LLM 0.17 engine flow, trtllm-bench offline max throughput", "FP8 build quantizes the KV cache too"]),
        ("trtllm_v1.0_offline_throughput", ["TRT-LLM ~1.0 PyTorch backend, trtllm-bench offline max throughput", "kv dtype assumed fp8 (ModelOpt FP8 checkpoint), not stated"]),
    ):
        for raw in _read_csv(folder / f"{stem}.csv"):
            model, gpu = _map_or_drop(stem, raw["model"], raw["gpu"], dropped)
            if model is None or gpu is None:
                continue
            row = _trtllm_offline_row(stem, model, gpu, raw["precision"], int(raw["tp"]), int(raw["pp"]), raw["isl"], raw["osl"], raw["output_tput_tok_s_total"], notes, dropped)
            if row is not None:
                rows.append(row)
    stem = "trtllm_latest_per_gpu_throughput"
    for raw in _read_csv(folder / f"{stem}.csv"):
        model, gpu = _map_or_drop(stem, raw["model"], raw["gpu"], dropped)
        if model is None or gpu is None:
            continue
        label = raw["parallelism"].upper()
        if not label.startswith("TP"):
            dropped[f"{stem}: parallelism {raw['parallelism']} (attention DP + expert parallel) not representable"] += 1
            continue
        tp, _, pp = label[2:].partition("PP")
        notes = ["TRT-LLM post-1.0 PyTorch backend, trtllm-bench offline max throughput", "kv dtype assumed fp8 (ModelOpt FP8 checkpoint), not stated"]
        if (int(raw["isl"]), int(raw["osl"])) == (1000, 1000):
            notes.append("num_prompts from the v1.0 doc table (this doc lists no 1000/1000 count)")
        row = _trtllm_offline_row(stem, model, gpu, raw["precision"], int(tp), int(pp or 1), raw["isl"], raw["osl"], raw["output_tput_tok_s_total"], notes, dropped)
        if row is not None:
            rows.append(row)
    stem = "trtllm_v0.14_online_serving"
    for raw in _read_csv(folder / f"{stem}.csv"):
        model, gpu = _map_or_drop(stem, raw["model"], raw["gpu"], dropped)
        if model is None or gpu is None:
            continue
        rate = math.inf if raw["qps_offered"].strip().upper() == "INF" else float(raw["qps_offered"])
        rows.append(
            make_row(
                model=model, gpu=gpu, tensor_parallel_size=int(raw["tp"]), pipeline_parallel_size=1, data_parallel_size=1,
                weight_dtype="bf16", kv_cache_dtype="auto", isl=float(raw["isl"]), osl=float(raw["osl"]),
                request_rate=rate, num_prompts=int(raw["num_requests"]),
                measured_ttft_ms_mean=float(raw["mean_ttft_ms"]), measured_tpot_ms_mean=float(raw["mean_itl_ms"]),
                measured_output_tok_s=float(raw["output_tput_tok_s"]),
                dataset=TRTLLM, backend="trtllm", source_id=f"{stem}:{model}:{gpu}:tp{raw['tp']}:{raw['isl']}x{raw['osl']}:qps{raw['qps_offered']}",
                notes="TRT-LLM 0.14 behind Triton; TPOT column = mean ITL; values rounded to integers in the source; arrival process not stated",
            )
        )
    return tuple(rows), tuple(sorted(dropped.items()))


# --- (c) vLLM on Azure A100 40GB --------------------------------------------------------------------


@functools.cache
def _vllm_a100(root: Path) -> tuple[tuple[dict, ...], tuple]:
    """Each run directory is one server that ran the same 200 ShareGPT prompts (seed 0) at QPS 1, 4, 16 and
    inf, in that order (the raw files' dates). vLLM 0.8.3 caches prefixes, so from the second run on every
    prompt is in the cache: TTFT stops depending on the prompt length (correlation with ISL 0.88-0.93 at
    QPS 1, -0.10-0.55 after), and the QPS-inf bursts finish 42,659 prompt tokens in 0.45 s (TP8), 5x what
    8 A100s can prefill. Those rows get `prefix_hit_rate` = `cached_prompt_fraction` of their prompts."""
    dropped, rows = Counter(), []
    table = _read_csv(root / "vllm_a100_tp_vs_pp" / "serving_summary.csv")
    first_run = {}
    for raw in table:
        first_run[raw["run_dir"], raw["model"]] = min(first_run.get((raw["run_dir"], raw["model"]), raw["date"]), raw["date"])
    for raw in table:
        model = map_model(raw["model"])
        if model is None:
            dropped[f"model {raw['model']} is not a calibrated jaxplan model"] += 1
            continue
        completed = int(raw["completed"])
        tp, pp = int(raw["tp"]), int(raw["pp"])
        rate = math.inf if raw["request_rate_qps"].strip().lower() == "inf" else float(raw["request_rate_qps"])
        network = "1 node" if raw["num_nodes"] == "1" else f"{raw['num_nodes']} nodes, InfiniBand between nodes: {raw['infiniband_between_nodes']}"
        repeated = raw["date"] != first_run[raw["run_dir"], raw["model"]]
        detail = json.loads(require_file(root / "vllm_a100_tp_vs_pp" / raw["raw_file"]).read_text())
        hit = cached_prompt_fraction(detail["input_lens"]) if repeated else 0.0
        cache_note = f"prompts cached by the same server's earlier runs (prefix_hit_rate {hit:.3f})" if repeated else "first run of this server: prompts not cached"
        rows.append(
            make_row(
                model=model, gpu="a100_sxm", tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=1,
                weight_dtype="bf16", kv_cache_dtype="auto",
                isl=float(raw["total_input_tokens"]) / completed, osl=float(raw["total_output_tokens"]) / completed,
                request_rate=rate, num_prompts=int(raw["num_prompts"]), prefix_hit_rate=hit,
                max_num_seqs=pp * A100_0_8_SEQS_PER_SCHEDULER, max_num_batched_tokens=A100_0_8_BATCHED_TOKENS,
                vllm_version=raw["vllm_version"].split()[0],
                lengths_file=str(root / "vllm_a100_tp_vs_pp" / raw["raw_file"]),
                gpu_hbm_bytes_override=A100_40GB_HBM_BYTES, gpu_hbm_bandwidth_bytes_per_s_override=A100_40GB_HBM_BANDWIDTH_BYTES_PER_S,
                measured_ttft_ms_mean=float(raw["mean_ttft_ms"]), measured_tpot_ms_mean=float(raw["mean_tpot_ms"]),
                measured_ttft_ms_p99=float(raw["p99_ttft_ms"]), measured_tpot_ms_p99=float(raw["p99_tpot_ms"]),
                measured_output_tok_s=float(raw["output_throughput_tok_s"]),
                dataset=VLLM_A100, backend="vllm", source_id=f"{raw['run_dir']}:qps{raw['request_rate_qps']}",
                notes=f"A100-SXM4-40GB (not the 80 GB a100_sxm: use the override columns); vLLM {raw['vllm_version'].split()[0]}; "
                f"ShareGPT, variable lengths (isl/osl are means; lengths_file: the run's own per-request lengths); Poisson arrivals; {network}; dtype not pinned (bf16 assumed); {cache_note}",
            )
        )
    return tuple(rows), tuple(sorted(dropped.items()))


_LOADERS = {SILICON: _silicon, TRTLLM: _trtllm, VLLM_A100: _vllm_a100, INFERENCEMAX_AMD: inferencemax_rows}


def _rows(dataset: str, data_root) -> list[dict]:
    rows, _ = _LOADERS[dataset](resolve_root(data_root).resolve())
    return [dict(row) for row in rows]


def load_silicon_rows(data_root: str | Path | None = None) -> list[dict]:
    """AIConfigurator silicon rows, agg mode, bundled models, jaxplan GPUs, bf16/fp8 weights, pure TP.

    Closed loop (concurrency = the source's batch_size, one replica); TTFT and
    TPOT measured; output tok/s derived (flagged). Exact duplicate rows dropped.
    """
    return _rows(SILICON, data_root)


def load_trtllm_rows(data_root: str | Path | None = None) -> list[dict]:
    """TensorRT-LLM doc tables: offline max-throughput rows (request_rate inf) and 0.14 online-serving rows."""
    return _rows(TRTLLM, data_root)


def load_vllm_a100_rows(data_root: str | Path | None = None) -> list[dict]:
    """vLLM 0.8.3 on A100-SXM4-40GB (Llama-3.3-70B TP8 vs TP4xPP2), with HBM override columns set."""
    return _rows(VLLM_A100, data_root)


def load_serving_rows(data_root: str | Path | None = None, datasets=DATASETS) -> list[dict]:
    """All normalized serving rows of the chosen datasets, in DATASETS order."""
    datasets = (datasets,) if isinstance(datasets, str) else tuple(datasets)
    for name in datasets:
        if name not in _LOADERS:
            raise bad_value("datasets", name, f"choose from {', '.join(DATASETS)}")
    return [row for name in datasets for row in _rows(name, data_root)]


def serving_drop_counts(data_root: str | Path | None = None) -> dict[str, dict[str, int]]:
    """dataset -> {reason: rows left out}, for every normalized dataset."""
    root = resolve_root(data_root).resolve()
    return {name: dict(loader(root)[1]) for name, loader in _LOADERS.items()}


# --- vllm bench serve --save-result ----------------------------------------------------------------

# Config keys looked up in the JSON (vllm bench serve --metadata KEY=VALUE lands at top level).
_JSON_KEYS = {
    "model": ("model", "model_id"),
    "gpu": ("gpu",),
    "tensor_parallel_size": ("tensor_parallel_size", "tp", "tp_size"),
    "pipeline_parallel_size": ("pipeline_parallel_size", "pp", "pp_size"),
    "data_parallel_size": ("data_parallel_size", "dp", "dp_size"),
    "weight_dtype": ("weight_dtype",),
    "kv_cache_dtype": ("kv_cache_dtype",),
    "max_num_seqs": ("max_num_seqs",),
    "max_num_batched_tokens": ("max_num_batched_tokens",),
    "prefix_hit_rate": ("prefix_hit_rate",),
    "isl_distribution": ("isl_distribution",),
    "isl_spread": ("isl_spread",),
    "osl_distribution": ("osl_distribution",),
    "osl_spread": ("osl_spread",),
    "gpu_hbm_bytes_override": ("gpu_hbm_bytes_override",),
    "gpu_hbm_bandwidth_bytes_per_s_override": ("gpu_hbm_bandwidth_bytes_per_s_override",),
    "enable_expert_parallel": ("enable_expert_parallel",),
    "enable_prefix_caching": ("enable_prefix_caching",),
    "block_size": ("block_size",),
    "gpu_memory_utilization": ("gpu_memory_utilization",),
    "vllm_version": ("vllm_version",),
}
_FLOAT_KEYS = ("prefix_hit_rate", "isl_spread", "osl_spread", "gpu_hbm_bytes_override", "gpu_hbm_bandwidth_bytes_per_s_override", "gpu_memory_utilization")
_INT_KEYS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "max_num_seqs", "max_num_batched_tokens", "block_size")
_FIX = {
    "model": "name it with --model path/to/config.json (the model's Hugging Face config), a bundled name (jaxplan list) or a known HF id (jaxplan calibrate or predict; in Python read_vllm_bench_json(model=...))",
    "gpu": "rerun vllm bench serve with --metadata gpu=h100_sxm, or name it with --gpu h100_sxm (jaxplan calibrate or predict; in Python read_vllm_bench_json(gpu=...))",
    "tensor_parallel_size": "rerun with --metadata tensor_parallel_size=N, or name it with --tensor-parallel-size N (jaxplan calibrate or predict; in Python read_vllm_bench_json(tensor_parallel_size=N))",
}
# Engine settings `jaxplan calibrate` and `predict` can give for JSON files that do not record them (`cli.engine_settings`).
JSON_DEFAULT_FIELDS = (
    "model", "gpu", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "enable_expert_parallel", "weight_dtype",
    "kv_cache_dtype", "max_num_seqs", "max_num_batched_tokens",
)


def _load_json_records(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise PlanError(f"{path}: cannot read ({err.strerror}); give the JSON file vllm bench serve --save-result wrote") from None
    except UnicodeDecodeError as err:
        raise PlanError(f"{path}: byte {err.start}: not UTF-8 text ({err.reason}); give the JSON file vllm bench serve --save-result wrote") from None
    try:
        records = json_records(text)
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: not valid JSON (line {err.lineno}: {err.msg}); give a vllm bench serve --save-result file") from None
    if not records or not all(isinstance(r, dict) for r in records):
        raise PlanError(f"{path}: expected a JSON object (or one object per line) from vllm bench serve --save-result")
    return records


def _number(record: dict, key: str, path: Path, where: str):
    value = record.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    try:
        return float(value)
    except (TypeError, ValueError):
        raise PlanError(f"{path}: {where}: field {key} = {short_repr(value)} is not a number; fix the file") from None


def read_vllm_bench_json(
    path: str | Path,
    *,
    model: str | None = None,
    gpu: str | None = None,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    data_parallel_size: int | None = None,
    weight_dtype: str | None = None,
    kv_cache_dtype: str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    prefix_hit_rate: float | None = None,
    isl_distribution: str | None = None,
    isl_spread: float | None = None,
    osl_distribution: str | None = None,
    osl_spread: float | None = None,
    gpu_hbm_bytes_override: float | None = None,
    gpu_hbm_bandwidth_bytes_per_s_override: float | None = None,
    enable_expert_parallel: bool | None = None,
    block_size: int | None = None,
    gpu_memory_utilization: float | None = None,
    vllm_version: str | None = None,
    enable_prefix_caching: bool | None = None,
    backend: str = "vllm",
    dataset: str = "vllm_bench_serve",
    defaults: Mapping[str, object] | None = None,
) -> list[dict]:
    """Rows from a `vllm bench serve --save-result` JSON file (one row per JSON object; --append-result files hold several).

    Read from the file: model_id, num_prompts, request_rate ('inf' or req/s),
    max_concurrency, burstiness, completed, failed, total_input_tokens,
    total_output_tokens (isl/osl = totals / completed), mean_ttft_ms,
    mean_tpot_ms, output_throughput, p99_ttft_ms and p99_tpot_ms when present, the per-request
    input_lens / output_lens of a --save-detailed file (-> `lengths_file`: the replay sends those very
    requests, unless the length columns are given), and any `--metadata KEY=VALUE` config keys
    (gpu, tensor_parallel_size/tp, pipeline_parallel_size/pp, data_parallel_size/dp,
    enable_expert_parallel, weight_dtype, kv_cache_dtype, max_num_seqs, max_num_batched_tokens,
    block_size, gpu_memory_utilization, vllm_version, prefix_hit_rate, enable_prefix_caching, and for a GPU that differs from
    the bundled spec gpu_hbm_bytes_override, gpu_hbm_bandwidth_bytes_per_s_override).
    Keyword arguments override the file; `defaults` (field -> value, JSON_DEFAULT_FIELDS) fill what
    it does not record (its --metadata keys win; a `defaults` model wins over the served model_id,
    which is often a local path). The engine config (GPU, TP, ...) is not in the file unless passed
    as metadata: a missing one is a one-line PlanError naming the field and the fix.
    Closed loop (max_concurrency set, request_rate inf) -> concurrency; open loop -> request_rate
    (+ concurrency when both were set: arrivals at request_rate capped at max_concurrency).
    """
    path = Path(path)
    given = {
        "model": model, "gpu": gpu, "tensor_parallel_size": tensor_parallel_size, "pipeline_parallel_size": pipeline_parallel_size,
        "data_parallel_size": data_parallel_size, "weight_dtype": weight_dtype, "kv_cache_dtype": kv_cache_dtype,
        "max_num_seqs": max_num_seqs, "max_num_batched_tokens": max_num_batched_tokens, "prefix_hit_rate": prefix_hit_rate,
        "gpu_hbm_bytes_override": gpu_hbm_bytes_override, "gpu_hbm_bandwidth_bytes_per_s_override": gpu_hbm_bandwidth_bytes_per_s_override,
        "isl_distribution": isl_distribution, "isl_spread": isl_spread, "osl_distribution": osl_distribution, "osl_spread": osl_spread,
        "enable_expert_parallel": enable_expert_parallel, "block_size": block_size, "gpu_memory_utilization": gpu_memory_utilization,
        "vllm_version": vllm_version, "enable_prefix_caching": enable_prefix_caching,
    }
    unknown = sorted(set(defaults or {}) - set(JSON_DEFAULT_FIELDS))
    if unknown:
        raise PlanError(f"defaults: unknown field {unknown[0]!r}; known: {', '.join(JSON_DEFAULT_FIELDS)}")
    records = _load_json_records(path)
    rows = []
    for index, record in enumerate(records):
        where = f"record {index}" if len(records) > 1 else "record"
        config = {}
        for field, keys in _JSON_KEYS.items():
            value = given[field]
            if value is None:
                value = next((record[k] for k in keys if k != "model_id" and record.get(k) not in (None, "")), None)
            if value is None:
                value = (defaults or {}).get(field)
            if value is None and field == "model" and record.get("model_id") not in (None, ""):
                value = record["model_id"]
            config[field] = value
        for field in ("model", "gpu", "tensor_parallel_size"):
            if config[field] is None:
                raise PlanError(f"{path}: {field} missing: {_FIX[field]}")
        lengths_file = None  # --save-detailed files list every request's lengths: replay those
        inputs, outputs = record.get("input_lens"), record.get("output_lens")
        free = [side for side in ("isl", "osl") if config[f"{side}_distribution"] is None and config[f"{side}_spread"] is None]
        if isinstance(inputs, list) and isinstance(outputs, list) and len(inputs) == len(outputs) > 0:
            if len(free) == 2:
                lengths_file = f"{path}#{index}" if len(records) > 1 else str(path)
            for side in free if len(free) == 1 else ():  # the other side's distribution was given: this one lognormal
                spread = _coefficient_of_variation(inputs if side == "isl" else outputs)
                if spread is not None:
                    config[f"{side}_distribution"], config[f"{side}_spread"] = "lognormal", spread
        for field in (*_INT_KEYS, *_FLOAT_KEYS):
            if isinstance(config[field], str):  # --metadata values arrive as text
                number = _number(config, field, path, where)
                config[field] = int(number) if field not in _FLOAT_KEYS and number.is_integer() else number
        for field in ("enable_expert_parallel", "enable_prefix_caching"):
            if isinstance(config[field], str):
                config[field] = parse_bool(field, config[field], f"{path}: {where}")
        if config["vllm_version"] is not None:
            config["vllm_version"] = str(config["vllm_version"])
        try:  # any model jaxplan can load: its bundled ones (MoE too), their quantised checkpoints' ids, config paths
            load_model(str(config["model"]))
        except PlanError:
            raise PlanError(f"{path}: model {short_repr(config['model'])} is not a bundled model, a known HF id or a config path: {_FIX['model']}") from None
        completed = _number(record, "completed", path, where)
        if not completed:
            raise PlanError(f"{path}: {where}: completed = {short_repr(record.get('completed'))}: no request finished, nothing to calibrate on; rerun the benchmark")
        totals = {k: _number(record, k, path, where) for k in ("total_input_tokens", "total_output_tokens", "num_prompts")}
        for key, value in totals.items():
            if value is None:
                raise PlanError(f"{path}: {where}: field {key} missing; the file is not a vllm bench serve --save-result output")
        rate = _number(record, "request_rate", path, where)
        max_concurrency = _number(record, "max_concurrency", path, where)
        rate = math.inf if rate is None else rate
        notes = [f"vllm bench serve file {path.name}"]
        burstiness = _number(record, "burstiness", path, where)
        if burstiness not in (None, 1.0) and rate != math.inf:
            notes.append(f"gamma arrivals, burstiness {burstiness:g}")
        failed = _number(record, "failed", path, where) or 0
        for key, value in (("completed", completed), ("num_prompts", totals["num_prompts"]), ("max_concurrency", max_concurrency), ("failed", failed)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise PlanError(f"{path}: {where}: field {key} = {short_repr(value)} is not a count; give a finite number >= 0 (max_concurrency: null for no limit)")
        if failed:
            notes.append(f"{int(failed)} failed requests")
        ttft, tpot, tput, ttft_p99, tpot_p99 = (_number(record, k, path, where) for k in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput", "p99_ttft_ms", "p99_tpot_ms"))
        row = dict(
            config,
            isl=totals["total_input_tokens"] / completed,
            osl=totals["total_output_tokens"] / completed,
            concurrency=int(max_concurrency) if max_concurrency is not None else None,
            request_rate=None if (max_concurrency is not None and rate == math.inf) else rate,
            num_prompts=int(totals["num_prompts"]),
            lengths_file=lengths_file,
            measured_ttft_ms_mean=ttft or None,
            measured_tpot_ms_mean=tpot or None,
            measured_output_tok_s=tput or None,
            measured_ttft_ms_p99=ttft_p99 or None,
            measured_tpot_ms_p99=tpot_p99 or None,
            dataset=dataset,
            backend=backend,
            source_id=f"{path.name}#{index}",
            notes="; ".join(notes),
        )
        rows.append(check_row(row, where=f"{path}: {where}"))
    return rows


__all__ = [
    "COLUMNS",
    "DATASETS",
    "ServingArrays",
    "load_serving_rows",
    "load_silicon_rows",
    "load_trtllm_rows",
    "load_vllm_a100_rows",
    "map_gpu",
    "map_model",
    "read_predict_csv",
    "read_vllm_bench_json",
    "serving_arrays",
    "serving_drop_counts",
    "write_predict_csv",
]
