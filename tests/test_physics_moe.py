"""The MoE layer physics (jaxplan/physics/moe.py) against independent references: Monte-Carlo routing,
hand-computed shards and dispatch bytes, and the invariants that tie the layout kinds together."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.errors import PlanError
from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.structure import structure
from jaxplan.grid import Candidates
from jaxplan.physics import StepBatch, hardware_table, make_layout, model_shape, step_cost, take
from jaxplan.physics.memory import weight_bytes_per_gpu
from jaxplan.physics.moe import (
    busiest_gpu_pairs,
    dispatch_combine_time_s,
    expected_experts_touched,
    expert_gemm_rate,
    moe_layer_time_s,
)
from jaxplan.physics.params import efficiency_for
from jaxplan.physics.step_time import allreduce_efficiency, roofline
from jaxplan.specs import load_gpu, load_model, load_space
from jaxplan.specs.formats import BY_NAME, INT4, MXFP4



def hardware(name: str):
    return jax.tree.map(lambda x: x[0], hardware_table((load_gpu(name),), efficiency_for([name])))


@pytest.mark.parametrize(("experts", "k", "tokens"), [(128, 8, 1), (128, 8, 4), (128, 8, 32), (64, 6, 10), (256, 8, 200), (8, 2, 3)])
def test_expected_experts_touched_matches_monte_carlo(experts, k, tokens):
    """Each token picks k distinct experts uniformly; count the distinct experts a step touches."""
    rng = np.random.default_rng(0)
    trials = 4000
    touched = np.empty(trials)
    for t in range(trials):
        picks = np.argsort(rng.random((tokens, experts)), axis=1)[:, :k]
        touched[t] = np.unique(picks).size
    formula = float(expected_experts_touched(float(experts), float(k), float(tokens)))
    standard_error = touched.std() / np.sqrt(trials) + 1e-9
    assert abs(formula - touched.mean()) < 4 * standard_error + 1e-3, (formula, touched.mean())


@pytest.mark.parametrize(("pairs", "gpus"), [(64 * 8, 8), (8 * 8, 8), (512 * 8, 16), (32 * 6, 4)])
def test_busiest_gpu_load_is_near_the_monte_carlo_maximum(pairs, gpus):
    """Token-expert pairs spread at random over G GPUs: the formula's busiest load is within 12% of the
    simulated expected maximum (it is a Gaussian approximation), and never below the mean."""
    rng = np.random.default_rng(1)
    loads = rng.multinomial(pairs, np.full(gpus, 1.0 / gpus), size=20000).max(axis=1)
    got = float(busiest_gpu_pairs(float(pairs), float(gpus)))
    assert got >= pairs / gpus
    assert got == pytest.approx(loads.mean(), rel=0.12)


def test_one_gpu_takes_every_pair():
    assert float(busiest_gpu_pairs(100.0, 1.0)) == 100.0


def test_dispatch_and_combine_by_hand():
    """Lock-step DP4 x TP2 on H200, 64 tokens per rank this step: the group's 256 tokens x 4,096 hidden
    x 2 bytes are all-gathered and reduce-scattered over the 4 ranks (one ring all-reduce's traffic,
    2 (D-1)/D of the message per GPU) on NVLink (8 GPUs fit the node), plus two latencies."""
    hw = hardware("h200_sxm")
    layout = make_layout(tp=2, dp=4, weight_bytes=1, lockstep_ranks=4)
    message = 4 * 64 * 4096 * 2.0
    link = float(hw.intra_node_bandwidth_bytes_per_s) * float(allreduce_efficiency(hw, 4.0))
    expected = 2 * float(hw.allreduce_latency_s) + 2 * 3 / 4 * message / link
    got = float(dispatch_combine_time_s(hw, layout, 4 * 64.0, 4096.0, allreduce_efficiency))
    assert got == pytest.approx(expected, rel=1e-5)
    alone = make_layout(tp=2, dp=4, weight_bytes=1, lockstep_ranks=1)
    assert float(dispatch_combine_time_s(hw, alone, 64.0, 4096.0, allreduce_efficiency)) == 0.0


def test_weight_shards_by_hand():
    """Qwen3-235B-A22B FP8 on 8 GPUs: TP8 slices all 128 experts 8 ways; DP8 + EP (TP1) puts 16 whole
    experts on each GPU beside a whole copy of attention; DP8 without EP slices the experts 8 ways."""
    spec = load_model("qwen3-235b-a22b")
    m = model_shape(spec)
    h, layers, e = spec.hidden_size, spec.moe_layers, spec.num_experts
    expert = spec.expert_params()
    attention = spec.attention_params_per_layer() * spec.num_layers
    router = h * e * layers
    ends = (spec.embedding_params + spec.lm_head_params) * 2.0
    tp8 = make_layout(tp=8, weight_bytes=1)
    dp8_ep = make_layout(tp=1, dp=8, weight_bytes=1, lockstep_ranks=8, expert_parallel=1)
    dp8 = make_layout(tp=1, dp=8, weight_bytes=1, lockstep_ranks=8)
    kv_proj = spec.kv_params_per_layer() * spec.num_layers
    tp8_attention = (attention - kv_proj) / 8 + kv_proj / min(8, spec.num_kv_heads)
    assert float(weight_bytes_per_gpu(m, tp8)) == pytest.approx(tp8_attention + router + layers * e * expert / 8 + ends / 8, rel=1e-5)
    assert float(weight_bytes_per_gpu(m, dp8_ep)) == pytest.approx(attention + router + layers * 16 * expert + ends, rel=1e-5)
    assert float(weight_bytes_per_gpu(m, dp8)) == pytest.approx(float(weight_bytes_per_gpu(m, dp8_ep)), rel=1e-6)


def test_uneven_expert_parallel_takes_the_heaviest_gpu():
    """EP over 6 GPUs of 128 experts: the first ranks hold 22 (vLLM gives the remainder to them)."""
    spec = load_model("qwen3-235b-a22b")
    m = model_shape(spec)
    ep6 = make_layout(tp=6, weight_bytes=1, expert_parallel=1)
    sliced6 = make_layout(tp=6, weight_bytes=1)
    extra = spec.moe_layers * (22 - 128 / 6) * spec.expert_params()
    assert float(weight_bytes_per_gpu(m, ep6) - weight_bytes_per_gpu(m, sliced6)) == pytest.approx(extra, rel=1e-4)


def test_a_lockstep_rank_prices_its_experts_like_the_wider_tp_group():
    """The expert layer of a dp:D rank at TP T over D x its tokens costs what a TP = D x T layout's
    expert layer costs over those tokens: both slice every expert D x T ways over the same tokens."""
    m = model_shape(load_model("qwen3-235b-a22b"))
    hw = hardware("h200_sxm")
    rank = make_layout(tp=2, dp=4, weight_bytes=1, lockstep_ranks=4)
    wide = make_layout(tp=8, weight_bytes=1)
    for tokens in (1.0, 16.0, 300.0, 4096.0):
        flops = float(hw.fp8_flops_per_s * hw.gemm_flops_efficiency)
        a = moe_layer_time_s(m, hw, rank, tokens, 4 * tokens, roofline, flops, 1.0)
        b = moe_layer_time_s(m, hw, wide, 4 * tokens, 4 * tokens, roofline, flops, 1.0)
        # Only the shared experts differ (TP 2 over this rank's tokens against TP 8 over all); Qwen3 has none.
        assert float(a) == pytest.approx(float(b), rel=1e-6)


def test_expert_parallel_decode_streams_only_the_touched_local_experts():
    """One decode token on EP8: it touches 8 of 128 experts, so a GPU streams 8/8 = 1 expert's weights
    on average; sliced (TP8), every GPU streams 1/8 of the 8 touched experts: the same bytes. The
    busiest GPU then holds at least one pair, so EP is never cheaper at one token."""
    m = model_shape(load_model("qwen3-235b-a22b"))
    hw = hardware("h200_sxm")
    flops = float(hw.fp8_flops_per_s * hw.gemm_flops_efficiency)
    ep = moe_layer_time_s(m, hw, make_layout(tp=8, weight_bytes=1, expert_parallel=1), 1.0, 1.0, roofline, flops, 1.0)
    tp = moe_layer_time_s(m, hw, make_layout(tp=8, weight_bytes=1), 1.0, 1.0, roofline, flops, 1.0)
    assert float(ep) >= float(tp) * 0.999


def test_formats_pick_their_tensor_cores():
    """MXFP4 experts: FP4 tensor cores on B200 (its MXFP4 peak), weight-only bf16 GEMMs streaming 4.25
    bits on H100; INT4 is weight-only everywhere (0.5625 bytes: 4 bits + a bf16 scale per 32)."""
    h100, b200 = hardware("h100_sxm"), hardware("b200_sxm")
    mx = make_layout(weight_bytes=2, expert_weight_format=MXFP4.code)
    int4 = make_layout(weight_bytes=2, expert_weight_format=INT4.code)
    flops, read, _ = expert_gemm_rate(h100, mx)
    assert float(flops) == pytest.approx(float(h100.bf16_flops_per_s * h100.gemm_flops_efficiency))
    assert float(read) == pytest.approx(0.53125)
    flops, _, _ = expert_gemm_rate(b200, mx)
    assert float(flops) == pytest.approx(float(b200.mxfp4_flops_per_s * b200.fp4_gemm_flops_efficiency))
    flops, read, _ = expert_gemm_rate(b200, int4)
    assert float(flops) == pytest.approx(float(b200.bf16_flops_per_s * b200.gemm_flops_efficiency))
    assert float(read) == pytest.approx(0.5625)
    assert BY_NAME["mxfp4"].other_bytes_per_param == BY_NAME["int4"].other_bytes_per_param == 2.0


def test_dense_models_ignore_the_expert_fields():
    """A dense model has no expert layers: lock-step ranks, EP and the expert format change nothing."""
    m = model_shape(load_model("llama-3.1-70b"))
    hw = hardware("h100_sxm")
    batch = StepBatch(jnp.float32(512.0), jnp.float32(64.0), jnp.float32(64 * 3000.0), jnp.float32(512 * 256.0), jnp.float32(1.0))
    plain = make_layout(tp=4, dp=2, weight_bytes=1)
    odd = make_layout(tp=4, dp=2, weight_bytes=1, lockstep_ranks=2, expert_parallel=1)
    assert float(step_cost(m, hw, plain, batch).total_s) == float(step_cost(m, hw, odd, batch).total_s)
    assert float(weight_bytes_per_gpu(m, plain)) == float(weight_bytes_per_gpu(m, odd))


def test_lockstep_adds_dispatch_and_grows_with_the_group_tokens():
    m = model_shape(load_model("qwen3-235b-a22b"))
    hw = hardware("h200_sxm")
    rank = make_layout(tp=2, dp=4, weight_bytes=1, lockstep_ranks=4, expert_parallel=1)
    batch = StepBatch.decode_only(jnp.float32(32.0), jnp.float32(32 * 2000.0))
    even = step_cost(m, hw, rank, batch)
    busier = step_cost(m, hw, rank, batch, group_batch_tokens=jnp.float32(4 * 32.0 * 3))
    assert float(even.communication_s) > float(step_cost(m, hw, make_layout(tp=2, weight_bytes=1, expert_parallel=1), batch).communication_s)
    assert float(busier.total_s) > float(even.total_s)
    assert float(step_cost(m, hw, rank, batch, group_batch_tokens=jnp.float32(4 * 32.0)).total_s) == pytest.approx(float(even.total_s), rel=1e-6)


def _candidate(tp, lockstep, ep, code, weight_bytes=2.0):
    one = lambda v: jnp.full(1, v, jnp.float32)  # noqa: E731
    return Candidates(digits=jnp.zeros((1, 9), jnp.int32), valid=jnp.ones(1, bool), gpu_index=jnp.zeros(1, jnp.int32),
                      tensor_parallel_size=one(tp), pipeline_parallel_size=one(1), data_parallel_size=one(lockstep),
                      max_num_seqs=one(64), max_num_batched_tokens=one(8192), weight_bytes_per_param=one(weight_bytes),
                      kv_bytes_per_element=one(2), expert_weight_format=one(code), lockstep_ranks=one(lockstep), expert_parallel=one(ep))


def _stage1(gpu, c, model="gpt-oss-120b"):
    hw = take(hardware_table((gpu,), efficiency_for([gpu.name]) if gpu.name != "v100_test" else {gpu.name: efficiency_for(["h100_sxm"])["h100_sxm"]}), jnp.zeros(1, jnp.int32))
    return Reason(int(structure(model_shape(load_model(model)), hw, c, jnp.inf, jnp.bool_(True))[0]))


def test_mxfp4_refused_where_vllm_refuses_it():
    """vLLM's MXFP4 and Marlin INT4 MoE kernels need compute capability 8.0: a V100-class GPU (7.0) is
    refused at stage 1; H100 (9.0) and AMD GPUs (no CUDA capability) run them."""
    v100 = dataclasses.replace(load_gpu("h100_sxm"), name="v100_test", compute_capability=7.0, fp8_flops_per_s=0.0)
    assert _stage1(v100, _candidate(2, 1, 0, MXFP4.code)) == Reason.EXPERT_FORMAT_UNSUPPORTED
    assert _stage1(v100, _candidate(2, 1, 0, INT4.code), "kimi-k2.5") == Reason.EXPERT_FORMAT_UNSUPPORTED
    assert _stage1(load_gpu("h100_sxm"), _candidate(2, 1, 0, MXFP4.code)) == Reason.ADMITTED
    assert _stage1(load_gpu("mi300x"), _candidate(2, 1, 0, MXFP4.code)) == Reason.ADMITTED


def test_expert_parallel_over_one_gpu_is_left_to_the_tp_layout():
    h100 = load_gpu("h100_sxm")
    assert _stage1(h100, _candidate(1, 1, 1, MXFP4.code)) == Reason.EP_ONE_GPU
    assert _stage1(h100, _candidate(2, 1, 1, MXFP4.code)) == Reason.ADMITTED
    assert _stage1(h100, _candidate(1, 2, 1, MXFP4.code)) == Reason.ADMITTED


def test_space_for_a_model():
    """A MoE model gets every layout kind and its checkpoint's expert format; a dense model refuses them."""
    space = load_space("small")
    gpt = space.for_model(load_model("gpt-oss-120b"))
    assert gpt.layout_kind == ("tp", "ep", "dp", "dp_ep") and gpt.weight_dtype == ("mxfp4",)
    labels = gpt.layout_kind_labels()
    sizes = [d for d in space.data_parallel_size if d > 1 and d & (d - 1) == 0]
    assert labels == ("tp", "ep", *(f"dp:{d}" for d in sizes), *(f"dp_ep:{d}" for d in sizes))
    assert gpt.replace(lockstep_sizes=(3, 6)).layout_kind_labels() == ("tp", "ep", "dp:3", "dp:6", "dp_ep:3", "dp_ep:6")
    assert space.for_model(load_model("llama-3.1-70b")).layout_kind == ("tp",)
    with pytest.raises(PlanError, match="layout_kind"):
        space.replace(layout_kind=("dp_ep",)).for_model(load_model("llama-3.1-70b"))
    with pytest.raises(PlanError, match="weight_dtype"):
        space.replace(weight_dtype=("int4",)).for_model(load_model("llama-3.1-70b"))


