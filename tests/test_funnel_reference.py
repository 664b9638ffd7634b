"""`run_sweep`'s per-reason counts equal a candidate-by-candidate plain-Python reference.

Stages 1-3 of the reference (tests/reference_funnel.py) are re-derived from the models' raw config
fields, independently of jaxplan.physics; stage 4 of the reference calls jaxplan's estimate once on
all stage-3 survivors at once (no chunks, no pages, no DP factorisation), so a disagreement there
points at the funnel's streaming machinery. Counts are integers: compared exactly.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import reference_funnel as ref

from jaxplan.funnel import run_sweep
from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.sweep import build_context
from jaxplan.grid import Grid
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list
from jaxplan.specs.model import ModelSpec
from jaxplan.specs.space import SearchSpace

# 2 models x 2 GPU types on the 'small' space (768 candidates per GPU type), chosen to reach every
# memory path: Llama-3.1-70B (GQA, weights that only fit at TP >= 2 in BF16; A100 has no FP8) with
# long reasoning requests (the longest-request KV check binds), and Qwen3.5-27B (16 full-attention
# + 48 linear-attention layers, per-request recurrent state) with coding traffic.
CASES = [
    ("llama-3.1-70b", "h100_sxm,a100_sxm", "reasoning"),
    ("qwen3.5-27b", "h100_sxm,a100_sxm", "coding"),
]

# A space that trips every stage-1..3 reason, including the ones 'small' never does: TP=3/6 does
# not divide Llama-3.1-70B's 64 heads, and divides GQA_24_4's 24 heads and hidden size but not its 4
# KV heads (nor they it), PP=96 exceeds both models' layers (PP=3 splits them unevenly and is priced
# at the largest stage), TP x PP = 16 spans a node with multi-node off, budget
# tokens 16 < max_num_seqs 64, NVFP4 weights on H100 and A100 (no FP4 tensor cores; A100 none for
# FP8 either), and a token budget of 16 sustains < 1 coding request
# (PP x 16 x OSL 300 / (300 + ISL 8000) = 0.58 at PP = 1; 1.16 at PP = 2).
EDGE_SPACE = SearchSpace(
    name="edge",
    tensor_parallel_size=(1, 2, 3, 6, 8, 16),
    pipeline_parallel_size=(1, 2, 3, 96),
    data_parallel_size=(1, 2, 4),
    max_num_seqs=(8, 64),
    max_num_batched_tokens=(16, 8192),
    weight_dtype=("bf16", "fp8", "nvfp4"),
    gpu_budget=16,
    allow_multi_node=False,
)


# Llama-3.1-8B's shape with 24 heads of 128 (hidden 3,072) and 4 KV heads: TP = 3 or 6 divides the
# heads and the hidden size, but not the KV heads, nor they it (no bundled model has such heads).
GQA_24_4 = dataclasses.replace(load_model("llama-3.1-8b"), name="gqa-24-4", num_attention_heads=24, num_kv_heads=4, hidden_size=3072)


def compare(model_name: str | ModelSpec, gpus, workload_name: str, space: SearchSpace) -> dict:
    model = model_name if isinstance(model_name, ModelSpec) else load_model(model_name)
    gpu_specs, workload = (parse_gpu_list(gpus) if isinstance(gpus, str) else tuple(gpus)), load_workload(workload_name)
    space = space.for_model(model)  # what run_sweep plans: the model's layout kinds and formats
    model_name = model.name
    result = run_sweep(model, gpu_specs, workload, space, top_k=5)
    early, survivors = ref.stages_1_to_3(model, gpu_specs, workload, space)
    ctx = build_context(Grid(gpu_specs, space), model, workload)
    expected = early + ref.stage4_counts(ctx, survivors)
    got = {r: n for r, n in result.reason_counts.items() if n and r != Reason.ADMITTED}
    want = {r: n for r, n in expected.items() if n and r != Reason.ADMITTED}
    # Stages 1-3 first (independent physics), then stage 4 (the funnel's plumbing).
    early_got = {r: n for r, n in got.items() if Reason(r).stage <= 3}
    early_want = {r: n for r, n in want.items() if Reason(r).stage <= 3}
    assert early_got == early_want, f"stages 1-3: {model_name}/{workload_name}"
    assert got == want, f"stage 4: {model_name}/{workload_name}"
    admitted = result.grid.size - sum(got.values())
    assert result.reason_counts.get(Reason.ADMITTED, admitted) == admitted
    assert result.stages[3].admitted == admitted
    return got


@pytest.mark.parametrize(("model_name", "gpus", "workload_name"), CASES)
def test_small_space_counts_match_reference(model_name, gpus, workload_name):
    got = compare(model_name, gpus, workload_name, load_space("small"))
    # The cases exercise what they are chosen for (else the comparison would prove little).
    assert got.get(Reason.FP8_UNSUPPORTED, 0) > 0 and got.get(Reason.GPU_BUDGET, 0) > 0
    if model_name == "llama-3.1-70b":
        assert got.get(Reason.WEIGHTS_DONT_FIT, 0) > 0 and got.get(Reason.NO_KV_FOR_LONGEST_REQUEST, 0) > 0


def test_edge_space_trips_every_early_reason():
    """Llama-3.1-70B (64 heads, 8 KV heads, 80 layers) and GQA_24_4 (24 heads, 4 KV heads, 32
    layers): between them every stage-1..3 reason fires, each count equal to the reference's."""
    got = Counter()
    for model in ("llama-3.1-70b", GQA_24_4):
        got.update(compare(model, "h100_sxm,a100_sxm", "coding", EDGE_SPACE))
    for reason in Reason:
        if reason.stage in (1, 2, 3) and reason not in MOE_REASONS:
            assert got.get(reason, 0) > 0, f"{reason.name} never fired: the edge space no longer covers it"


