"""The vLLM mixture-of-experts rows of NVIDIA's AIConfigurator silicon data, as calibration rows (and,
in `load_moe_rows`, InferenceMAX's gpt-oss-120b runs on AMD GPUs, `calibrate.inferencemax`).

`e2e_aiconfigurator_silicon/silicon_calibration.csv` holds vLLM agg-mode runs of four MoE models:
MiniMax-M2.5 (FP8, NVFP4), gpt-oss-120b (its MXFP4 checkpoint, labelled `nvfp4` there), Qwen3-235B-A22B
(FP8) and Kimi-K2.5 (INT4 weight-only, NVFP4), on B200, B300 and H200. The dense loader
(`serving._silicon`) leaves them out (`serving.CALIBRATION_MODELS`); this one maps them.

Columns follow AIConfigurator's convention: tp_size is the attention TP inside one DP rank,
attention_dp_size the DP ranks, and moe_tp_size x moe_ep_size = tp_size x attention_dp_size the GPUs
the experts are split over. As a vLLM command (jaxplan's predict row):
  tensor_parallel_size   = tp_size
  data_parallel_size     = attention_dp_size (blank: moe_tp_size x moe_ep_size / tp_size)
  enable_expert_parallel = moe_ep_size > 1
  weight_dtype           = fp8 | nvfp4 | int4 (int4_wo) | mxfp4 (gpt-oss's fp4)
and concurrency = the run's `silicon_concurrency` (all clients of the engine; `batch_size` is per DP
rank in the rows that give attention_dp_size), except that rows labelled attention_dp_size = tp_size = T
with moe_ep_size = T x T are `-tp T --enable-expert-parallel` (`relabelled_expert_parallel`). Rows
dropped, each reason counted
(`moe_silicon_rows`' second value): disagg mode, wip=True, a model or GPU jaxplan does not bundle, an
expert group split both ways (moe_tp > 1 and moe_ep > 1, which vLLM does not run), duplicates.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from pathlib import Path

from jaxplan.calibrate._data import resolve_root
from jaxplan.calibrate.inferencemax import CSV_PATH as INFERENCEMAX_CSV
from jaxplan.calibrate.inferencemax import inferencemax_moe_rows
from jaxplan.calibrate.rows import make_row
from jaxplan.calibrate.serving import silicon_run_left_out, silicon_source

MOE_SILICON = "aiconfigurator_silicon_moe"
# Source model label -> bundled jaxplan model (the MoE models whose vLLM rows the data holds).
MOE_MODELS = {
    "minimaxai/minimax-m2.5": "minimax-m2.5",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "qwen/qwen3-235b-a22b-fp8": "qwen3-235b-a22b",
    "moonshotai/kimi-k2.5": "kimi-k2.5",
}
MOE_GPUS = {"b200_sxm": "b200_sxm", "b300_sxm": "b300_sxm", "h200_sxm": "h200_sxm", "gb200": "gb200"}
LAYOUT_KINDS = ("tp", "ep", "dp", "dp_ep")
# The requests per client AIConfigurator's benchmark runners send (`serving.SILICON_REQUESTS_PER_CLIENT`).
REQUESTS_PER_CLIENT = 10


def moe_weight_dtype(model: str, precision: str, gemm_quant_mode: str) -> str | None:
    """jaxplan's weight dtype of a MoE silicon row, or None where it is not modelled. gpt-oss-120b's
    `fp4` / `nvfp4` is its MXFP4 checkpoint (the only FP4 form it ships in; vLLM loads it with its
    `mxfp4` method); Kimi-K2.5's `int4_wo` is its INT4 weight-only experts."""
    if precision == "fp8":
        return "fp8"
    if precision == "fp4" and gemm_quant_mode == "nvfp4":
        return "mxfp4" if model == "gpt-oss-120b" else "nvfp4"
    if precision == "int4" and gemm_quant_mode == "int4_wo":
        return "int4"
    return None


def moe_kv_cache_dtype(weight_dtype: str) -> str:
    """FP8 KV with FP8 or NVFP4 weights (`serving.silicon_kv_cache_dtype`'s evidence); `auto` with the
    expert-only formats, whose checkpoints keep attention in bf16 and state no KV quantisation."""
    return "fp8" if weight_dtype in ("fp8", "nvfp4") else "auto"


