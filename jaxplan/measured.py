"""What a measured run's numbers say about how it ran: a bound from the physics that no run of its
stated workload can beat uncached (`jaxplan calibrate` leaves such a run out of the fit; `predict`
notes it beside the run's prediction)."""

from __future__ import annotations

import math

# A closed-loop run whose measured TPOT needs more of the GPU's dense peak than this for its linear
# layers alone (`implied_peak_fraction`) cannot have run its stated workload uncached: the kernel
# tables' best GEMMs reach 0.77-0.85 of it, and attention, weight reads and step costs come on top.
IMPOSSIBLE_PEAK_FRACTION = 0.9


def implied_peak_fraction(row: dict) -> float:
    """Fraction of the GPU's dense peak (FP8 / FP4 for FP8 / NVFP4 weights) that the linear layers alone need to run
    one step of a closed-loop row in its measured TPOT: b (1 + (1 - prefix hit rate) ISL / OSL) tokens
    per step (b decodes and b / OSL new prompts, less their cached part), 2 x the weights a token uses
    (a MoE model's active experts) FLOPs per token, spread over every GPU of the row (TP x PP x DP,
    perfectly overlapped: a lower bound). A row above the best GEMM efficiency in the kernel tables
    cannot have run its stated workload uncached."""
    from jaxplan.prediction import weight_dtype_of  # prediction imports this module
    from jaxplan.specs import load_gpu, load_model

    gpu, model = load_gpu(row["gpu"]), load_model(row["model"])
    peak = gpu.tensor_core_flops_per_s(weight_dtype_of(row)) or gpu.bf16_flops_per_s
    gpus = float(row.get("tensor_parallel_size") or 1) * float(row.get("pipeline_parallel_size") or 1) * float(row.get("data_parallel_size") or 1)
    uncached = 1.0 - float(row.get("prefix_hit_rate") or 0.0)
    tokens = float(row["concurrency"]) * (1.0 + uncached * float(row["isl"]) / float(row["osl"]))
    need_s = 2.0 * float(model.layer_params(active=True)) * tokens / (peak * gpus)
    return need_s / (float(row["measured_tpot_ms_mean"]) * 1e-3)


def too_fast_uncached(row: dict) -> float | None:
    """`implied_peak_fraction` of a closed-loop row with a measured TPOT where it passes
    IMPOSSIBLE_PEAK_FRACTION, else None (also where a field it reads is not a number: a row that
    passes through `predict` unvalidated is not this check's to refuse)."""
    try:
        rate = row.get("request_rate")
        closed = row.get("concurrency") not in (None, "") and (rate in (None, "") or float(rate) == math.inf)
        tpot_ms = float(row.get("measured_tpot_ms_mean") or 0.0)
        if not (closed and math.isfinite(tpot_ms) and tpot_ms > 0):
            return None
        fraction = implied_peak_fraction(row)
    except (TypeError, ValueError, ZeroDivisionError):
        return None
    return fraction if fraction > IMPOSSIBLE_PEAK_FRACTION else None