# Stage-1 reasons only a MoE model can meet (test_moe_layout_kinds_match_the_reference).
MOE_REASONS = (Reason.EP_ONE_GPU, Reason.EXPERT_FORMAT_UNSUPPORTED)


def test_moe_layout_kinds_match_the_reference():
    """gpt-oss-20b (32 experts, 4 active; MXFP4 experts) over every layout kind (tp, ep, dp:D, dp_ep:D)
    on H100 and a V100-class GPU (compute capability 7.0: vLLM refuses MXFP4 there): the counts of the
    reference, which shards the experts by hand (sliced over lock-step ranks x TP, or whole with EP),
    equal the sweep's, and the MoE-only reasons fire."""
    v100 = dataclasses.replace(parse_gpu_list("a100_sxm")[0], name="v100_like", compute_capability=7.0, hbm_bytes=32e9)
    space = load_space("small").replace(weight_dtype=("bf16", "mxfp4"), kv_cache_dtype=("auto",), allow_multi_node=False)
    got = compare("gpt-oss-20b", (parse_gpu_list("h100_sxm")[0], v100), "coding", space)
    for reason in MOE_REASONS:
        assert got.get(reason, 0) > 0, f"{reason.name} never fired"


def test_nvfp4_weights_match_the_reference_on_a_gpu_with_fp4_tensor_cores():
    """B200 admits NVFP4 layouts (0.5625 bytes per weight): their memory and capacity sieves and their
    stage-4 estimates agree with the reference, and H100 in the same sweep rejects them."""
    space = SearchSpace(name="nvfp4", tensor_parallel_size=(1, 2, 4), pipeline_parallel_size=(1,), data_parallel_size=(1, 2),
                        max_num_seqs=(64, 256), max_num_batched_tokens=(2048, 8192), weight_dtype=("fp8", "nvfp4"), gpu_budget=8)
    got = compare("llama-3.1-70b", "b200_sxm,h100_sxm", "reasoning", space)
    assert got.get(Reason.FP4_UNSUPPORTED, 0) == space.size(1) // 2  # H100's NVFP4 half, all of it
