"""Hand-picked candidates through the funnel's stages 1-4 (`evaluate_blocks`, the report rows'
program), with the expected first-failing sieve worked out by hand from the model's config and the
GPU's spec sheet."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context, evaluate_blocks
from jaxplan.grid import AXES, Grid
from jaxplan.specs import load_gpu, load_model, load_workload
from jaxplan.specs.space import SearchSpace

SPACE = SearchSpace(
    name="sieve-cases",
    tensor_parallel_size=(1, 2, 3, 4, 8, 16),
    pipeline_parallel_size=(1, 2, 3, 96),
    data_parallel_size=(1, 2, 4),
    max_num_seqs=(256,),
    max_num_batched_tokens=(128, 8192),
    weight_dtype=("bf16", "fp8"),
    kv_cache_dtype=("auto",),
    gpu_budget=16,
    allow_multi_node=False,
)
GPUS = ("h100_sxm", "a100_sxm")

# (label, axis values, expected reason, why) -- Llama-3.1-70B: 64 heads, hidden 8192, 80 layers.
BASE = {"gpu": "h100_sxm", "tensor_parallel_size": 2, "pipeline_parallel_size": 1, "layout_kind": "tp", "data_parallel_size": 1,
            "max_num_seqs": 256, "max_num_batched_tokens": 8192, "weight_dtype": "bf16", "kv_cache_dtype": "auto"}
CASES = [
    ("tp3", {"tensor_parallel_size": 3}, Reason.TP_HEADS),  # 64 % 3 = 1
    ("tp3_pp3", {"tensor_parallel_size": 3, "pipeline_parallel_size": 3}, Reason.TP_HEADS),  # TP is checked first
    ("pp96", {"pipeline_parallel_size": 96}, Reason.PP_LAYERS),  # 96 stages > 80 layers (checked before the node fit)
    ("tp16_one_node", {"tensor_parallel_size": 16}, Reason.NODE_FIT),  # 16 GPUs > 8 per node, multi-node off
    ("over_budget", {"tensor_parallel_size": 8, "data_parallel_size": 4}, Reason.GPU_BUDGET),  # 8 x 1 x 4 = 32 > 16
    ("fp8_on_a100", {"gpu": "a100_sxm", "weight_dtype": "fp8"}, Reason.FP8_UNSUPPORTED),  # A100: no FP8 tensor cores
    ("budget_below_seqs", {"max_num_batched_tokens": 128}, Reason.BUDGET_BELOW_SEQS),  # 128 < 256 seqs
    ("bf16_tp1", {"tensor_parallel_size": 1}, Reason.WEIGHTS_DONT_FIT),  # 141 GB of weights > 77.3 GB usable
    # FP8 at TP=1 fits the weights but not one longest coding request's KV:
    #   free = 77,309,411,328 - (68,451,041,280 FP8 layers + 4,202,692,608 BF16 embed/head)
    #          - 8192 x (6 x 8192 + 3 x 28672) x 2 = 2,214,592,512 - 256 x 128256 x 4 = 131,334,144
    #          - 1 GiB = 1,236,008,960 B
    #   longest coding request: 8000 x (1 + 0.98 x 0.25) + 300 x (1 + 0.98 x 0.5) = 10,407 tokens
    #          -> 651 blocks = 10,416 tokens x 327,680 B = 3,413,114,880 B > free
    ("fp8_tp1_h100", {"tensor_parallel_size": 1, "weight_dtype": "fp8"}, Reason.NO_KV_FOR_LONGEST_REQUEST),
]
PASSES_STAGES_1_2 = [
    ("bf16_tp2", {}),  # 70.55 GB of weights + 3.0 GB activations/reserve < 77.3 GB: 3.7 GB left for KV
    ("at_budget", {"tensor_parallel_size": 8, "data_parallel_size": 2}),  # 8 x 1 x 2 = 16 = budget (not over it)
    ("fp8_on_h100", {"weight_dtype": "fp8"}),
    ("pp3", {"pipeline_parallel_size": 3}),  # 80 layers split 27/27/26, as vLLM does: not refused
]


def digits_for(grid: Grid, **values) -> list[int]:
    labels = grid.labels
    return [labels[axis].index(values[axis]) for axis in AXES]


@pytest.fixture(scope="module")
def llama_results():
    grid = Grid(tuple(load_gpu(n) for n in GPUS), SPACE)
    multi = Grid(grid.gpus, SPACE.replace(allow_multi_node=True))
    rows = [{**BASE, **change} for _, change, _ in CASES] + [{**BASE, **change} for _, change in PASSES_STAGES_1_2]
    digits = jnp.asarray(np.array([digits_for(grid, **row) for row in rows], np.int32))
    model, workload = load_model("llama-3.1-70b"), load_workload("coding")
    single_node = evaluate_blocks(build_context(grid, model, workload), digits)
    multi_node = evaluate_blocks(build_context(multi, model, workload), digits)
    names = [label for label, _, _ in CASES] + [label for label, _ in PASSES_STAGES_1_2]
    return {name: (int(a), int(b)) for name, a, b in zip(names, np.asarray(single_node.reason), np.asarray(multi_node.reason))}


@pytest.mark.parametrize(("label", "expected"), [(label, reason) for label, _, reason in CASES])
def test_rejected_by_the_expected_sieve(llama_results, label, expected):
    got = Reason(llama_results[label][0])
    assert got == expected, f"{label}: {got.name} instead of {expected.name}"


def test_multi_node_lifts_only_the_node_check(llama_results):
    # With allow_multi_node, a TP=16 replica spans two 8-GPU nodes and goes on to later stages.
    assert Reason(llama_results["tp16_one_node"][1]) != Reason.NODE_FIT
    for label, _, expected in CASES:
        if expected != Reason.NODE_FIT:
            assert Reason(llama_results[label][1]) == expected


@pytest.mark.parametrize("label", [label for label, _ in PASSES_STAGES_1_2])
def test_passes_structure_and_memory(llama_results, label):
    reason = Reason(llama_results[label][0])
    # ADMITTED, or rejected only by stage 3/4 (traffic-dependent), never by stages 1-2.
    assert reason.stage not in (1, 2), f"{label}: {reason.name}"
