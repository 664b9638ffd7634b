"""SearchSpace: the axes of the candidate grid and the constraints shared by all candidates."""

from __future__ import annotations

import dataclasses
import math

from jaxplan.errors import bad_value

WEIGHT_DTYPES = ("bf16", "fp8", "nvfp4")
DEFAULT_WEIGHT_DTYPES = ("bf16", "fp8")  # NVFP4 costs accuracy that FP8 does not: opt in by naming it
KV_CACHE_DTYPES = ("auto", "fp8")
# NVFP4: a 4-bit E2M1 value per weight plus one FP8 E4M3 scale per block of 16 (NVIDIA ModelOpt's
# format; vLLM's `modelopt_fp4`): 0.5 + 1 / 16 bytes per parameter.
NVFP4_BYTES_PER_PARAM = 0.5 + 1.0 / 16.0
DTYPE_BYTES = {"bf16": 2, "fp8": 1, "nvfp4": NVFP4_BYTES_PER_PARAM, "auto": 2}
BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)  # KV-cache block sizes (tokens) vLLM accepts
VLLM_DEFAULT_BLOCK_SIZE_TOKENS = 16  # what vLLM uses without --block-size

INT_AXES = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "max_num_seqs",
    "max_num_batched_tokens",
)


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """Axis values (tuples, ascending) plus shared settings.

    The grid is the Cartesian product of the axes and the GPU types; its size
    is `size(num_gpu_types)`. `gpu_budget` caps TP x PP x DP.
    """

    name: str
    tensor_parallel_size: tuple[int, ...]
    pipeline_parallel_size: tuple[int, ...]
    data_parallel_size: tuple[int, ...]
    max_num_seqs: tuple[int, ...]
    max_num_batched_tokens: tuple[int, ...]
    weight_dtype: tuple[str, ...] = DEFAULT_WEIGHT_DTYPES
    kv_cache_dtype: tuple[str, ...] = KV_CACHE_DTYPES
    gpu_budget: int = 64
    gpu_memory_utilization: float = 0.9
    block_size_tokens: int = VLLM_DEFAULT_BLOCK_SIZE_TOKENS
    allow_multi_node: bool = True
    description: str = ""

    def __post_init__(self) -> None:
        where = f"space {self.name!r}"
        for axis in INT_AXES:
            values = tuple(getattr(self, axis))
            if not values:
                raise bad_value(axis, [], "needs at least one value", where=where)
            for value in values:
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10_000_000:
                    raise bad_value(axis, value, "values must be integers in 1..10,000,000", where=where)
            if len(set(values)) != len(values):
                raise bad_value(axis, list(values), "has duplicate values", where=where)
            object.__setattr__(self, axis, tuple(sorted(values)))
        for axis, allowed in (("weight_dtype", WEIGHT_DTYPES), ("kv_cache_dtype", KV_CACHE_DTYPES)):
            values = tuple(getattr(self, axis))
            bad = [v for v in values if v not in allowed]
            if not values or bad or len(set(values)) != len(values):
                raise bad_value(axis, list(values), f"values must be distinct, from {list(allowed)}", where=where)
            object.__setattr__(self, axis, values)
        if isinstance(self.gpu_budget, bool) or not isinstance(self.gpu_budget, int) or not 1 <= self.gpu_budget <= 1_000_000:
            raise bad_value("gpu_budget", self.gpu_budget, "must be an integer in 1..1,000,000", where=where)
        if isinstance(self.gpu_memory_utilization, bool) or not isinstance(self.gpu_memory_utilization, (int, float)) or not 0.05 <= self.gpu_memory_utilization <= 1.0:
            raise bad_value("gpu_memory_utilization", self.gpu_memory_utilization, "must be in [0.05, 1.0]", where=where)
        if isinstance(self.block_size_tokens, bool) or not isinstance(self.block_size_tokens, int) or self.block_size_tokens not in BLOCK_SIZES:
            raise bad_value("block_size_tokens", self.block_size_tokens, f"use one of {', '.join(map(str, BLOCK_SIZES))}", where=where)

    def axis_values(self) -> dict[str, tuple]:
        """Ordered axes (outermost first); the GPU axis is added by the grid."""
        return {
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "weight_dtype": self.weight_dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
        }

    def size(self, num_gpu_types: int) -> int:
        return num_gpu_types * math.prod(len(v) for v in self.axis_values().values())

    def replace(self, **changes) -> "SearchSpace":
        return dataclasses.replace(self, **changes)
