"""Turn a candidate row into the `vllm serve` command that deploys it."""

from __future__ import annotations

import shlex
from pathlib import Path

from jaxplan.specs.model import ModelSpec
from jaxplan.specs.space import VLLM_DEFAULT_BLOCK_SIZE_TOKENS


def model_argument(model: ModelSpec) -> str:
    """What `vllm serve` is given: the Hugging Face id; for a config.json without one (no
    `_name_or_path`), the folder it sits in, which vLLM loads; for a config under another file name,
    a placeholder to fill in (the file's own name is not a model vLLM can find)."""
    if model.hf_id:
        return model.hf_id
    source = Path(model.source) if model.source else None
    if source is not None and source.name == "config.json":
        return str(source.parent.resolve())
    if source is not None and source.suffix == ".json":
        return f"<Hugging Face id or weights folder of {source.name}>"
    return model.name


def vllm_serve_command(model: ModelSpec, row: dict, gpu_memory_utilization: float = 0.9, block_size_tokens: int = VLLM_DEFAULT_BLOCK_SIZE_TOKENS) -> str:
    """A `vllm serve` command line with vLLM's own argument names. NVFP4 weights need a checkpoint
    quantised ahead of time (NVIDIA ModelOpt); vLLM cannot quantise to NVFP4 as it loads, so the model
    argument is a placeholder naming the one to quantise. A KV block size other than vLLM's default is
    passed on (`--block-size`): the capacity the plan counted depends on it. Where one replica's KV
    cache (`kv_blocks_per_replica`) holds fewer tokens than the model's context length, vLLM refuses to
    start at its default `--max-model-len` (the context length), so the line sets it to what the cache
    holds: the plan made room for its workload's longest request, and longer ones vLLM turns away."""
    served = model_argument(model)
    if row["weight_dtype"] == "nvfp4":
        served = f"<NVFP4 checkpoint of {served}>"
    args = [
        "vllm", "serve", served,
        "--tensor-parallel-size", str(row["tensor_parallel_size"]),
        "--pipeline-parallel-size", str(row["pipeline_parallel_size"]),
        "--data-parallel-size", str(row["data_parallel_size"]),
        "--max-num-seqs", str(row["max_num_seqs"]),
        "--max-num-batched-tokens", str(row["max_num_batched_tokens"]),
        "--gpu-memory-utilization", f"{gpu_memory_utilization:g}",
    ]
    if block_size_tokens != VLLM_DEFAULT_BLOCK_SIZE_TOKENS:
        args += ["--block-size", str(block_size_tokens)]
    if row.get("kv_blocks_per_replica") is not None:
        kv_tokens = planned_kv_tokens(row, block_size_tokens)
        if kv_tokens < model.max_position_embeddings:
            args += ["--max-model-len", str(kv_tokens)]
    if row["kv_cache_dtype"] == "fp8":
        args += ["--kv-cache-dtype", "fp8"]
    if row["weight_dtype"] == "fp8":
        args += ["--quantization", "fp8"]
    if row["weight_dtype"] == "nvfp4":
        args += ["--quantization", "modelopt_fp4"]
    layout = node_layout(row)
    if layout and layout[0] > 1:  # data-parallel replicas on several nodes: this is the head node's line
        _, per_node = layout
        args += ["--data-parallel-size-local", str(per_node), "--data-parallel-address", HEAD_ADDRESS, "--data-parallel-rpc-port", DP_RPC_PORT]
    elif layout is None:  # one replica spans nodes: vLLM runs it over a Ray cluster
        args += ["--distributed-executor-backend", "ray"]
    return shlex.join(args)


HEAD_ADDRESS = "<head-node-ip>"
DP_RPC_PORT = "13345"


def node_layout(row: dict) -> tuple[int, int] | None:
    """(nodes, data-parallel replicas per node) of a row whose replicas each fit in a node (as
    `gpus_per_node` of its GPU allows), or None where one replica spans nodes; (1, dp) without a
    bundled GPU to read the node size from."""
    from jaxplan.errors import PlanError
    from jaxplan.specs import load_gpu

    try:
        per_node_gpus = int(load_gpu(row["gpu"]).gpus_per_node) if "gpu" in row else None
    except PlanError:  # a GPU spec of your own, given by its file: no node size to split by
        per_node_gpus = None
    if per_node_gpus is None:
        return 1, int(row["data_parallel_size"])
    replica = int(row["tensor_parallel_size"]) * int(row["pipeline_parallel_size"])
    if replica > per_node_gpus:
        return None
    per_node = per_node_gpus // replica
    dp = int(row["data_parallel_size"])
    return -(-dp // per_node), min(per_node, dp)


def other_node_commands(head_command: str, row: dict) -> list[str]:
    """The lines for nodes 1.. of a deployment whose data-parallel replicas span nodes (vLLM's
    multi-node data parallelism: the same engine flags, `--headless`, each node's replicas and first
    rank); [] when it fits in one node."""
    layout = node_layout(row)
    if not layout or layout[0] == 1:
        return []
    nodes, per_node = layout
    dp = int(row["data_parallel_size"])
    argv = shlex.split(head_command)
    local = argv.index("--data-parallel-size-local")
    lines = []
    for node in range(1, nodes):
        start = node * per_node
        node_argv = argv[: local] + ["--headless", "--data-parallel-size-local", str(min(per_node, dp - start)), "--data-parallel-start-rank", str(start)] + argv[local + 2 :]
        lines.append(shlex.join(node_argv))
    return lines


def planned_kv_tokens(row: dict, block_size_tokens: int) -> int:
    """Tokens one replica's KV cache holds in the plan: its blocks x the block size."""
    return int(row["kv_blocks_per_replica"]) * block_size_tokens


def kv_cache_check(row: dict, block_size_tokens: int) -> str:
    """What to look for in the started server's log: the KV cache one replica was planned with, which
    vLLM reports at start-up as "GPU KV cache size: N tokens" (each data-parallel replica its own)."""
    tokens = planned_kv_tokens(row, block_size_tokens)
    return f'Check: vLLM should log "GPU KV cache size: ~{tokens:,} tokens" per replica (the plan\'s KV cache); much less means less concurrency than planned.'

