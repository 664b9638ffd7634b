"""Turn a candidate row into the `vllm serve` command lines that deploy it.

A row's layout kind (`jaxplan.layout_kind`) decides the lines:
- a dense model: one command, `--data-parallel-size` = its replicas (vLLM runs them as independent
  engines behind one API server), one line per node when they span nodes;
- a MoE model of kind tp / ep: one command per server (one per replica), each on its own GPUs and
  port, and a router in front: vLLM's `--data-parallel-size` would make a MoE model's ranks step
  together and share the experts, which is a different deployment (kinds dp / dp_ep);
- kinds dp / dp_ep: one command per server with `--data-parallel-size D` (and
  `--enable-expert-parallel`), one line per node when a server's D ranks span nodes.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from jaxplan.layout_kind import row_kind
from jaxplan.specs.model import ModelSpec
from jaxplan.specs.space import LOCKSTEP_KINDS, VLLM_DEFAULT_BLOCK_SIZE_TOKENS

HEAD_ADDRESS = "<head-node-ip>"
DP_RPC_PORT = "13345"
FIRST_PORT = 8000  # vLLM's default --port; servers sharing a node take the next ones
# vLLM's --quantization of a weight format it can apply as it loads a BF16 checkpoint (FP8), or the
# method of a checkpoint quantised ahead of time that the line names with a placeholder (NVFP4).
ONLINE_QUANTIZATION = {"fp8": "fp8"}
# Formats vLLM only serves from a checkpoint stored in them (read from its quantization_config).
STORED_ONLY = {"nvfp4": "NVFP4", "mxfp4": "MXFP4", "int4": "INT4 (compressed-tensors)"}


@dataclasses.dataclass(frozen=True)
class ServeLine:
    """One command to run: `label` says where ('server 2: node 0, GPUs 2-3, port 8001', 'node 1')."""

    label: str
    command: str


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


def checkpoint_and_quantization(model: ModelSpec, weight_dtype: str) -> tuple[str, list[str]]:
    """(the model argument, the `--quantization` flags) that serve `weight_dtype` weights.

    A checkpoint stored in the planned format is served as it is: vLLM reads the method from its
    quantization_config, no flag (gpt-oss's MXFP4, Kimi-K2.5's INT4 compressed-tensors, an FP8
    checkpoint). FP8 on a BF16 checkpoint is quantised as vLLM loads it (`--quantization fp8`). vLLM
    cannot dequantise a quantised checkpoint nor quantise to NVFP4 / MXFP4 / INT4 as it loads, so those
    plans name the checkpoint they need as a placeholder (a bf16 plan of gpt-oss: its BF16 weights)."""
    served = model_argument(model)
    stored = model.checkpoint_weight_format or "bf16"  # not recorded: a Hugging Face checkpoint is BF16 by default
    if weight_dtype == stored:
        return served, []
    if weight_dtype in STORED_ONLY:
        flags = ["--quantization", "modelopt_fp4"] if weight_dtype == "nvfp4" else []
        return f"<{STORED_ONLY[weight_dtype]} checkpoint of {served}>", flags
    if stored != "bf16":  # bf16 or fp8 planned, the checkpoint quantised otherwise: its BF16 weights are needed
        served = f"<bf16 checkpoint of {served}>"
    flags = ["--quantization", ONLINE_QUANTIZATION[weight_dtype]] if weight_dtype in ONLINE_QUANTIZATION else []
    return served, flags


def engine_args(model: ModelSpec, row: dict, gpu_memory_utilization: float = 0.9, block_size_tokens: int = VLLM_DEFAULT_BLOCK_SIZE_TOKENS,
                enable_prefix_caching: bool = True) -> list[str]:
    """`vllm serve MODEL` and the flags every line of the deployment shares, without the parallel
    sizes. A KV block size other than vLLM's default is passed on (`--block-size`): the capacity the
    plan counted depends on it. Where one replica's KV cache (`kv_blocks_per_replica`) holds fewer
    tokens than the model's context length, vLLM refuses to start at its default `--max-model-len`
    (the context length), so the line sets it to what the cache holds: the plan made room for its
    workload's longest request, and longer ones vLLM turns away."""
    served, quantization = checkpoint_and_quantization(model, row["weight_dtype"])
    args = [
        "vllm", "serve", served,
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
    if not enable_prefix_caching:  # the replay priced preemptions without the cache's help
        args += ["--no-enable-prefix-caching"]
    return args + quantization


def _with_parallel(base: list[str], row: dict, data_parallel_size: int | None, expert_parallel: bool) -> list[str]:
    """`base` (`engine_args`) with the parallel sizes after the model argument."""
    args = ["--tensor-parallel-size", str(row["tensor_parallel_size"]), "--pipeline-parallel-size", str(row["pipeline_parallel_size"])]
    if data_parallel_size is not None:
        args += ["--data-parallel-size", str(data_parallel_size)]
    return base[:3] + args + (["--enable-expert-parallel"] if expert_parallel else []) + base[3:]


def _gpus_per_node(row: dict, gpus_per_node: int | None) -> int | None:
    """The GPUs one host of the row's GPU holds (what one launch command addresses): given, or the
    bundled spec's (`GpuSpec.launch_gpus_per_host`: 4 on a GB200 NVL72, whose NVLink domain is 72);
    None for a GPU spec of one's own given by its file (no node size to split by: everything on one node)."""
    if gpus_per_node is not None:
        return int(gpus_per_node)
    from jaxplan.errors import PlanError
    from jaxplan.specs import load_gpu

    try:
        return int(load_gpu(row["gpu"]).launch_gpus_per_host) if "gpu" in row else None
    except PlanError:
        return None


def server_shape(model: ModelSpec, row: dict) -> tuple[int, int | None, bool]:
    """(servers, data-parallel ranks of one server or None for no --data-parallel-size, expert
    parallel) of a row, as its kind launches it (module docstring)."""
    kind, ranks, expert_parallel, servers = row_kind(row)
    replicas = int(row["data_parallel_size"])
    if kind in LOCKSTEP_KINDS:
        return replicas // ranks, ranks, expert_parallel
    if model.is_moe:
        return replicas, None, expert_parallel  # one server per replica, experts inside it
    return 1, replicas, expert_parallel


def node_layout(row: dict, ranks: int = None, gpus_per_node: int | None = None) -> tuple[int, int] | None:
    """(nodes, data-parallel ranks per node) of one server of `ranks` ranks (default: the row's
    data_parallel_size) whose ranks each fit in a node, or None where one rank spans nodes; (1, ranks)
    without a node size."""
    ranks = int(row["data_parallel_size"]) if ranks is None else int(ranks)
    per_node_gpus = _gpus_per_node(row, gpus_per_node)
    if per_node_gpus is None:
        return 1, ranks
    replica = int(row["tensor_parallel_size"]) * int(row["pipeline_parallel_size"])
    if replica > per_node_gpus:
        return None
    per_node = per_node_gpus // replica
    return -(-ranks // per_node), min(per_node, ranks)


def serve_lines(model: ModelSpec, row: dict, gpu_memory_utilization: float = 0.9, block_size_tokens: int = VLLM_DEFAULT_BLOCK_SIZE_TOKENS,
                gpus_per_node: int | None = None, enable_prefix_caching: bool = True) -> list[ServeLine]:
    """Every command the row's deployment runs, the first server's (head node's) first."""
    base = engine_args(model, row, gpu_memory_utilization, block_size_tokens, enable_prefix_caching)
    servers, ranks, expert_parallel = server_shape(model, row)
    replica_gpus = int(row["tensor_parallel_size"]) * int(row["pipeline_parallel_size"])
    node_gpus = _gpus_per_node(row, gpus_per_node)
    server_gpus = replica_gpus * (ranks or 1)
    if servers == 1:
        return _one_server(base, row, ranks, expert_parallel, node_gpus, HEAD_ADDRESS, "")
    if node_gpus is not None and server_gpus > node_gpus:  # each server spans nodes: its own head
        lines = []
        for s in range(servers):
            lines += _one_server(base, row, ranks, expert_parallel, node_gpus, f"<server-{s + 1}-head-ip>", f"server {s + 1}")
        return lines
    per_node = servers if node_gpus is None else node_gpus // server_gpus
    lines = []
    for s in range(servers):
        node, slot = divmod(s, per_node)
        first = slot * server_gpus
        devices = ",".join(str(g) for g in range(first, first + server_gpus))
        env = [f"CUDA_VISIBLE_DEVICES={devices}"] if per_node > 1 else []
        port = FIRST_PORT + slot
        argv = env + _with_parallel(base, row, ranks, expert_parallel) + ["--port", str(port)]
        where = f"node {node}, GPUs {first}-{first + server_gpus - 1}" if server_gpus > 1 else f"node {node}, GPU {first}"
        lines.append(ServeLine(f"server {s + 1}: {where}, port {port}", shlex.join(argv)))
    return lines


def _one_server(base: list[str], row: dict, ranks: int | None, expert_parallel: bool, node_gpus: int | None, address: str, name: str) -> list[ServeLine]:
    """The lines of one server: one line on one node; its data-parallel ranks over several nodes with
    vLLM's multi-node data parallelism (head, then `--headless` nodes from their first rank); a
    replica larger than a node over a Ray cluster."""
    argv = _with_parallel(base, row, ranks, expert_parallel)
    prefix = f"{name}: " if name else ""
    layout = node_layout(row, ranks or 1, node_gpus)
    if layout is None:  # one replica spans nodes: vLLM runs it over a Ray cluster
        return [ServeLine(f"{prefix}Ray head node", shlex.join(argv + ["--distributed-executor-backend", "ray"]))]
    nodes, per_node = layout
    if nodes == 1:
        return [ServeLine(name or "one node", shlex.join(argv))]
    total = ranks or 1
    head = argv + ["--data-parallel-size-local", str(per_node), "--data-parallel-address", address, "--data-parallel-rpc-port", DP_RPC_PORT]
    lines = [ServeLine(f"{prefix}node 0 (head)", shlex.join(head))]
    for node in range(1, nodes):
        start = node * per_node
        node_argv = argv + ["--headless", "--data-parallel-size-local", str(min(per_node, total - start)), "--data-parallel-start-rank", str(start),
                            "--data-parallel-address", address, "--data-parallel-rpc-port", DP_RPC_PORT]
        lines.append(ServeLine(f"{prefix}node {node}", shlex.join(node_argv)))
    return lines


def launch_note(model: ModelSpec, row: dict, gpus_per_node: int | None = None) -> str:
    """One line on how the lines fit together: a router over independent servers, lock-step ranks,
    placeholders to fill in; "" when one plain command says it all."""
    kind, ranks, expert_parallel, _ = row_kind(row)
    servers, dp, _ = server_shape(model, row)
    notes = []
    if servers > 1:
        what = f"{servers} independent vLLM servers" if kind not in LOCKSTEP_KINDS else f"{servers} vLLM servers of {ranks} lock-step data-parallel ranks each"
        notes.append(f"{what}: put a router / load balancer in front to spread requests over their endpoints")
        if kind not in LOCKSTEP_KINDS:
            notes.append("not --data-parallel-size, which would step a MoE model's ranks together (the dp kinds)")
    if kind in LOCKSTEP_KINDS:
        group = ranks * int(row["tensor_parallel_size"])
        split = f"whole experts on each of {group} GPUs (EP{group})" if expert_parallel else f"every expert sliced {group} ways"
        notes.append(f"--data-parallel-size {ranks}: the ranks step together and share the experts, {split}")
    elif kind == "ep":
        notes.append(f"--enable-expert-parallel: whole experts on each of the {row['tensor_parallel_size']} GPUs of a server")
    lines = serve_lines(model, row, gpus_per_node=gpus_per_node)
    if any("-head-ip>" in line.command for line in lines):
        notes.append("each <server-N-head-ip> is that server's node 0 address")
    served = shlex.split(lines[0].command)
    served = served[served.index("serve") + 1]
    if "checkpoint of" in served:
        notes.append(f"{served}: vLLM cannot convert {model.checkpoint_weight_format or 'bf16'} weights to {row['weight_dtype']} as it loads them; give such a checkpoint")
    return "; ".join(notes)


def vllm_serve_command(model: ModelSpec, row: dict, gpu_memory_utilization: float = 0.9, block_size_tokens: int = VLLM_DEFAULT_BLOCK_SIZE_TOKENS) -> str:
    """The first line of `serve_lines`: the whole deployment when it is one server on one node, else
    its first server's (head node's) line."""
    return serve_lines(model, row, gpu_memory_utilization, block_size_tokens)[0].command


def other_node_commands(head_command: str, row: dict) -> list[str]:
    """The lines for nodes 1.. of one server whose data-parallel ranks span nodes (vLLM's multi-node
    data parallelism: the same engine flags, `--headless`, each node's ranks and first rank); [] when
    it fits in one node. `head_command`: the head node's line (`vllm_serve_command`)."""
    argv = shlex.split(head_command)
    if "--data-parallel-size-local" not in argv:
        return []
    ranks = int(argv[argv.index("--data-parallel-size") + 1])
    nodes, per_node = node_layout(row, ranks)
    local = argv.index("--data-parallel-size-local")
    lines = []
    for node in range(1, nodes):
        start = node * per_node
        node_argv = argv[:local] + ["--headless", "--data-parallel-size-local", str(min(per_node, ranks - start)), "--data-parallel-start-rank", str(start)] + argv[local + 2 :]
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