def layout_kind(row: dict) -> str:
    """tp | ep | dp | dp_ep of a predict row: lock-step DP ranks (data_parallel_size > 1) or not, whole
    experts per GPU (enable_expert_parallel) or sliced."""
    dp = int(row.get("data_parallel_size") or 1) > 1
    ep = str(row.get("enable_expert_parallel")).lower() in ("true", "1")
    if dp:
        return "dp_ep" if ep else "dp"
    return "ep" if ep else "tp"


def parallel_layout(raw: dict) -> tuple[int, int, bool] | str:
    """(tensor_parallel_size, data_parallel_size, enable_expert_parallel) of a source row, or the reason
    it cannot be one vLLM command."""
    tp, moe_tp, moe_ep = int(raw["tp_size"]), int(raw["moe_tp_size"]), int(raw["moe_ep_size"])
    group = moe_tp * moe_ep
    dp = int(raw["attention_dp_size"]) if raw["attention_dp_size"] else group // tp
    if raw["pp_size"] not in ("", "1"):
        return "pipeline parallel"
    if group != tp * dp or dp < 1:
        return "moe_tp x moe_ep differs from tp x attention_dp"
    if moe_tp > 1 and moe_ep > 1:
        return "experts split both ways (moe_tp > 1 and moe_ep > 1): not one vLLM setting"
    if relabelled_expert_parallel(raw):
        return tp, 1, True
    return tp, dp, moe_ep > 1


def relabelled_expert_parallel(raw: dict) -> bool:
    """Whether a source row labels `-tp T --enable-expert-parallel` (one engine, EP = T) as T attention-DP
    ranks of TP T with EP T x T. Every vLLM row with attention DP > 1 in the data has that shape; their
    run names say tp{T}_ep{T}, and their measurements equal those of the rows labelled TP T with EP T on
    the same workload (TTFT within 0.79-1.17x, TPOT 0.94-1.10x; Kimi-K2.5's to the digit), where T x T
    GPUs of DP would serve T times the clients per rank (docs/data.md)."""
    tp, moe_tp, moe_ep = int(raw["tp_size"]), int(raw["moe_tp_size"]), int(raw["moe_ep_size"])
    return tp > 1 and raw["attention_dp_size"] == str(tp) and moe_tp == 1 and moe_ep == tp * tp


@functools.cache
def moe_silicon_rows(root: Path, backend: str = "vllm") -> tuple[tuple[dict, ...], tuple]:
    """(rows, sorted (reason, count) pairs of the source rows left out) of the MoE silicon rows of one
    serving engine: vLLM's are the ones scored; another engine's rows of the same campaign tell a
    campaign's behaviour from the physics' (docs/accuracy.md)."""
    dropped, rows, seen = Counter(), [], set()
    for raw in silicon_source(root):
        model = MOE_MODELS.get(raw["model_path"].strip().lower())
        if raw["backend"] != backend or model is None:
            continue
        if reason := silicon_run_left_out(raw):
            dropped[reason] += 1
            continue
        gpu = MOE_GPUS.get(raw["system"])
        if gpu is None:
            dropped[f"GPU {raw['system']} is not a jaxplan GPU"] += 1
            continue
        dtype = moe_weight_dtype(model, raw["precision"], raw["gemm_quant_mode"])
        if dtype is None:
            dropped[f"precision {raw['precision']} / {raw['gemm_quant_mode']} not modelled"] += 1
            continue
        layout = parallel_layout(raw)
        if isinstance(layout, str):
            dropped[layout] += 1
            continue
        tp, dp, ep = layout
        stated = re.search(r"silicon_concurrency=(\d+)", raw["silicon_data_source"])
        concurrency = int(stated.group(1)) if stated else int(raw["batch_size"]) * dp
        # Some runs are copied under several ids, one of them with its values rounded to 0.01 ms.
        key = (model, gpu, dtype, tp, dp, ep, raw["isl"], raw["osl"], concurrency, round(float(raw["silicon_ttft_ms"]), 2), round(float(raw["silicon_tpot_ms"]), 2))
        if key in seen:
            dropped["duplicate of another row (same config and values to 0.01 ms, different id)"] += 1
            continue
        seen.add(key)
        isl, osl = float(raw["isl"]), float(raw["osl"])
        ttft, tpot = float(raw["silicon_ttft_ms"]), float(raw["silicon_tpot_ms"])
        kv = moe_kv_cache_dtype(dtype)
        notes = [f"{backend} {raw['backend_version'] or '(version not given)'}", f"gemm/moe quant {raw['gemm_quant_mode']}/{raw['moe_quant_mode']}",
                 f"AIC layout tp{tp} attention_dp{raw['attention_dp_size'] or '-'} moe_tp{raw['moe_tp_size']} moe_ep{raw['moe_ep_size']}",
                 f"kv dtype not stated ({kv} assumed)", f"request count not stated: {REQUESTS_PER_CLIENT} x concurrency assumed"]
        rows.append(make_row(
            model=model, gpu=gpu, tensor_parallel_size=tp, pipeline_parallel_size=1, data_parallel_size=dp, enable_expert_parallel=ep,
            weight_dtype=dtype, kv_cache_dtype=kv, isl=isl, osl=osl, concurrency=concurrency, num_prompts=REQUESTS_PER_CLIENT * concurrency,
            measured_ttft_ms_mean=ttft, measured_tpot_ms_mean=tpot,
            measured_output_tok_s=concurrency * osl / ((ttft + (osl - 1.0) * tpot) * 1e-3), measured_output_tok_s_derived=True,
            dataset=MOE_SILICON, backend=backend, source_id=raw["id"], notes="; ".join(notes),
        ))
    return tuple(rows), tuple(sorted(dropped.items()))


