"""Rejection reason codes: why a candidate left the funnel, and what to relax."""

from __future__ import annotations

import enum


class Reason(enum.IntEnum):
    ADMITTED = 0
    # stage 1: structure
    TP_HEADS = 1
    PP_LAYERS = 2
    NODE_FIT = 3
    GPU_BUDGET = 4
    FP8_UNSUPPORTED = 5
    BUDGET_BELOW_SEQS = 6
    # stage 2: memory
    WEIGHTS_DONT_FIT = 7
    NO_KV_FOR_LONGEST_REQUEST = 8
    # stage 3: capacity
    NO_CONCURRENCY = 9
    # stage 4: estimate
    OVERLOADED = 10
    TTFT_SLO = 11
    TPOT_SLO = 12
    BELOW_TARGET = 13
    PADDING = 14  # not a candidate (last chunk's padding); never reported
    FP4_UNSUPPORTED = 15  # stage 1 (added after PADDING: codes keep their values)


STAGE_OF = {
    Reason.TP_HEADS: 1, Reason.PP_LAYERS: 1, Reason.NODE_FIT: 1, Reason.GPU_BUDGET: 1,
    Reason.FP8_UNSUPPORTED: 1, Reason.FP4_UNSUPPORTED: 1, Reason.BUDGET_BELOW_SEQS: 1,
    Reason.WEIGHTS_DONT_FIT: 2, Reason.NO_KV_FOR_LONGEST_REQUEST: 2,
    Reason.NO_CONCURRENCY: 3,
    Reason.OVERLOADED: 4, Reason.TTFT_SLO: 4, Reason.TPOT_SLO: 4, Reason.BELOW_TARGET: 4,
}

DESCRIPTION = {
    Reason.TP_HEADS: "tensor_parallel_size does not divide the attention heads and hidden size",
    Reason.PP_LAYERS: "pipeline_parallel_size does not divide the layer count",
    Reason.NODE_FIT: "TP x PP spans nodes and multi-node replicas are off",
    Reason.GPU_BUDGET: "TP x PP x DP exceeds the GPU budget",
    Reason.FP8_UNSUPPORTED: "FP8 weights on a GPU without FP8 tensor cores",
    Reason.FP4_UNSUPPORTED: "NVFP4 weights on a GPU without FP4 tensor cores (before Blackwell)",
    Reason.BUDGET_BELOW_SEQS: "max_num_batched_tokens < max_num_seqs (vLLM refuses it)",
    Reason.WEIGHTS_DONT_FIT: "weights + start-up profile peak (forward or sampler) + runtime reserve exceed gpu_memory_utilization x the HBM CUDA reports",
    Reason.NO_KV_FOR_LONGEST_REQUEST: "no room for the KV cache of one longest (p99) request",
    Reason.NO_CONCURRENCY: "fewer than one request fits at the mean context",
    Reason.OVERLOADED: "cannot keep up with the arrival rate",
    Reason.TTFT_SLO: "p99 TTFT above the SLO",
    Reason.TPOT_SLO: "p99 TPOT above the SLO",
    Reason.BELOW_TARGET: "output throughput below the target",
}

RELAX = {
    Reason.TP_HEADS: "use a tensor_parallel_size that divides the model's attention heads",
    Reason.PP_LAYERS: "use a pipeline_parallel_size that divides the model's layers",
    Reason.NODE_FIT: "allow multi-node replicas (allow_multi_node = true) or use smaller TP x PP",
    Reason.GPU_BUDGET: "raise --budget",
    Reason.FP8_UNSUPPORTED: "use bf16 weights on this GPU or add an FP8-capable GPU type",
    Reason.FP4_UNSUPPORTED: "use fp8 or bf16 weights on this GPU or add an FP4-capable GPU type (b200_sxm)",
    Reason.BUDGET_BELOW_SEQS: "add larger max_num_batched_tokens values",
    Reason.WEIGHTS_DONT_FIT: "add larger TP/PP, FP8 weights, GPUs with more HBM, or a larger budget",
    Reason.NO_KV_FOR_LONGEST_REQUEST: "add larger TP/PP, FP8 KV cache, or shorter ISL/OSL",
    Reason.NO_CONCURRENCY: "add larger TP/PP or FP8 KV cache",
    Reason.OVERLOADED: "raise --budget (more replicas) or lower the request rate",
    Reason.TTFT_SLO: "loosen the TTFT SLO, add larger TP, or raise --budget",
    Reason.TPOT_SLO: "loosen the TPOT SLO, add larger TP, or smaller max_num_seqs",
    Reason.BELOW_TARGET: "raise --budget or lower --target-throughput",
}

NUM_REASONS = len(Reason)
