"""The MoE layer physics (jaxplan/physics/moe.py) against independent references: Monte-Carlo routing,
hand-computed shards and dispatch bytes, and the invariants that tie the layout kinds together."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.calibrate import _data
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
    expert_kernel,
    expert_peak_flops_per_s,
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


def test_a_norm_over_all_heads_adds_one_small_all_reduce_per_attention_layer():
    """MiniMax-M2.5 normalises q and k over all their heads (qk_norm_type "per_layer"), so under TP
    vLLM all-reduces the two float32 variances of every token in each of its 62 attention layers: at
    TP4 on H200, 16 decode tokens, a third all-reduce of 16 x 8 bytes per layer (latency-bound) beside
    the two of 16 x 3,072 x 2 bytes. At TP1, and for a model normalising per head, nothing changes."""
    hw = hardware("h200_sxm")
    spec = load_model("minimax-m2.5")
    per_head = model_shape(dataclasses.replace(spec, qk_norm_across_heads=False))
    m = model_shape(spec)
    assert spec.qk_norm_across_heads and float(m.norm_allreduce_layers) == 62.0 and float(per_head.norm_allreduce_layers) == 0.0
    batch = StepBatch.decode_only(jnp.float32(16.0), jnp.float32(2048.0))
    tp4, tp1 = make_layout(tp=4, weight_bytes=1, kv_bytes=1), make_layout(tp=1, weight_bytes=1, kv_bytes=1)
    link = float(hw.intra_node_bandwidth_bytes_per_s) * float(allreduce_efficiency(hw, 4.0))
    norm_allreduce = float(hw.allreduce_latency_s) + 2 * 3 / 4 * (16 * 8.0) / link
    extra = float(step_cost(m, hw, tp4, batch).communication_s) - float(step_cost(per_head, hw, tp4, batch).communication_s)
    assert extra == pytest.approx(62 * norm_allreduce, rel=1e-4)
    assert float(step_cost(m, hw, tp1, batch).total_s) == float(step_cost(per_head, hw, tp1, batch).total_s)
    llama = model_shape(load_model("llama-3.1-70b"))
    assert float(llama.norm_allreduce_layers) == 0.0


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


def test_formats_pick_their_peaks():
    """MXFP4 experts: at the FP8 rate on B200 (MX tensor cores, MXFP8 activations), weight-only on the
    BF16 peak on H100; INT4 weight-only everywhere; FP8 on FP8 tensor cores; NVFP4 on B200's FP4 ones."""
    h100, b200 = hardware("h100_sxm"), hardware("b200_sxm")
    code = {name: float(BY_NAME[name].code) for name in BY_NAME}
    assert float(expert_peak_flops_per_s(h100, code["mxfp4"])) == float(h100.bf16_flops_per_s)
    assert float(expert_peak_flops_per_s(b200, code["mxfp4"])) == float(b200.fp8_flops_per_s)
    assert float(expert_peak_flops_per_s(b200, code["int4"])) == float(b200.bf16_flops_per_s)
    assert float(expert_peak_flops_per_s(h100, code["fp8"])) == float(h100.fp8_flops_per_s)
    assert float(expert_peak_flops_per_s(b200, code["nvfp4"])) == float(b200.fp4_flops_per_s)
    floor_s, flops, bytes_per_s = expert_kernel(b200, code["int4"])
    assert float(floor_s) == pytest.approx(float(b200.moe_int4_floor_s))
    assert float(flops) == pytest.approx(float(b200.bf16_flops_per_s * b200.moe_int4_flops_fraction))
    assert float(bytes_per_s) == pytest.approx(float(b200.hbm_bandwidth_bytes_per_s * b200.moe_int4_hbm_fraction))
    assert BY_NAME["mxfp4"].other_bytes_per_param == BY_NAME["int4"].other_bytes_per_param == 2.0


def test_moe_layer_by_hand():
    """gpt-oss-120b's MoE layer on H100, TP2 sliced, 64 decode tokens, by hand: the fused kernel's floor,
    plus the touched experts' MXFP4 bytes (128 (1 - (1 - 4/128)^64) experts, half of each) at its
    streaming rate, plus 2 x 256 pairs x half an expert's parameters at its GEMM rate, plus the
    activations (no shared experts) at the dense decode rate, where the roofline of a lone term m is
    (1 + sqrt(1.01)) m / 2."""
    m = model_shape(load_model("gpt-oss-120b"))
    hw = hardware("h100_sxm")
    layout = make_layout(tp=2, weight_bytes=2, expert_weight_format=MXFP4.code)
    tokens = 64.0
    expert = 3 * 2880 * 2880
    touched = 128 * (1 - (1 - 4 / 128) ** tokens)
    routed_s = (touched / 2 * expert * 0.53125 / (3.35e12 * float(hw.moe_mxfp4_hbm_fraction))
                + 2 * tokens * 4 * expert / 2 / (989e12 * float(hw.moe_mxfp4_flops_fraction)))
    # Sliced: every token in and its 4 experts' activations' slice out, 2 bytes each.
    activations_s = tokens * (2880 + 4 * 2880 / 2) * 2 / (3.35e12 * float(hw.memory_bandwidth_efficiency))
    expected = float(hw.moe_mxfp4_floor_s) + routed_s + activations_s * (1 + np.sqrt(1.01)) / 2
    got = moe_layer_time_s(m, hw, layout, tokens, tokens, roofline, 1e15, 2.0)
    assert float(got) == pytest.approx(expected, rel=1e-3)