def load_moe_rows(data_root: str | Path | None = None) -> list[dict]:
    """The vLLM MoE rows (fresh dicts), predict-row format (`calibrate.rows`): the silicon rows, then
    InferenceMAX's gpt-oss-120b runs on MI300X and MI355X (`inferencemax.inferencemax_moe_rows`) where
    that folder is present."""
    root = resolve_root(data_root).resolve()
    rows, _ = moe_silicon_rows(root)
    amd = inferencemax_moe_rows(root)[0] if (root / INFERENCEMAX_CSV).is_file() else ()
    return [dict(r) for r in rows + amd]


def moe_accuracy(rows: list[dict], params: dict[str, dict[str, float]], held_out_params: dict[str, dict[str, float]]) -> dict:
    """The MoE rows scored (stage 4) under both held-out protocols; no MoE row is fitted, so:
      model: leave-one-model-out = the final fit `params` (it saw no row of any MoE model);
      gpu:   leave-one-GPU-out = each GPU's `held_out_params` (the fit without that GPU's rows), and for
             a GPU without fitted rows (B300) the final fit, which prices it as such.
    protocol -> {"all", "model/<m>", "gpu/<g>", "kind/<k>", "<m>/<g>/<dtype>/<kind>"} -> `run.accuracy`
    summary, with the signed median log ratio of TTFT and TPOT ("ttft_median_ratio", predicted / measured)."""
    import numpy as np

    from jaxplan.calibrate.run import _predicted, _summary

    out = {}
    for protocol in ("gpu", "model"):
        predicted, fits = [None] * len(rows), [True] * len(rows)
        for gpu in sorted({r["gpu"] for r in rows}):
            index = [i for i, r in enumerate(rows) if r["gpu"] == gpu]
            chosen = held_out_params.get(gpu, params[gpu]) if protocol == "gpu" else params[gpu]
            part, part_fits = _predicted([rows[i] for i in index], {gpu: chosen})
            for i, p, f in zip(index, part, part_fits):
                predicted[i], fits[i] = p, f
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            kind = layout_kind(r)
            for key in ("all", f"model/{r['model']}", f"gpu/{r['gpu']}", f"kind/{kind}", f"{r['model']}/{r['gpu']}/{r['weight_dtype']}/{kind}"):
                groups.setdefault(key, []).append(i)
        table = {}
        for key, index in groups.items():
            entry = _summary([predicted[i] for i in index], [fits[i] for i in index])
            for metric in ("ttft", "tpot"):
                logs = [np.log(predicted[i][f"{metric}_ms_mean"] / rows[i][f"measured_{metric}_ms_mean"]) for i in index if predicted[i].get(f"{metric}_ms_mean")]
                entry[f"{metric}_median_ratio"] = float(np.exp(np.median(logs))) if logs else None
            table[key] = entry
        out[protocol] = dict(sorted(table.items()))
    return out