def test_predict_rows_read_vllms_flags():
    """predict's rows: data_parallel_size is lock-step for a MoE model (vLLM's --data-parallel-size),
    enable_expert_parallel turns EP on; a dense model refuses EP and expert-only formats in one line."""
    from jaxplan.prediction import row_batches

    base = {"gpu": "h200_sxm", "tensor_parallel_size": 2, "isl": 1000, "osl": 100, "concurrency": 8}
    (moe,) = row_batches([{**base, "model": "gpt-oss-120b", "weight_dtype": "mxfp4", "data_parallel_size": 4, "enable_expert_parallel": "true"}])
    assert float(moe.layout.lockstep_ranks[0]) == 4 and float(moe.layout.expert_parallel[0]) == 1
    assert float(moe.layout.expert_weight_format[0]) == MXFP4.code and float(moe.layout.weight_bytes_per_param[0]) == 2
    (dense,) = row_batches([{**base, "model": "llama-3.1-70b", "data_parallel_size": 4}])
    assert float(dense.layout.lockstep_ranks[0]) == 1
    with pytest.raises(PlanError, match="enable_expert_parallel"):
        row_batches([{**base, "model": "llama-3.1-70b", "enable_expert_parallel": True}])
    with pytest.raises(PlanError, match="weight_dtype"):
        row_batches([{**base, "model": "llama-3.1-70b", "weight_dtype": "int4"}])
