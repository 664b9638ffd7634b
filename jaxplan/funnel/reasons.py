"""Rejection reason codes: why a candidate left the funnel, and what to relax.

Each member carries its funnel stage (1 structure, 2 memory, 3 capacity, 4 estimate; 0 for the codes
that are not rejections), a one-line description and the fix, so the three cannot drift apart."""

from __future__ import annotations

import enum


class Reason(enum.IntEnum):
    """int code (what the kernels write into [C] int32 arrays) with .stage, .description and .fix."""

    stage: int
    description: str
    fix: str

    def __new__(cls, code: int, stage: int = 0, description: str = "", fix: str = ""):
        member = int.__new__(cls, code)
        member._value_ = code
        member.stage, member.description, member.fix = stage, description, fix
        return member

    ADMITTED = 0
    TP_HEADS = (1, 1, "tensor_parallel_size does not divide the attention heads and hidden size (vLLM refuses it)",
                "use a tensor_parallel_size that divides the model's attention heads and hidden size")
    PP_LAYERS = (2, 1, "pipeline_parallel_size exceeds the layer count (vLLM refuses it)",
                 "use a pipeline_parallel_size of at most the model's layers")
    NODE_FIT = (3, 1, "TP x PP spans nodes and multi-node replicas are off",
                "allow multi-node replicas (allow_multi_node = true) or use smaller TP x PP")
    GPU_BUDGET = (4, 1, "TP x PP x DP exceeds the GPU budget", "raise --budget")
    FP8_UNSUPPORTED = (5, 1, "FP8 weights on a GPU without FP8 tensor cores",
                       "use bf16 weights on this GPU or add an FP8-capable GPU type")
    BUDGET_BELOW_SEQS = (6, 1, "max_num_batched_tokens < max_num_seqs (vLLM refuses it)",
                         "add larger max_num_batched_tokens values")
    WEIGHTS_DONT_FIT = (7, 2, "weights + start-up profile peak (forward or sampler) + runtime reserve exceed "
                              "gpu_memory_utilization x the HBM the GPU reports",
                        "add larger TP/PP, FP8 weights, GPUs with more HBM, or a larger budget")
    NO_KV_FOR_LONGEST_REQUEST = (8, 2, "no room for the KV cache of one longest (p99) request",
                                 "add larger TP/PP, FP8 KV cache, or shorter ISL/OSL")
    NO_CONCURRENCY = (9, 3, "fewer than one request fits at the mean context", "add larger TP/PP or FP8 KV cache")
    OVERLOADED = (10, 4, "cannot keep up with the arrival rate", "raise --budget (more replicas) or lower the request rate")
    TTFT_SLO = (11, 4, "p99 TTFT above the SLO", "loosen the TTFT SLO, add larger TP, or raise --budget")
    TPOT_SLO = (12, 4, "p99 TPOT above the SLO", "loosen the TPOT SLO, add larger TP, or smaller max_num_seqs")
    BELOW_TARGET = (13, 4, "output throughput below the target", "raise --budget or lower --target-throughput")
    PADDING = 14  # not a candidate (last chunk's padding); never reported
    # codes keep their values (saved results hold them), so a later stage-1 rule takes the next free code
    FP4_UNSUPPORTED = (15, 1, "NVFP4 weights on a GPU without FP4 tensor cores (before Blackwell)",
                       "use fp8 or bf16 weights on this GPU or add an FP4-capable GPU type (b200_sxm)")
    KV_HEADS = (16, 1, "tensor_parallel_size and the KV heads do not divide one another (vLLM refuses it)",
                "use a tensor_parallel_size that divides the model's KV heads or is a multiple of them")
    EP_ONE_GPU = (17, 1, "expert parallelism over one GPU (TP = 1, no lock-step ranks) is the tp layout, counted there",
                  "nothing to relax: the tp layout of the same GPUs is evaluated")
    EXPERT_FORMAT_UNSUPPORTED = (18, 1, "MXFP4 or INT4 experts on a GPU vLLM runs them on only from compute capability 8.0",
                                 "use bf16 or fp8 weights on this GPU, or a GPU of compute capability 8.0 or later")


NUM_REASONS = len(Reason)

# The fixes of the reasons that name the GPU budget, as they read where the budget does not bind (it
# removed no candidate, or it was lifted): more replicas then come from the space's DP range.
FIX_WITHOUT_BUDGET = {
    Reason.OVERLOADED: "lower the request rate, or widen the space's data_parallel_size range (more replicas)",
    Reason.TTFT_SLO: "loosen the TTFT SLO or add larger TP",
    Reason.BELOW_TARGET: "lower --target-throughput, or widen the space's data_parallel_size range",
    Reason.WEIGHTS_DONT_FIT: "add larger TP/PP, FP8 weights or GPUs with more HBM",
}