@pytest.mark.skipif(not _data.data_root_exists(), reason="measured data not present (../shared/data or $JAXPLAN_SHARED_DATA)")
@pytest.mark.parametrize(("gpu", "fmt", "dtype", "shape"), [
    ("h100_sxm", "mxfp4", "w4a16_mxfp4", (2880, 2880, 4, 128)),  # gpt-oss-120b
    ("h100_sxm", "fp8", "fp8_block", (3072, 1536, 8, 256)),  # MiniMax-M2.5
    ("h200_sxm", "int4", "int4_wo", (7168, 2048, 8, 384)),  # Kimi-K2.5
    ("b200_sxm", "nvfp4", "nvfp4", (7168, 2048, 8, 384)),
])
def test_moe_layer_against_the_kernel_table(gpu, fmt, dtype, shape):
    """The physics' routed-expert time (shared experts and activations left out) against NVIDIA's timed
    fused-MoE kernel for one model's shape, balanced routing, 1-16,384 tokens, each sliced over 1-8 GPUs:
    median |error| within 15%, every row within a factor 2 (the fields are fitted over every shape of
    the table, not this one's, and balanced routing touches min(E, T k) experts where the physics
    expects E (1 - (1 - k / E)^T))."""
    from jaxplan.calibrate.kernels import load_moe
    from jaxplan.calibrate.moe_kernels import moe_kernel_prior

    hidden, intermediate, k, experts = shape
    spec = load_gpu(gpu)
    table = load_moe(gpu)
    rows = ((table.dtype == dtype) & (table.distribution == "balanced") & (table.moe_ep == 1) & (table.hidden_size == hidden)
            & (table.intermediate_size == intermediate) & (table.top_k == k) & (table.num_experts == experts) & (table.moe_tp <= 8))
    assert rows.sum() >= 10
    params = {**efficiency_for([gpu])[gpu], **moe_kernel_prior(gpu, spec)}
    hw = jax.tree.map(lambda x: x[0], hardware_table((spec,), {gpu: params}))
    model = model_shape(load_model({"mxfp4": "gpt-oss-120b", "fp8": "minimax-m2.5", "int4": "kimi-k2.5", "nvfp4": "kimi-k2.5"}[fmt]))
    model = model._replace(hidden_size=float(hidden), expert_params=float(3 * hidden * intermediate), experts_per_token=float(k),
                           num_experts=float(experts), shared_experts=0.0, ffn_intermediate_per_token=0.0)
    predicted = np.array([float(moe_layer_time_s(model, hw, make_layout(tp=int(tp), weight_bytes=2, expert_weight_format=BY_NAME[fmt].code),
                                                 float(t), float(t), lambda c, m: 0.0 * c, 1e15, 2.0))
                          for t, tp in zip(table.tokens[rows], table.moe_tp[rows])])
    measured = table.latency_s[rows]
    ratio = predicted / measured
    assert np.median(np.abs(ratio - 1)) < 0.15, np.percentile(ratio, [10, 50, 90])
    assert ratio.min() > 0.5 and ratio.max() < 2.0, (ratio.min(), ratio.max())


def test_dense_models_ignore_the_expert_fields():
    """A dense model has no expert layers: lock-step ranks, EP and the expert format change nothing."""
    m = model_shape(load_model("llama-3.1-70b"))
    hw = hardware("h100_sxm")
    batch = StepBatch(jnp.float32(512.0), jnp.float32(64.0), jnp.float32(64 * 3000.0), jnp.float32(512 * 256.0), jnp.float32(1.0), jnp.float32(0.0))
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


def test_lockstep_group_steps_carry_any_ranks_chunk():
    """Stage 4 under lock-step: a group step is a chunk step when any of its D ranks carries a chunk,
    1 - (1 - f)^D of the steps for a rank's share f, and then the experts see the chunks of
    D f / (1 - (1 - f)^D) ranks; with D = 1 nothing changes."""
    from jaxplan.physics.steady_state import _steps
    from jaxplan.physics.traffic import workload_params
    from jaxplan.specs import load_workload

    m = model_shape(load_model("qwen3-235b-a22b"))
    hw = hardware("h200_sxm")
    w = workload_params(load_workload("coding"))
    b = jnp.float32(16.0)
    one = _steps(m, hw, make_layout(tp=2, weight_bytes=1, kv_bytes=1, max_num_batched_tokens=2048, expert_parallel=1), w, b)
    group = _steps(m, hw, make_layout(tp=2, dp=4, weight_bytes=1, kv_bytes=1, max_num_batched_tokens=2048, lockstep_ranks=4, expert_parallel=1), w, b)
    f = float(one.chunk_fraction)
    assert 0.05 < f < 0.95
    f_group = 1.0 - (1.0 - f) ** 4
    assert float(group.chunk_fraction) == pytest.approx(f_group, rel=1e-5)
    chunk = float(group.chunk_tokens)
    layout = make_layout(tp=2, dp=4, weight_bytes=1, kv_bytes=1, max_num_batched_tokens=2048, lockstep_ranks=4, expert_parallel=1)
    isl_eff = float(w.isl_tokens * (1.0 - w.prefix_hit_rate))
    cached = float(w.isl_tokens) - isl_eff
    # (Qwen3 is GQA: the chunk's cached context costs nothing beyond its attention pairs.)
    with_chunk = StepBatch(jnp.float32(chunk), b, b * (w.isl_tokens + 0.5 * w.osl_tokens), jnp.float32(chunk * (cached + 0.5 * isl_eff)), jnp.float32(1.0), jnp.float32(0.0))
    expected_chunk_s = step_cost(m, hw, layout, with_chunk, group_batch_tokens=jnp.float32(4 * 16.0 + 4 * f / f_group * chunk)).total_s
    assert float(group.chunk_s) == pytest.approx(float(expected_chunk_s), rel=1e-5)
    assert float(group.mean_s) == pytest.approx(f_group * float(group.chunk_s) + (1 - f_group) * float(group.decode_s), rel=1e-5)
