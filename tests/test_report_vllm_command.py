"""The `vllm serve` line a shortlisted row turns into: vLLM's own argument names and values, parsed
back with shlex; NVFP4 rows name the checkpoint they need instead of one vLLM would load as BF16."""

from __future__ import annotations

import shlex

import pytest

from jaxplan.prediction import weight_only_note
from jaxplan.report.vllm_command import vllm_serve_command
from jaxplan.specs import load_gpu, load_model

ROW = dict(tensor_parallel_size=4, pipeline_parallel_size=2, data_parallel_size=3, max_num_seqs=96, max_num_batched_tokens=512,
           weight_dtype="bf16", kv_cache_dtype="auto")


def args(row: dict) -> list[str]:
    return shlex.split(vllm_serve_command(load_model("llama-3.1-70b"), row, 0.85))


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_bf16_row_names_every_layout_knob():
    argv = args(ROW)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
    expected = {"--tensor-parallel-size": "4", "--pipeline-parallel-size": "2", "--data-parallel-size": "3", "--max-num-seqs": "96",
                "--max-num-batched-tokens": "512", "--gpu-memory-utilization": "0.85"}
    assert {name: option(argv, name) for name in expected} == expected
    assert "--quantization" not in argv and "--kv-cache-dtype" not in argv


@pytest.mark.parametrize(("weight_dtype", "kv_cache_dtype", "quantization", "model"), [
    ("fp8", "fp8", "fp8", "meta-llama/Llama-3.1-70B"),  # vLLM quantises BF16 weights to FP8 as it loads them
    ("nvfp4", "fp8", "modelopt_fp4", "<NVFP4 checkpoint of meta-llama/Llama-3.1-70B>"),  # it cannot for NVFP4
])
def test_low_precision_rows(weight_dtype, kv_cache_dtype, quantization, model):
    argv = args(dict(ROW, weight_dtype=weight_dtype, kv_cache_dtype=kv_cache_dtype))
    assert argv[2] == model
    assert option(argv, "--quantization") == quantization and option(argv, "--kv-cache-dtype") == "fp8"


def test_weight_only_rows_say_so():
    """FP8 weights on A100 and NVFP4 weights before Blackwell run weight-only (vLLM's Marlin kernels):
    predict prices them so and says it in the row's status; where the tensor cores exist it says nothing."""
    assert "a100_sxm has no FP8 tensor cores" in weight_only_note(load_gpu("a100_sxm"), "fp8")
    assert "h200_sxm has no FP4 tensor cores" in weight_only_note(load_gpu("h200_sxm"), "nvfp4")
    assert weight_only_note(load_gpu("b200_sxm"), "nvfp4") == weight_only_note(load_gpu("h200_sxm"), "fp8") == ""
    assert weight_only_note(load_gpu("a100_sxm"), "bf16") == ""


def test_a_block_size_other_than_vllms_default_is_passed_on():
    """The plan's KV capacity is counted in blocks of the space's block_size_tokens; a server started
    at vLLM's default 16 with a plan made at 32 would hold a different cache, so the line says it."""
    model = load_model("llama-3.1-70b")
    assert "--block-size" not in shlex.split(vllm_serve_command(model, ROW, 0.9, 16))
    assert option(shlex.split(vllm_serve_command(model, ROW, 0.9, 32)), "--block-size") == "32"


def test_the_kv_cache_check_names_the_tokens_vllm_logs():
    from jaxplan.report.vllm_command import kv_cache_check

    line = kv_cache_check(dict(ROW, kv_blocks_per_replica=30_040), 16)
    assert '"GPU KV cache size: ~480,640 tokens"' in line and "per replica" in line
    assert "~961,280 tokens" in kv_cache_check(dict(ROW, kv_blocks_per_replica=30_040), 32)


def test_a_kv_cache_shorter_than_the_context_sets_max_model_len():
    """Found by an audit: a plan whose replica holds 22,288 tokens of KV printed no --max-model-len, and
    vLLM refuses to start when the cache cannot hold one request of its default length (Llama-3.1's
    131,072 tokens). The line caps it at what the cache holds; a cache that holds the context needs nothing."""
    model = load_model("llama-3.1-70b")
    small = shlex.split(vllm_serve_command(model, dict(ROW, kv_blocks_per_replica=1_393), 0.9, 16))
    assert option(small, "--max-model-len") == "22288"
    assert option(shlex.split(vllm_serve_command(model, dict(ROW, kv_blocks_per_replica=1_393), 0.9, 32)), "--max-model-len") == "44576"
    roomy = shlex.split(vllm_serve_command(model, dict(ROW, kv_blocks_per_replica=30_040), 0.9, 16))
    assert model.max_position_embeddings == 131_072 and "--max-model-len" not in roomy


def test_replicas_on_several_nodes_get_one_line_per_node():
    """Found by an audit: the README's own winner, 14 H100s (8 per node) as TP1 x PP2 x DP7, was one
    `vllm serve` line that needs 14 GPUs on one host. Replicas that fit a node are spread as vLLM's
    multi-node data parallelism: the head node runs 4 replicas and serves the API, node 1 runs the
    other 3 headless from rank 4; a replica larger than a node runs over Ray; one node needs nothing."""
    from jaxplan.report.vllm_command import HEAD_ADDRESS, other_node_commands

    model = load_model("llama-3.1-70b")
    row = dict(ROW, gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=2, data_parallel_size=7)
    head = shlex.split(vllm_serve_command(model, row))
    assert option(head, "--data-parallel-size") == "7" and option(head, "--data-parallel-size-local") == "4"
    assert option(head, "--data-parallel-address") == HEAD_ADDRESS and "--headless" not in head
    (node1,) = other_node_commands(shlex.join(head), row)
    node1 = shlex.split(node1)
    assert "--headless" in node1 and option(node1, "--data-parallel-size-local") == "3" and option(node1, "--data-parallel-start-rank") == "4"
    assert option(node1, "--tensor-parallel-size") == "1" and option(node1, "--pipeline-parallel-size") == "2"
    spanning = shlex.split(vllm_serve_command(model, dict(row, tensor_parallel_size=8, data_parallel_size=1)))
    assert option(spanning, "--distributed-executor-backend") == "ray" and "--data-parallel-size-local" not in spanning
    one_node = dict(row, tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=4)
    assert "--data-parallel-size-local" not in shlex.split(vllm_serve_command(model, one_node))
    assert other_node_commands(vllm_serve_command(model, one_node), one_node) == []
    custom = dict(row, gpu="my_own_gpu")  # a GPU spec of one's own: no node size to split by, no crash
    assert "--data-parallel-size-local" not in shlex.split(vllm_serve_command(model, custom))
    assert other_node_commands(vllm_serve_command(model, custom), custom) == []
