"""The step-time model against a plain-NumPy float64 reference, and its physical invariants.

The reference below is written from the documentation of jaxplan/physics/step_time.py (module and
function docstrings): per operator a smooth roofline of FLOPs over achievable FLOP/s and bytes over
achievable bandwidth, summed over layers for one PP micro-batch (batch / PP), plus two all-reduces
per layer under TP, PP - 1 point-to-point hops, a latency per layer, and per-step and per-sequence
overheads. It is organised differently from the code (a list of operators, each priced once) and
computes in float64; the code computes in float32. FP8 GEMMs add the quantisation of their input
(bytes per input element at the HBM bandwidth).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exercised import counted, exercised
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxplan.physics import (
    StepBatch,
    hardware_table,
    kv_blocks_per_replica,
    make_layout,
    model_shape,
    step_time_s,
    take,
    traced,
    weight_bytes_per_gpu,
    workload_params,
)
from jaxplan.physics.params import efficiency_for
from jaxplan.physics.steady_state import estimate, max_concurrency
from jaxplan.physics.step_time import gemm_time_s, roofline
from jaxplan.specs import known, load_gpu, load_model, load_workload
from jaxplan.specs.workload import Arrival

MODELS = tuple(known("models"))
DENSE = ("llama-3.1-70b", "llama-3.1-8b", "qwen3-32b", "gemma-3-27b", "qwen3.5-27b")
GPUS = tuple(known("gpus"))
N = 64  # random layouts/batches per hypothesis example (vectorised: one jit call)
# float32 vs float64: each of the ~100 operations rounds to 2^-24 relative; sums of positive terms
# do not cancel, so the result is within ~100 x 6e-8 = 6e-6 relative. 2e-5 leaves headroom.
F32_REL = 2e-5
# Monotonicity in float32: a change that is mathematically >= 0 may round to a few ulps < 0.
ULPS = 1e-6

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True)


@pytest.fixture(scope="module")
def hardware():
    gpus = tuple(load_gpu(n) for n in GPUS)
    return hardware_table(gpus, efficiency_for(GPUS))


@pytest.fixture(scope="module")
def shapes():
    return {name: model_shape(load_model(name)) for name in MODELS}


@jax.jit
def _step_jit(m, hw_table, gpu, lay: dict, sb: StepBatch):
    """step_time_s of the layouts `lay` [n] on GPU `gpu` of `hw_table`: the gather, the layout and the
    step in one program, the model an argument (`traced`, as the sweep passes it), so one compilation
    serves every model and a hypothesis example costs one call, not ~100 small eager ones."""
    hw = take(hw_table, jnp.full(lay["tp"].shape, gpu, jnp.int32))
    return step_time_s(m, hw, make_layout(lay["tp"], lay["pp"], 1.0, lay["wb"], lay["kvb"]), sb)


@jax.jit
def _estimate_jit(m, hw, layout, w):
    return estimate(m, hw, layout, w, 0.9), max_concurrency(m, hw, layout, w, 0.9)[0]


@jax.jit
def _held_jit(m, hw, layout, w, b):
    """rate per replica x the time a request holds a slot at concurrency b (Little's law's right side)."""
    from jaxplan.physics.steady_state import _steps, slot_time_s

    return w.request_rate_per_s / layout.data_parallel_size * slot_time_s(_steps(m, hw, layout, w, b), w)


@jax.jit
def _estimate_jacobian(x, m, hw, layout, w):
    """d(sum over candidates of each estimate output)/d(ISL, OSL, rate, hit rate): [outputs, 4].
    Infinite values (TTFT when overloaded, by design) are zeroed before summing. Reverse mode, one
    pullback per output: jax.jacrev's rows, but the pullback runs in a loop rather than vmapped over
    the outputs, which XLA compiles in ~40% less time (the vmapped backward pass of the solver's loop)."""

    def sums(x):
        ww = w._replace(isl_tokens=x[0], osl_tokens=x[1], request_rate_per_s=x[2], prefix_hit_rate=x[3])
        est = estimate(m, hw, layout, ww, 0.9)
        return jnp.stack([jnp.where(jnp.isfinite(v), v, 0.0).sum() for name, v in est._asdict().items() if name != "bound"])

    outputs, pullback = jax.vjp(sums, x)
    return jax.lax.map(lambda row: pullback(row)[0], jnp.eye(outputs.shape[0], dtype=outputs.dtype))


# ---- the float64 reference ------------------------------------------------------------------------
def ref_roofline(c, m):
    """Smooth max, +10% of max(c, m) where c = m (documented), -> max(c, m) where one dominates."""
    return 0.5 * (c + m + np.sqrt((c - m) ** 2 + (0.1 * (c + m)) ** 2))


def ref_step_time(m, hw: dict, lay: dict, batch: dict) -> np.ndarray:
    """Seconds per step, float64, vectorised over the arrays in `lay`, `hw` and `batch`."""
    tp, pp = lay["tp"], lay["pp"]
    wb, kvb = lay["wb"], lay["kvb"]
    h, V = m.hidden_size, m.vocab_size
    batch = {"prefill_context": 0.0 * batch["prefill"], **batch}
    micro = {k: v / pp for k, v in batch.items()}  # one of PP micro-batches (they pipeline)
    T = micro["prefill"] + micro["decode"]
    logit_rows = micro["decode"] + micro["prefill_seqs"]  # a logit per decoding request and per prompt chunk
    # NVFP4 weights (0.5625 B) run on FP4 tensor cores at their own efficiency, FP8 ones (1 B) on FP8
    # tensor cores; where the GPU lacks those cores the smaller weights are read and the GEMMs run in bf16.
    fp4 = (wb < 0.75) & (hw["fp4_flops_per_s"] > 0)
    fp8 = (wb == 1.0) & (hw["fp8_flops_per_s"] > 0)
    gemm_rate = np.select([fp4, fp8], [hw["fp4_flops_per_s"] * hw["fp4_gemm_flops_efficiency"], hw["fp8_flops_per_s"] * hw["gemm_flops_efficiency"]],
                          hw["bf16_flops_per_s"] * hw["gemm_flops_efficiency"])
    bw = hw["hbm_bandwidth_bytes_per_s"] * hw["memory_bandwidth_efficiency"]
    attn_rate = hw["bf16_flops_per_s"] * hw["attention_flops_efficiency"]

    # (count of layers, FLOPs, bytes, FLOP/s, least seconds or None) per operator of one layer; bytes
    # always at `bw`. A weight GEMM takes at least its dtype's floor (smoothly, like the roofline);
    # the paired ones (QKV + O, in + out projections, gate/up + down, the experts' two) two floors.
    floor = np.select([fp4, fp8], [hw["fp4_gemm_floor_s"], hw["fp8_gemm_floor_s"]], hw["gemm_floor_s"])
    # The weights a GEMM streams cost their stored bytes, but NVFP4 ones on FP4 tensor cores the GPU's
    # `fp4_weight_read_bytes_per_param` (its kernels stream them slower than FP8's stream one byte).
    stored = wb
    wb = np.where(fp4, hw["fp4_weight_read_bytes_per_param"], wb)
    ops = []
    kv_ways = np.minimum(tp, m.kv_heads)
    whole = m.replicated_attn_params_per_layer  # MLA's down-projections and an indexer: on every rank
    attn_w = (m.attn_params_per_layer - m.kv_proj_params_per_layer - whole) / tp + m.kv_proj_params_per_layer / kv_ways + whole
    ops.append((m.softmax_layers, 2 * T * attn_w, attn_w * wb + T * (h + 2 * h / tp) * 2, gemm_rate, 2 * floor))
    lin_w = m.linear_params_per_layer / tp
    ops.append((m.linear_layers, 2 * T * lin_w, lin_w * wb + T * (h + 2 * h / tp) * 2, gemm_rate, 2 * floor))
    ffn = m.ffn_intermediate_per_token / tp
    mlp_w = m.dense_mlp_params_per_layer / tp
    ops.append((m.dense_mlp_layers, 2 * T * mlp_w, mlp_w * wb + T * (h + ffn) * 2, gemm_rate, 2 * floor))
    # MoE: the shared experts and the activations as a dense GEMM (one roofline, no floor); the routed
    # experts as NVIDIA's fused-MoE tables time them, per format (the weights' here): the kernel's least
    # time + the stored bytes of every expert at least one token was routed to, E (1 - (1 - k/E)^T) under
    # uniform routing, at its streaming rate + the k experts' FLOPs per token at its GEMM rate.
    E, k = m.num_experts, m.experts_per_token
    ops.append((m.moe_layers, 2 * T * m.shared_experts * m.expert_params / tp,
                m.shared_experts * m.expert_params / tp * wb + T * (h + ffn) * 2, gemm_rate, None))
    fmt = np.select([stored < 0.75, stored == 1.0], ["nvfp4", "fp8"], "bf16")
    moe_field = lambda what: np.select([fmt == "nvfp4", fmt == "fp8"], [hw[f"moe_nvfp4_{what}"], hw[f"moe_fp8_{what}"]], hw[f"moe_bf16_{what}"])  # noqa: E731
    peak = np.select([(fmt == "nvfp4") & (hw["fp4_flops_per_s"] > 0), (fmt == "fp8") & (hw["fp8_flops_per_s"] > 0)],
                     [hw["fp4_flops_per_s"], hw["fp8_flops_per_s"]], hw["bf16_flops_per_s"])
    touched = E * (1 - (1 - k / E) ** T)
    routed = m.moe_layers * (moe_field("floor_s") + 2 * T * k * m.expert_params / tp / (peak * moe_field("flops_fraction"))
                             + touched * m.expert_params / tp * stored / (hw["hbm_bandwidth_bytes_per_s"] * moe_field("hbm_fraction")))
    head_w = V * h / tp  # LM head in BF16 on BF16 tensor cores
    ops.append((1.0, 2 * logit_rows * head_w, head_w * 2 + logit_rows * (h + V / tp) * 2, hw["bf16_flops_per_s"] * hw["gemm_flops_efficiency"], hw["gemm_floor_s"]))
    # Attention cores. KV bytes of one token in one layer on one GPU:
    kv_ways_cache = np.where(m.kv_split_by_tp > 0, np.minimum(tp, m.kv_heads), 1.0)
    # (a sparse-attention model also stores its indexer's key, whole on every rank)
    # (sparse MLA in FP8 also stores its scales and BF16 RoPE dims, vLLM's 656-B fp8_ds_mla record)
    fp8_extra = np.where(kvb < 1.5, m.fp8_kv_extra_bytes_per_token_per_layer, 0.0)
    kv_token = m.kv_elements_per_token_per_layer / kv_ways_cache * kvb + fp8_extra + m.indexer_bytes_per_token_per_layer
    # Decode reads an FP8 cache at the GPU's `fp8_kv_read_bytes_per_element` (its kernels dequantise).
    kv_token_read = m.kv_elements_per_token_per_layer / kv_ways_cache * np.where(kvb < 1.5, hw["fp8_kv_read_bytes_per_element"], kvb) + fp8_extra
    heads = m.q_heads / tp
    sliding_read = np.minimum(micro["context"], micro["decode"] * m.sliding_window_tokens)
    # DeepSeek sparse attention: a decoding query reads its top-k tokens; a prompt chunk whose queries
    # reach past k attends to k tokens each in the latent (decode) dims; the indexer scores every pair.
    topk = m.sparse_attention_topk
    full_read = np.where(topk > 0, np.minimum(micro["context"], micro["decode"] * topk), micro["context"])
    # Llama 4's chunked layers: at most a chunk a decoding request, a chunk a prompt token
    chunked_read = np.minimum(full_read, micro["decode"] * m.attention_chunk_tokens)
    read = (m.full_layers - m.chunked_layers) * full_read + m.chunked_layers * chunked_read + m.sliding_layers * sliding_read  # token-layers of KV read
    ops.append((1.0, 2 * heads * (m.attn_score_dim_decode + m.attn_value_dim_decode) * read, read * kv_token_read, attn_rate, None))
    sparse_prefill = (topk > 0) & (micro["pairs"] > micro["prefill"] * topk)
    prefill_attention_flops = np.where(sparse_prefill, 2 * heads * (m.attn_score_dim_decode + m.attn_value_dim_decode) * micro["prefill"] * topk,
                                       2 * heads * (m.attn_score_dim_prefill + m.attn_value_dim_prefill) * micro["pairs"])
    chunked_prefill_flops = 2 * heads * (m.attn_score_dim_prefill + m.attn_value_dim_prefill) * np.minimum(micro["pairs"], micro["prefill"] * m.attention_chunk_tokens)
    ops.append((1.0, prefill_attention_flops * (m.softmax_layers - m.chunked_layers) + chunked_prefill_flops * m.chunked_layers,
                m.softmax_layers * micro["prefill"] * kv_token, attn_rate, None))
    ops.append((np.where(topk > 0, m.full_layers, 0.0), m.indexer_flops_per_pair_per_layer * (micro["pairs"] + micro["context"]),
                m.indexer_bytes_per_token_per_layer * micro["context"], attn_rate, None))
    # Dense MLA re-up-projects each prompt chunk's cached context (kv_b_proj: the latent in, every head's
    # no-RoPE key and value out, the TP shard of the heads); the chunk's own tokens stream its weights.
    upproj_in, upproj_out = m.context_upprojection_in_per_token, m.context_upprojection_out_per_token / tp
    ops.append((np.where(upproj_in > 0, m.softmax_layers, 0.0), 2 * micro["prefill_context"] * upproj_in * upproj_out,
                micro["prefill_context"] * (upproj_in + upproj_out) * 2, gemm_rate, None))
    seqs = micro["decode"] + micro["prefill_seqs"]
    ops.append((m.linear_layers, (micro["prefill"] + micro["decode"]) * m.linear_flops_per_token_per_layer / tp,
                2 * seqs * m.linear_state_bytes_per_layer / tp, attn_rate, None))
    compute = sum(n * (ref_roofline(f / rate, b / bw) if least is None else ref_roofline(ref_roofline(f / rate, b / bw), least)) for n, f, b, rate, least in ops)
    compute = compute + np.where(m.moe_layers > 0, routed, 0.0)
    # FP8 and NVFP4 GEMMs first quantise their input (a kernel of its own, at the HBM bandwidth): per token the
    # hidden state into QKV and into gate/up (or the experts), the TP shard of the attention output
    # into O and of the FFN activation into the down projection.
    inputs = (m.softmax_layers + m.linear_layers) * (h + h / tp) + (m.dense_mlp_layers + m.moe_layers) * (h + ffn)
    quant_bytes = np.select([fp4, fp8], [hw["fp4_quant_bytes_per_element"], hw["fp8_quant_bytes_per_element"]], 0.0)
    compute = compute + T * inputs * quant_bytes / bw

    # Communication: 2 ring all-reduces per layer of the micro-batch's hidden states (BF16).
    message = T * h * 2
    spans_tp = tp > hw["gpus_per_node"]
    link = np.where(spans_tp, hw["inter_node_bandwidth_bytes_per_s"], hw["intra_node_bandwidth_bytes_per_s"])
    # The efficiency is the 8-GPU value; 2 GPUs reach `allreduce_two_gpu_ratio` times it, 4 GPUs the
    # square root of that ratio times it.
    group = np.select([tp <= 2, tp <= 4], [hw["allreduce_two_gpu_ratio"], np.sqrt(hw["allreduce_two_gpu_ratio"])], 1.0)
    ring = 2 * (tp - 1) / tp * message / (link * hw["allreduce_bandwidth_efficiency"] * group)
    allreduce = np.where(tp > 1, hw["allreduce_latency_s"] * np.where(spans_tp, 4.0, 1.0) + ring, 0.0)
    spans_replica = tp * pp > hw["gpus_per_node"]
    p2p_link = np.where(spans_replica, hw["inter_node_bandwidth_bytes_per_s"], hw["intra_node_bandwidth_bytes_per_s"])
    p2p = (pp - 1) * (hw["p2p_latency_s"] + message / p2p_link)
    # Uneven stages (PP does not divide the layers): every stage runs PP micro-batches a step, so the
    # largest, ceil(L / PP) layers, sets the pace: the layer terms (and the head with them) at PP x its layers.
    largest_stage = np.ceil(m.num_layers / pp)
    uneven = pp * largest_stage / m.num_layers
    comm = 2 * m.num_layers * allreduce * uneven + p2p
    seqs = batch["decode"] + batch["prefill_seqs"]
    overhead = m.num_layers * hw["layer_latency_s"] * uneven + hw["step_overhead_s"] + hw["per_seq_overhead_s"] * seqs
    # Under PP, vLLM's V0 engine processes each sequence's output on the step's path (no async output
    # processing): pipeline_seq_overhead_s more per running sequence.
    overhead = overhead + np.where(pp > 1, hw["pipeline_seq_overhead_s"] * seqs, 0.0)
    return compute * uneven + comm + overhead


# ---- random layouts and batches -------------------------------------------------------------------
def random_case(seed: int, n: int = N):
    """Layouts [n] (TP in 1..16, PP in 1..4, dtypes) and batches [n] with a mix of decode and prefill."""
    rng = np.random.default_rng(seed)
    lay = {
        "tp": rng.choice([1.0, 2.0, 4.0, 8.0, 16.0], n), "pp": rng.choice([1.0, 2.0, 4.0], n),
        "wb": rng.choice([0.5625, 1.0, 2.0], n), "kvb": rng.choice([1.0, 2.0], n),
    }
    decode = np.floor(rng.uniform(0, 1, n) ** 2 * 1024) * rng.choice([0.0, 1.0], n, p=[0.2, 0.8])
    per_request = rng.uniform(1, 65536, n)
    prefill = np.floor(rng.uniform(0, 8192, n)) * rng.choice([0.0, 1.0], n)
    prefill_seqs = np.where(prefill > 0, rng.integers(1, 4, n), 0).astype(float)
    cached = rng.uniform(0, 32768, n)
    batch = {
        "decode": decode, "context": decode * per_request, "prefill": prefill, "prefill_seqs": prefill_seqs,
        "pairs": prefill * (cached + prefill / 2), "prefill_context": np.where(prefill > 0, prefill_seqs * cached, 0.0),
    }
    return lay, batch


def code_step_time(m, hw_table, gpu: int, lay: dict, batch: dict) -> np.ndarray:
    batch = {"prefill_context": 0.0 * batch["prefill"], **batch}
    sb = StepBatch(*(np.asarray(batch[k], np.float32) for k in ("prefill", "decode", "context", "pairs", "prefill_seqs", "prefill_context")))
    lay = {k: np.asarray(lay[k], np.float32) for k in ("tp", "pp", "wb", "kvb")}
    return np.asarray(_step_jit(traced(m), hw_table, np.int32(gpu), lay, sb), np.float64)


def decode_step_s(m, hw_table, gpu: int, lay: dict, requests: float, context: float, fp8_read_bytes=None) -> float:
    """One decode step of `requests` at `context` tokens each, the GPU's FP8 KV read cost set to
    `fp8_read_bytes` (None: as calibrated)."""
    if fp8_read_bytes is not None:
        hw_table = hw_table._replace(fp8_kv_read_bytes_per_element=hw_table.fp8_kv_read_bytes_per_element.at[gpu].set(fp8_read_bytes))
    batch = {"decode": np.array([requests]), "context": np.array([requests * context]), "prefill": np.array([0.0]), "prefill_seqs": np.array([0.0]), "pairs": np.array([0.0])}
    return float(code_step_time(m, hw_table, gpu, lay, batch)[0])


def hw_dict(hw_table, gpu: int) -> dict:
    return {field: float(np.asarray(v, np.float64)[gpu]) for field, v in hw_table._asdict().items()}


# ---- tests ------------------------------------------------------------------------------------------
def test_roofline_is_a_smooth_max_at_most_10_percent_above():
    c = np.array([1.0, 2.0, 1e-3, 0.0, 5.0, 1e3])
    m = np.array([1.0, 0.0, 1.0, 3.0, 5.0, 1e-3])
    got = np.asarray(roofline(jnp.asarray(c, jnp.float32), jnp.asarray(m, jnp.float32)), np.float64)
    top = np.maximum(c, m)
    assert np.all(got >= top * (1 - ULPS))  # never below the true max
    assert np.all(got <= 1.1 * top * (1 + ULPS))  # at most 10% above it
    # Where the terms are equal it is exactly 10% above (the docstring): (2 + 0.2) / 2 = 1.1.
    assert got[0] == pytest.approx(1.1, rel=1e-6) and got[4] == pytest.approx(5.5, rel=1e-6)
    # Where one term dominates 1000:1 it is within 0.3% of it: (1 + sqrt(1 + 0.01)) / 2 = 1.0025.
    assert got[5] == pytest.approx(1e3 * 1.0025, rel=1e-3)
    # Gradient finite where both are 0 (an absent operator).
    grads = jax.grad(lambda x: roofline(x, x))(0.0)
    assert np.isfinite(grads)


@SETTINGS
@given(model=st.sampled_from(MODELS), gpu=st.integers(0, len(GPUS) - 1), seed=st.integers(0, 2**31 - 1))
def test_step_time_matches_float64_reference(shapes, hardware, model, gpu, seed):
    m = shapes[model]
    lay, batch = random_case(seed)
    want = ref_step_time(m, hw_dict(hardware, gpu), lay, batch)
    got = code_step_time(m, hardware, gpu, lay, batch)
    np.testing.assert_allclose(got, want, rtol=F32_REL, err_msg=f"{model} on {GPUS[gpu]}")


def test_reference_hand_case_decode_step(shapes, hardware):
    """One decode step of Llama-3.1-8B at TP=1 on an H100, 1 request with 1,000 tokens of context:
    streaming the weights dominates.
      weights read: 32 layers x (attention 41,943,040 + MLP 176,160,768) + LM head 525,336,576
                    = 7,504,658,432 params x 2 B = 15,009,316,864 B
      KV read:      1,000 tokens x 32 layers x (2 x 8 x 128) x 2 B = 131,072,000 B
    Each operator's roofline lies in [max, 1.1 max], so the step lies between (bytes / achievable
    bandwidth) and 1.1 x that plus the fixed latencies."""
    m = shapes["llama-3.1-8b"]
    h100 = GPUS.index("h100_sxm")
    lay = {"tp": np.array([1.0]), "pp": np.array([1.0]), "wb": np.array([2.0]), "kvb": np.array([2.0])}
    batch = {"decode": np.array([1.0]), "context": np.array([1000.0]), "prefill": np.array([0.0]), "prefill_seqs": np.array([0.0]), "pairs": np.array([0.0])}
    hw = hw_dict(hardware, h100)
    streamed = 32 * (41_943_040 + 176_160_768) * 2 + 128_256 * 4096 * 2
    assert streamed == 15_009_316_864
    kv = 1000 * 32 * 2 * 8 * 128 * 2
    floor_s = (streamed + kv) / (hw["hbm_bandwidth_bytes_per_s"] * hw["memory_bandwidth_efficiency"])
    fixed_s = 32 * hw["layer_latency_s"] + hw["step_overhead_s"] + hw["per_seq_overhead_s"]
    got = float(code_step_time(m, hardware, h100, lay, batch)[0])
    # 1e-3 relative slack: the activations' bytes (a few MB) are not in the hand count.
    assert floor_s < got < (1.1 * floor_s + fixed_s) * 1.001
    assert got == pytest.approx(float(ref_step_time(m, hw, lay, batch)[0]), rel=F32_REL)


def test_mla_prefill_up_projects_the_cached_context_again(shapes, hardware):
    """DeepSeek-R1 (dense MLA) at TP8 on an H200, FP8 weights: a 512-token prompt chunk after 8,192
    cached tokens costs what the same chunk costs without a cached context to up-project (the same
    attention pairs), plus vLLM's re-up-projection of the context at the chunk:
      kv_b_proj: 512 latent x 128 heads x (128 + 128) = 16,777,216 params a layer, 2,097,152 a GPU
      FLOPs:     2 x 8,192 x 2,097,152 = 34,359,738,368 a layer
      bytes:     8,192 x (512 latent + 16 heads x 256) x 2 B = 75,497,472 a layer
    over 61 layers, at the GPU's FP8 GEMM rate and achievable bandwidth. Llama-3.1-70B (GQA) and GLM-5
    (sparse MLA, whose prefill attends in the latent space) pay nothing for it."""
    h200 = GPUS.index("h200_sxm")
    hw = hw_dict(hardware, h200)
    lay = {"tp": np.array([8.0]), "pp": np.array([1.0]), "wb": np.array([1.0]), "kvb": np.array([1.0])}
    chunk = {"decode": np.array([0.0]), "context": np.array([0.0]), "prefill": np.array([512.0]), "prefill_seqs": np.array([1.0]),
             "pairs": np.array([512.0 * (8192 + 256)])}
    flops, moved = 2 * 8192 * 2_097_152, 8192 * (512 + 16 * 256) * 2
    assert (flops, moved) == (34_359_738_368, 75_497_472)
    want = 61 * ref_roofline(flops / (hw["fp8_flops_per_s"] * hw["gemm_flops_efficiency"]), moved / (hw["hbm_bandwidth_bytes_per_s"] * hw["memory_bandwidth_efficiency"]))
    for model, extra in (("deepseek-r1", want), ("llama-3.1-70b", 0.0), ("glm-5", 0.0)):
        without = float(code_step_time(shapes[model], hardware, h200, lay, chunk)[0])
        with_context = float(code_step_time(shapes[model], hardware, h200, lay, dict(chunk, prefill_context=np.array([8192.0])))[0])
        assert with_context - without == pytest.approx(extra, rel=1e-4, abs=1e-9), model
    assert want > 1e-3  # about 1.6 ms, beside the chunk's own 29 ms of GEMMs (its experts streamed whole)


def test_fp8_kv_decode_reads_cost_the_gpus_bytes_per_element(shapes, hardware):
    """Llama-3.1-70B at TP8, 64 requests decoding at 4,096 tokens of context each, FP8 KV: 80 layers x
    2 x 1 KV head x 128 x 262,144 tokens = 5,368,709,120 elements read. Decode attention is memory
    bound there, so raising `fp8_kv_read_bytes_per_element` from 1 to 1.76 (H200's tables) adds
    0.76 B x that over the achievable bandwidth (within the roofline's 10%), and a BF16 cache ignores it."""
    m = shapes["llama-3.1-70b"]
    h200 = GPUS.index("h200_sxm")
    elements = 80 * 2 * 1 * 128 * 64 * 4096
    assert elements == 5_368_709_120
    bw = float(hardware.hbm_bandwidth_bytes_per_s[h200] * hardware.memory_bandwidth_efficiency[h200])

    def step(kvb, read_bytes):
        lay = {"tp": np.array([8.0]), "pp": np.array([1.0]), "wb": np.array([1.0]), "kvb": np.array([kvb])}
        return decode_step_s(m, hardware, h200, lay, 64.0, 4096.0, read_bytes)

    extra_s = step(1.0, 1.76) - step(1.0, 1.0)
    assert 0.76 * elements / bw <= extra_s * (1 + 1e-5) <= 1.1 * 0.76 * elements / bw
    assert step(2.0, 1.76) == step(2.0, 1.0)
    # FP8 at 1.76 B still reads less than BF16 at 2 B; at 2 B per element it saves nothing.
    assert step(1.0, 1.76) < step(2.0, 1.0)
    assert step(1.0, 2.0) == pytest.approx(step(2.0, 1.0), rel=1e-6)


def test_sparse_attention_reads_the_top_k_and_the_indexer_keys(shapes, hardware):
    """GLM-5 (DeepSeek sparse attention, top 2,048) at TP8 on an H200, FP8 KV, 4 requests decoding at
    65,536 tokens each. Each reads only its top 2,048 tokens' latents: 78 layers x 4 x 2,048 x 576 =
    368,050,176 elements, so raising the FP8 read cost from 1 to 1.76 B an element adds 0.76 B x that
    over the bandwidth (within the roofline's 10%; a dense read would add 32x as much), and the FP8
    record's scales and BF16 RoPE dims add 80 B a latent read. The indexer
    scores all 65,536: doubling the context from 32,768 adds its keys, 78 x 4 x 32,768 x 132 B, and
    2 x 32 heads x 128 FLOPs a pair, a roofline of the two. At 1,024 tokens the model costs what its
    dense twin does plus that indexer roofline."""
    m = shapes["glm-5"]
    h200 = GPUS.index("h200_sxm")
    bw = float(hardware.hbm_bandwidth_bytes_per_s[h200] * hardware.memory_bandwidth_efficiency[h200])
    rate = float(hardware.bf16_flops_per_s[h200] * hardware.attention_flops_efficiency[h200])
    lay = {"tp": np.array([8.0]), "pp": np.array([1.0]), "wb": np.array([1.0]), "kvb": np.array([1.0])}

    def step(model, context, read_bytes=None):
        return decode_step_s(model, hardware, h200, lay, 4.0, context, read_bytes)

    elements = 78 * 4 * 2048 * 576
    assert elements == 368_050_176
    extra_s = step(m, 65536.0, 1.76) - step(m, 65536.0, 1.0)
    assert 0.76 * elements / bw <= extra_s * (1 + 1e-5) <= 1.1 * 0.76 * elements / bw
    # vLLM's FP8 sparse-MLA record also holds 4 float32 scales and the 64 RoPE dims' second bytes: 80 B
    # more a latent read, 78 x 4 x 2,048 x 80 B
    record_s = step(m, 65536.0, 1.0) - step(m._replace(fp8_kv_extra_bytes_per_token_per_layer=0.0), 65536.0, 1.0)
    assert 78 * 4 * 2048 * 80 / bw <= record_s * (1 + 1e-5) <= 1.1 * 78 * 4 * 2048 * 80 / bw

    def indexer_s(tokens):  # one roofline for the 78 layers' scoring of `tokens` keys
        return ref_roofline(78 * 2 * 32 * 128 * tokens / rate, 78 * 132 * tokens / bw)

    longer = step(m, 65536.0) - step(m, 32768.0)
    assert longer == pytest.approx(indexer_s(4 * 65536) - indexer_s(4 * 32768), rel=1e-3)
    dense = m._replace(sparse_attention_topk=0.0, indexer_flops_per_pair_per_layer=0.0, indexer_bytes_per_token_per_layer=0.0)
    assert step(m, 1024.0) - step(dense, 1024.0) == pytest.approx(indexer_s(4 * 1024), rel=1e-3)
    # the dense twin reads all 65,536 latents a request: at least the skipped ones' bytes more, less the indexer
    read_bytes = float(hardware.fp8_kv_read_bytes_per_element[h200])
    skipped_s = 78 * 4 * (65536 - 1.1 * 2048) * 576 * read_bytes / bw
    assert step(dense, 65536.0) - step(m, 65536.0) >= skipped_s - indexer_s(4 * 65536) > 0


def test_chunked_layers_read_at_most_a_chunk_a_request(shapes, hardware):
    """Llama-4-Scout at TP4 on an H100, FP8 KV, 8 requests decoding at 32,768 tokens each: its 12
    global layers read every token (12 x 262,144 token-layers), its 36 chunked ones at most 8,192 a
    request (36 x 65,536): 5,505,024 token-layers of 8 KV heads x 128 x 2 (K and V) / 4 ranks = 512
    elements, 2,818,572,288 elements. Decode attention is memory bound there, so raising the FP8 read
    cost from 1 to 1.76 B an element adds 0.76 B x that over the bandwidth (within the roofline's
    10%); read as 48 global layers it would be 2.4x as much."""
    m = shapes["llama-4-scout"]
    h100 = GPUS.index("h100_sxm")
    bw = float(hardware.hbm_bandwidth_bytes_per_s[h100] * hardware.memory_bandwidth_efficiency[h100])
    lay = {"tp": np.array([4.0]), "pp": np.array([1.0]), "wb": np.array([1.0]), "kvb": np.array([1.0])}

    def step(read_bytes):
        return decode_step_s(m, hardware, h100, lay, 8.0, 32768.0, read_bytes)

    elements = (12 * 8 * 32768 + 36 * 8 * 8192) * 512
    assert elements == 2_818_572_288
    extra_s = step(1.76) - step(1.0)
    assert 0.76 * elements / bw <= extra_s * (1 + 1e-5) <= 1.1 * 0.76 * elements / bw


@SETTINGS
@given(model=st.sampled_from(MODELS), gpu=st.integers(0, len(GPUS) - 1), seed=st.integers(0, 2**31 - 1), factor=st.floats(1.0, 8.0))
def test_more_bandwidth_or_flops_never_slows_a_step(shapes, hardware, model, gpu, seed, factor):
    m = shapes[model]
    lay, batch = random_case(seed)
    base = code_step_time(m, hardware, gpu, lay, batch)
    for fields in (
        ("hbm_bandwidth_bytes_per_s",),
        ("bf16_flops_per_s", "fp8_flops_per_s", "fp4_flops_per_s"),
        ("bf16_flops_per_s",),
        ("fp8_flops_per_s",),
        ("fp4_flops_per_s",),
        ("fp4_gemm_flops_efficiency",),
        ("intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s"),
    ):
        faster = hardware._replace(**{f: getattr(hardware, f) * factor for f in fields})
        t = code_step_time(m, faster, gpu, lay, batch)
        assert np.all(t <= base * (1 + ULPS)), f"{fields} x {factor}: {model} on {GPUS[gpu]}"
    # A cheaper read of an FP8 KV cache or of NVFP4 weights, or quantisation of a GEMM's input (fewer
    # HBM bytes per element), or a lower floor under a GEMM, never slows a step either.
    for field in ("fp8_kv_read_bytes_per_element", "fp8_quant_bytes_per_element", "fp4_quant_bytes_per_element", "fp4_weight_read_bytes_per_param", "gemm_floor_s", "fp8_gemm_floor_s", "fp4_gemm_floor_s"):
        cheaper = hardware._replace(**{field: getattr(hardware, field) / factor})
        assert np.all(code_step_time(m, cheaper, gpu, lay, batch) <= base * (1 + ULPS)), f"{field} / {factor}: {model} on {GPUS[gpu]}"


@SETTINGS
@given(model=st.sampled_from(MODELS), gpu=st.integers(0, len(GPUS) - 1), seed=st.integers(0, 2**31 - 1),
       field=st.sampled_from(["decode", "context", "prefill", "pairs", "prefill_seqs", "prefill_context"]), extra=st.floats(1.0, 4096.0))
def test_more_tokens_or_context_never_speed_a_step_up(shapes, hardware, model, gpu, seed, field, extra):
    m = shapes[model]
    lay, batch = random_case(seed)
    base = code_step_time(m, hardware, gpu, lay, batch)
    more = dict(batch, **{field: batch[field] + extra})
    t = code_step_time(m, hardware, gpu, lay, more)
    assert np.all(t >= base * (1 - ULPS)), f"+{extra} {field}: {model} on {GPUS[gpu]}"
    # Halving the KV dtype (FP8 KV) never slows a step either: only bytes shrink.
    fp8_kv = code_step_time(m, hardware, gpu, dict(lay, kvb=np.ones_like(lay["kvb"])), batch)
    assert np.all(fp8_kv <= base * (1 + ULPS))


@SETTINGS
@given(model=st.sampled_from(MODELS), gpu=st.integers(0, len(GPUS) - 1), seed=st.integers(0, 2**31 - 1))
def test_fp8_kv_never_lowers_kv_capacity(shapes, hardware, model, gpu, seed):
    m = shapes[model]
    rng = np.random.default_rng(seed)
    n = N
    hw = take(hardware, jnp.full(n, gpu, jnp.int32))
    tp, pp = rng.choice([1.0, 2.0, 4.0, 8.0, 16.0], n), rng.choice([1.0, 2.0, 4.0, 8.0], n)
    wb = rng.choice([1.0, 2.0], n)
    seqs, budget = rng.choice([8.0, 64.0, 256.0, 1024.0], n), rng.choice([512.0, 2048.0, 8192.0, 32768.0], n)
    bf16 = make_layout(tp, pp, 1.0, wb, 2.0, seqs, budget)
    fp8 = make_layout(tp, pp, 1.0, wb, 1.0, seqs, budget)
    assert np.all(np.asarray(kv_blocks_per_replica(m, hw, fp8, 0.9)) >= np.asarray(kv_blocks_per_replica(m, hw, bf16, 0.9)))
    w = workload_params(load_workload("reasoning"))
    slots_fp8, _ = max_concurrency(m, hw, fp8, w, 0.9)
    slots_bf16, _ = max_concurrency(m, hw, bf16, w, 0.9)
    assert np.all(np.asarray(slots_fp8) >= np.asarray(slots_bf16) * (1 - ULPS))


def random_estimate_inputs(shapes, hardware, model, gpu, seed, arrival):
    rng = np.random.default_rng(seed)
    n = N
    hw = take(hardware, jnp.full(n, gpu, jnp.int32))
    layout = make_layout(
        rng.choice([1.0, 2.0, 4.0, 8.0], n), rng.choice([1.0, 2.0], n), rng.choice([1.0, 2.0, 4.0, 8.0], n),
        rng.choice([1.0, 2.0], n), rng.choice([1.0, 2.0], n),
        rng.choice([16.0, 64.0, 256.0, 1024.0], n), rng.choice([2048.0, 8192.0, 16384.0], n),
    )
    base = load_workload({"poisson": "chat", "closed": "coding", "burst": "rl-rollout"}[arrival])
    overrides = {
        "isl_tokens": float(rng.uniform(100, 8000)), "osl_tokens": float(rng.uniform(50, 4000)),
        "prefix_hit_rate": float(rng.uniform(0, 0.9)),
    }
    if arrival == "poisson":
        overrides["request_rate_per_s"] = float(rng.uniform(0.1, 30))
    else:
        overrides.update(arrival_code=2 if arrival == "closed" else 1, concurrency=float(rng.integers(1, 4096)))
    return traced(shapes[model]), hw, layout, workload_params(base, **overrides)


@jax.jit
def _chunk_step_jit(m, hw, layout, w, b):
    from jaxplan.physics.steady_state import _steps

    return _steps(m, hw, layout, w, b).chunk_s


@pytest.mark.parametrize(("isl", "hit", "budget", "decoding", "chunks"), [
    (8448, 256, 513, 1, [(512.0, 256.0 + 512.0 * i) for i in range(16)]),  # 16 chunks of 512 after the hit
    (8192, 0, 8192, 16, [(8176.0, 0.0), (16.0, 8176.0)]),  # 16 decodes leave 8,176 tokens: a 16-token second chunk
])
def test_stage_four_prices_a_prompts_chunks_at_their_cached_context(shapes, hardware, isl, hit, budget, decoding, chunks):
    """DeepSeek-R1 at TP8 on an H200: the cached context each of a prompt's chunks re-up-projects
    (its prefix hit and the chunks before it, the last chunk partial). The cost is linear in the
    context, so stage 4's prefill work (the prompt's chunk steps at one context each) carries as much
    of it as the chunks priced one by one: 65,536 context tokens for the 16 chunks (about 13 ms), 8,176
    for the two."""
    from jaxplan.physics.steady_state import _steps

    m = shapes["deepseek-r1"]
    plain = m._replace(context_upprojection_in_per_token=0.0, context_upprojection_out_per_token=0.0)
    hw = take(hardware, jnp.int32(GPUS.index("h200_sxm")))
    layout = make_layout(8, 1, 1, 1.0, 1.0, max_num_seqs=64, max_num_batched_tokens=budget)
    w = workload_params(load_workload("coding"), isl_tokens=float(isl), osl_tokens=1000.0, prefix_hit_rate=hit / isl)
    b = jnp.float32(decoding)
    stage4 = float(_steps(m, hw, layout, w, b).work_s) - float(_steps(plain, hw, layout, w, b).work_s)
    decode = StepBatch.decode_only(b, b * 9000.0)
    one_by_one = sum(float(step_time_s(m, hw, layout, decode.merged(StepBatch.prefill_chunk(size, before))))
                     - float(step_time_s(plain, hw, layout, decode.merged(StepBatch.prefill_chunk(size, before)))) for size, before in chunks)
    assert stage4 == pytest.approx(one_by_one, rel=1e-3)
    assert one_by_one > 1e-7 * sum(before for _, before in chunks)  # about 0.2 ms a 1,000 context tokens


def test_p99_tpot_never_exceeds_a_step_that_carries_a_chunk(shapes, hardware):
    """A request's TPOT is the mean of its steps, so no percentile of it exceeds the chunk-carrying
    step. With few output tokens and many such steps the normal tail went past it (a case the 10x
    property run found: faster memory then raised the p99 while every step got shorter)."""
    for seed in range(4):
        m, hw, layout, w = random_estimate_inputs(shapes, hardware, "llama-3.1-8b", GPUS.index("a100_sxm"), seed, "poisson")
        w = w._replace(osl_tokens=jnp.float32(2.0), request_rate_per_s=jnp.float32(20.0))
        est, _ = _estimate_jit(m, hw, layout, w)
        chunk_s = np.asarray(_chunk_step_jit(m, hw, layout, w, est.concurrency_per_replica))
        p99, mean = np.asarray(est.tpot_p99_s), np.asarray(est.tpot_mean_s)
        ok = np.isfinite(p99)
        assert np.all(p99[ok] <= np.maximum(chunk_s, mean)[ok] * (1 + ULPS)), seed
        assert np.all(p99[ok] >= mean[ok] * (1 - ULPS))
        if seed == 0:
            assert np.any(p99[ok] == np.maximum(chunk_s, mean)[ok]), "the cut should bind for 2 output tokens"


@counted
@SETTINGS
@given(model=st.sampled_from(DENSE), gpu=st.integers(0, len(GPUS) - 1), seed=st.integers(0, 2**31 - 1),
       arrival=st.sampled_from(["poisson", "closed", "burst"]))
def test_throughput_never_beats_streaming_the_weights(shapes, hardware, model, gpu, seed, arrival):
    """Each step of a replica reads every weight of its pipeline stage (dense models) at least once,
    so a replica's b concurrent requests get at most b tokens per weights_bytes / peak bandwidth."""
    m, hw, layout, w = random_estimate_inputs(shapes, hardware, model, gpu, seed, arrival)
    est, slots = _estimate_jit(m, hw, layout, w)
    fits = np.asarray(slots) >= 1.0
    exercised(fits.any(), "layouts that fit")
    per_replica = np.asarray(est.output_tokens_per_s) / np.asarray(layout.data_parallel_size)
    step_floor_s = np.asarray(weight_bytes_per_gpu(m, layout)) / np.asarray(hw.hbm_bandwidth_bytes_per_s)
    bound = np.asarray(est.concurrency_per_replica) / step_floor_s
    assert np.all(per_replica[fits] <= bound[fits] * (1 + ULPS)), f"{model} on {GPUS[gpu]}, {arrival}"
    # Nor does a Poisson deployment deliver more than what arrives.
    if arrival == "poisson":
        offered = float(w.request_rate_per_s * w.osl_tokens)
        assert np.all(np.asarray(est.output_tokens_per_s)[fits] <= offered * (1 + 1e-5))


@counted
@SETTINGS
@given(model=st.sampled_from(MODELS), gpu=st.integers(0, len(GPUS) - 1), seed=st.integers(0, 2**31 - 1))
def test_poisson_concurrency_satisfies_littles_law(shapes, hardware, model, gpu, seed):
    """Stable Poisson: the concurrency b the estimate reports is the fixed point of Little's law,
    b = rate per replica x (time a request holds a slot at b) (the module docstring). Re-price the
    slot time at the reported b and check the law holds. (Before the Illinois fix, two plain
    regula-falsi steps left b up to 40% short of the fixed point on MoE models.)"""
    m, hw, layout, w = random_estimate_inputs(shapes, hardware, model, gpu, seed, "poisson")
    est, slots = _estimate_jit(m, hw, layout, w)
    b = est.concurrency_per_replica
    held = np.asarray(_held_jit(m, hw, layout, w, b))
    b = np.asarray(b)
    # ... and a run of num_requests never holds more than that many per replica: where that caps b, the
    # run is not in a steady state (checked in tests/test_layout_order.py).
    run_cap = np.asarray(w.num_requests / layout.data_parallel_size)
    stable = (np.asarray(slots) >= 1.0) & (np.asarray(est.utilization) < 0.98) & (b < 0.999 * np.asarray(slots)) & (b < 0.999 * run_cap)
    exercised(stable.any(), "stable layouts")
    # The solver runs a fixed number of bracketing steps on a kinked function: within 5% of b.
    bad = stable & (np.abs(held - b) > 0.05 * b)
    assert not bad.any(), f"{model} on {GPUS[gpu]}: b={b[bad][:4]}, rate x slot(b)={held[bad][:4]}"


@SETTINGS
@given(model=st.sampled_from(MODELS), gpu=st.integers(0, len(GPUS) - 1), seed=st.integers(0, 2**31 - 1),
       arrival=st.sampled_from(["poisson", "closed", "burst"]))
def test_estimate_gradients_are_finite(shapes, hardware, model, gpu, seed, arrival):
    """d(estimate)/d(ISL, OSL, rate, hit rate) through `workload_params` fields, for every output and
    every random layout (including ones that do not fit: stage 4 must not poison a gradient)."""
    m, hw, layout, w = random_estimate_inputs(shapes, hardware, model, gpu, seed, arrival)
    point = jnp.asarray([w.isl_tokens, w.osl_tokens, jnp.maximum(w.request_rate_per_s, 0.5), w.prefix_hit_rate], jnp.float32)
    jac = np.asarray(_estimate_jacobian(point, m, hw, layout, w))
    assert np.all(np.isfinite(jac)), f"{model} on {GPUS[gpu]} ({arrival}): {jac}"


def test_estimate_gradient_hand_case(hardware):
    """Stable Poisson traffic is served exactly: throughput = rate x OSL, so d throughput / d rate
    = OSL and d throughput / d OSL = rate (here 2 req/s x 250 tokens for Llama-3.1-8B at TP=1 on an
    H100, with room to spare). The same N-wide compiled Jacobian as above: N copies of the layout,
    so the summed derivatives are N x OSL and N x rate."""
    from jaxplan.physics.steady_state import Estimate

    m = traced(model_shape(load_model("llama-3.1-8b")))
    hw = take(hardware, jnp.full(N, GPUS.index("h100_sxm"), jnp.int32))
    layout = make_layout(np.ones(N), 1, 1, 2, 2, 256, 8192)
    base = load_workload("chat")
    assert base.arrival == Arrival.POISSON
    w = workload_params(base, request_rate_per_s=2.0, osl_tokens=250.0)
    jac = np.asarray(_estimate_jacobian(jnp.asarray([w.isl_tokens, 250.0, 2.0, w.prefix_hit_rate], jnp.float32), m, hw, layout, w))
    outputs = [name for name in Estimate._fields if name != "bound"]
    throughput = jac[outputs.index("output_tokens_per_s")]
    assert throughput[2] == pytest.approx(N * 250.0, rel=1e-4)  # d/d rate (float32 sums of 64 terms)
    assert throughput[1] == pytest.approx(N * 2.0, rel=1e-4)  # d/d OSL
    assert throughput[0] == 0.0 and throughput[3] == 0.0  # ISL and hit rate do not change what arrives
    est, _ = _estimate_jit(m, hw, layout, w)
    assert float(est.output_tokens_per_s[0]) == pytest.approx(500.0, rel=1e-5)
    # TTFT grows with the prompt: d TTFT / d ISL > 0.
    assert jac[outputs.index("ttft_mean_s")][0] > 0


def test_nvfp4_gemms_run_on_fp4_tensor_cores_where_the_gpu_has_them(shapes, hardware):
    """A prefill of 8,192 tokens of Llama-3.1-70B at TP4 with NVFP4 weights (0.5625 B per parameter).
      linear FLOPs per GPU: 2 x 8,192 x 68,451,041,280 / 4 = 2.8037e14
      input elements quantised per token: 80 x (8,192 x (1 + 1/4) + 8,192 + 28,672 / 4) = 2,048,000
    On B200 the FLOPs run at the FP4 peak x `fp4_gemm_flops_efficiency` (compute bound: the weights'
    9.6 GB read is 30x shorter), plus the quantisation at `fp4_quant_bytes_per_element`; the LM head
    (logits of one token: zero here) only reads its BF16 weights. On H100, which has no FP4 tensor
    cores, the same layout runs its GEMMs at the bf16 rate and quantises nothing (weight-only)."""
    m = shapes["llama-3.1-70b"]
    tokens = 8192.0
    flops = 2 * tokens * 68_451_041_280 / 4
    inputs = 80 * (8192 * 1.25 + 8192 + 28_672 / 4)
    assert inputs == 2_048_000
    head_bytes = 128_256 * 8192 / 4 * 2
    layout = make_layout(tp=4, weight_bytes=0.5625)
    for name, rate_fields, quant_field in (("b200_sxm", ("fp4_flops_per_s", "fp4_gemm_flops_efficiency"), "fp4_quant_bytes_per_element"),
                                           ("h100_sxm", ("bf16_flops_per_s", "gemm_flops_efficiency"), None)):
        hw = hw_dict(hardware, GPUS.index(name))
        bw = hw["hbm_bandwidth_bytes_per_s"] * hw["memory_bandwidth_efficiency"]
        quant_s = tokens * inputs * hw[quant_field] / bw if quant_field else 0.0
        want = flops / (hw[rate_fields[0]] * hw[rate_fields[1]]) + quant_s + head_bytes / bw
        got = float(gemm_time_s(m, take(hardware, jnp.int32(GPUS.index(name))), layout, jnp.float32(tokens), jnp.float32(0.0)))
        # The smooth maxima (roofline, then the GEMM floor) sit at most 0.6% above the dominant term
        # where it is 30x the other (0.25% each, and the head's floor).
        assert want <= got * (1 + F32_REL) and got <= want * 1.006, name
    b200 = hw_dict(hardware, GPUS.index("b200_sxm"))
    assert b200["fp4_flops_per_s"] == pytest.approx(9e15, rel=F32_REL) and b200["fp4_quant_bytes_per_element"] > 0


def test_small_gemms_take_their_floor(shapes, hardware):
    """Decode of 16 requests, Llama-3.1-70B on B200. At TP8 the attention pair of a layer reads
    (10,240 x 8,192 + 8,192 x 8,192) / 8 = 18,874,368 FP8 bytes, ~3 us at the achievable bandwidth,
    below two FP8 GEMM floors (~12 us): it costs the floors (within the smooth max's 0.3% where the
    floor dominates 4:1). So at TP8 NVFP4's GEMMs save little over FP8's (NVIDIA's tables: the four
    GEMMs of a TP8 layer at 16 tokens take 43 us in FP8 and 40 us in NVFP4), while at TP1, where every
    GEMM streams 14-77 MB, NVFP4's take B200's `fp4_weight_read_bytes_per_param` of FP8's time (0.67,
    the median over all the tables' weight-streaming shapes). At these four shapes the tables say 0.58
    (112 / 194 us); B200's serving rows side with the median (measured NVFP4 / FP8 TPOT at TP1: 0.79;
    the model gives 0.78 with 0.67 B per weight, 0.71 with the stored 0.5625, docs/accuracy.md)."""
    m = shapes["llama-3.1-70b"]
    b200 = GPUS.index("b200_sxm")
    hw = take(hardware, jnp.int32(b200))
    h = hw_dict(hardware, b200)
    bw = h["hbm_bandwidth_bytes_per_s"] * h["memory_bandwidth_efficiency"]
    attn_bytes = (10240 * 8192 + 8192 * 8192) / 8
    assert attn_bytes == 18_874_368
    assert attn_bytes / bw < 2 * h["fp8_gemm_floor_s"] / 3

    def per_layer_s(tp, weight_bytes):
        return float(gemm_time_s(m, hw, make_layout(tp=tp, weight_bytes=weight_bytes), jnp.float32(16.0), jnp.float32(16.0))) / 80

    from jaxplan.physics.step_time import _gemm  # the attention pair alone, as gemm_time_s prices it

    pair = float(_gemm(16.0, attn_bytes, 1.0, 8192.0, 2048.0, 1e18, bw, 2 * h["fp8_gemm_floor_s"]))
    assert pair == pytest.approx(2 * h["fp8_gemm_floor_s"], rel=0.01)
    fp8_tp8, nvfp4_tp8 = per_layer_s(8, 1.0), per_layer_s(8, 0.5625)
    fp8_tp1, nvfp4_tp1 = per_layer_s(1, 1.0), per_layer_s(1, 0.5625)
    assert 0.85 < nvfp4_tp8 / fp8_tp8 < 1.1, (nvfp4_tp8, fp8_tp8)
    assert nvfp4_tp1 / fp8_tp1 == pytest.approx(h["fp4_weight_read_bytes_per_param"], rel=0.03), (nvfp4_tp1, fp8_tp1)
    assert 0.6 < h["fp4_weight_read_bytes_per_param"] < 0.75


def test_the_fixed_cost_of_a_step_grows_with_the_models_depth(shapes, hardware):
    """The fixed cost is per layer (docs/accuracy.md, "Fixed costs"): raising `layer_latency_s` by 10 us
    lengthens a one-token decode step of gpt-oss-120b (36 layers) by 360 us and of Llama-3.1-70B (80) by
    800 us, at TP1 and TP8; `step_overhead_s`, 0 by default, adds its value to either whatever the depth."""
    h200 = GPUS.index("h200_sxm")
    assert float(hardware.step_overhead_s[h200]) == 0.0
    batch = {"decode": np.array([1.0]), "context": np.array([1000.0]), "prefill": np.array([0.0]), "prefill_seqs": np.array([0.0]), "pairs": np.array([0.0])}
    more_per_layer = hardware._replace(layer_latency_s=hardware.layer_latency_s.at[h200].add(10e-6))
    per_step = hardware._replace(step_overhead_s=hardware.step_overhead_s.at[h200].set(1e-3))
    for name, layers in (("gpt-oss-120b", 36), ("llama-3.1-70b", 80)):
        m = shapes[name]
        assert m.num_layers == layers
        for tp in (1.0, 8.0):
            lay = {"tp": np.array([tp]), "pp": np.array([1.0]), "wb": np.array([1.0]), "kvb": np.array([2.0])}
            base = code_step_time(m, hardware, h200, lay, batch)[0]
            assert code_step_time(m, more_per_layer, h200, lay, batch)[0] - base == pytest.approx(layers * 10e-6, rel=1e-3)
            assert code_step_time(m, per_step, h200, lay, batch)[0] - base == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize("model", ["llama-3.1-70b", "gpt-oss-120b", "deepseek-r1"])
def test_stage_four_prices_its_steps_in_one_call_as_one_by_one(shapes, hardware, model):
    """`_steps` prices its decode, chunk and one-request steps in one vmapped call (`step_times_s`);
    each must be what `step_time_s` gives that batch alone, also under PP and for lock-step ranks
    (whose expert layers carry every rank's tokens). Candidates [4]: TP2, TP4 x PP2, and two lock-step
    DP ranks at TP2 with PP 1 and 2; a 3,000-token prompt fits every step's room whole."""
    from jaxplan.physics.steady_state import _steps

    m = shapes[model]
    hw = take(hardware, jnp.int32(GPUS.index("h200_sxm")))
    tp, pp, ranks = (jnp.array(v, jnp.float32) for v in ([2, 4, 2, 2], [1, 2, 1, 2], [1, 1, 2, 2]))
    layout = make_layout(tp, pp, ranks, 1.0, 1.0, max_num_seqs=256, max_num_batched_tokens=8192, lockstep_ranks=ranks)
    w = workload_params(load_workload("coding"), isl_tokens=3000.0, osl_tokens=500.0, prefix_hit_rate=0.0)
    b = jnp.array([3.0, 40.0, 17.0, 200.0], jnp.float32)
    steps = _steps(m, hw, layout, w, b, with_light=True)
    decode = StepBatch.decode_only(b, b * (3000.0 + 250.0))
    light = StepBatch.decode_only(jnp.ones_like(b), 3000.0 + 250.0 + 0.0 * b)
    chunk = decode.merged(StepBatch.prefill_chunk(3000.0 + 0.0 * b))
    # A lock-step group's step carries a chunk when any rank's does, 1 - (1 - f)^D of the steps; its
    # expert layers then see the decodes of every rank and the chunks of D f / (1 - (1 - f)^D) ranks.
    own = b / 500.0  # f = b / OSL x ISL / chunk: the share of a rank's steps with a chunk (ISL = chunk here)
    carrying = jnp.maximum(ranks * own / (1.0 - (1.0 - own) ** ranks), 1.0)
    np.testing.assert_array_equal(steps.chunk_tokens, 3000.0)
    np.testing.assert_allclose(steps.decode_s, step_time_s(m, hw, layout, decode), rtol=1e-5)  # float32 rounding
    np.testing.assert_allclose(steps.light_s, step_time_s(m, hw, layout, light), rtol=1e-5)
    np.testing.assert_allclose(steps.chunk_s, step_time_s(m, hw, layout, chunk, ranks * b + carrying * 3000.0), rtol=1e-5)
    assert _steps(m, hw, layout, w, b).light_s is None
