"""Turn a candidate row into the `vllm serve` command that deploys it."""

from __future__ import annotations

import shlex

from jaxplan.specs.model import ModelSpec


def vllm_serve_command(model: ModelSpec, row: dict, gpu_memory_utilization: float = 0.9) -> str:
    """A `vllm serve` command line with vLLM's own argument names."""
    args = [
        "vllm", "serve", model.hf_id or model.name,
        "--tensor-parallel-size", str(row["tensor_parallel_size"]),
        "--pipeline-parallel-size", str(row["pipeline_parallel_size"]),
        "--data-parallel-size", str(row["data_parallel_size"]),
        "--max-num-seqs", str(row["max_num_seqs"]),
        "--max-num-batched-tokens", str(row["max_num_batched_tokens"]),
        "--gpu-memory-utilization", f"{gpu_memory_utilization:g}",
    ]
    if row["kv_cache_dtype"] == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if row["weight_dtype"] == "fp8":
        args += ["--quantization", "fp8"]
    return shlex.join(args)
