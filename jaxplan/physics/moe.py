"""A mixture-of-experts layer as vLLM runs it: expert sharding, expert GEMMs, dispatch and combine.

vLLM's FusedMoE splits the routed experts of one layer over a group of lockstep_ranks x TP GPUs
(its `FusedMoEParallelConfig`: the DP ranks of `--data-parallel-size` times TP, flattened):
  * without `--enable-expert-parallel` every expert is sliced over the whole group (tensor
    parallel), so every GPU holds 1/G of every expert and computes every routed token;
  * with it every GPU holds E / G whole experts (the first ranks one more when G does not divide
    E) and computes only the tokens routed to them: the busiest GPU sets the pace.
Shared experts, attention and dense FFNs stay tensor-parallel over TP inside each rank.

Under lock-step DP the ranks' tokens meet in the expert layers: each rank all-gathers the group's
hidden states before the experts and reduce-scatters the outputs after them (vLLM's default
`allgather_reducescatter` all2all backend), whatever the EP setting; inside one rank the TP
all-reduce follows as for a dense layer.

Routing is taken as uniform and independent per token (each token picks k distinct experts of E):
  * an expert is touched by a step of T tokens with probability 1 - (1 - k/E)^T, so decode streams
    only the experts it touches;
  * the busiest of G expert-parallel GPUs receives about mean + sqrt(2 ln G) standard deviations
    of the T k token-expert pairs (the expected maximum of G near-Gaussian counts).
Real routers are skewed; the fit absorbs what uniform routing misses.

Elementwise over broadcastable arrays, like the rest of the physics.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.physics import weight_formats as formats
from jaxplan.specs import formats as table
from jaxplan.physics.shapes import Hardware, Layout, ModelShape

ACTIVATION_BYTES = 2.0


def expected_experts_touched(num_experts, experts_per_token, tokens):
    """Expected distinct experts that `tokens` tokens activate, each picking k of E uniformly:
    E (1 - (1 - k/E)^T)."""
    e = jnp.maximum(num_experts, 1.0)
    miss = jnp.clip(1.0 - experts_per_token / e, 0.0, 1.0)
    return e * (1.0 - jnp.power(miss, tokens))


def busiest_gpu_pairs(pairs, group_gpus):
    """Expected token-expert pairs on the busiest of `group_gpus` GPUs that share `pairs` pairs at
    random: mean + sqrt(2 ln G) x the binomial standard deviation (0 extra for G = 1)."""
    g = jnp.maximum(group_gpus, 1.0)
    mean = pairs / g
    # Square roots kept off 0, where their gradient is infinite (G = 1, or no pairs).
    spread = jnp.sqrt(jnp.maximum(pairs * (1.0 / g) * (1.0 - 1.0 / g), 1e-12))
    tail = jnp.sqrt(jnp.maximum(2.0 * jnp.log(g), 1e-12))
    return jnp.where(g > 1.0, jnp.minimum(mean + tail * spread, pairs), pairs)


def routed_experts_per_gpu(model: ModelShape, layout: Layout):
    """Routed experts' weights on one GPU, in whole-expert units: E / G sliced, ceil(E / G) with EP."""
    g = layout.expert_group_gpus
    e = model.num_experts
    return jnp.where(layout.expert_parallel > 0, jnp.ceil(e / g), e / g)


def moe_weight_params_per_gpu(model: ModelShape, layout: Layout):
    """(routed-expert parameters, other MoE-layer parameters) one GPU holds per MoE layer: the routed
    share, and the shared experts (TP-sliced) plus the router (replicated)."""
    routed = routed_experts_per_gpu(model, layout) * model.expert_params
    other = model.shared_experts * model.expert_params / layout.tensor_parallel_size + model.router_params_per_layer
    return routed, other


def expert_gemm_rate(hw: Hardware, layout: Layout):
    """(achievable FLOP/s, HBM bytes streamed per routed-expert parameter, least seconds of one GEMM) of
    the routed experts' GEMMs, by their format: FP8 / NVFP4 / MXFP4 on their tensor cores where the
    GPU has them, else weight-only (dequantised into bf16 GEMMs, streaming the stored bytes); INT4
    always weight-only."""
    code = layout.expert_weight_format
    stored = formats.expert_bytes_per_param(code)
    bf16 = hw.bf16_flops_per_s * hw.gemm_flops_efficiency
    on_fp8 = formats.is_format(code, table.FP8) & (hw.fp8_flops_per_s > 0)
    on_nvfp4 = formats.is_format(code, table.NVFP4) & (hw.fp4_flops_per_s > 0)
    on_mxfp4 = formats.is_format(code, table.MXFP4) & (hw.mxfp4_flops_per_s > 0)
    flops = jnp.where(on_fp8, hw.fp8_flops_per_s * hw.gemm_flops_efficiency, bf16)
    flops = jnp.where(on_nvfp4, hw.fp4_flops_per_s * hw.fp4_gemm_flops_efficiency, flops)
    flops = jnp.where(on_mxfp4, hw.mxfp4_flops_per_s * hw.fp4_gemm_flops_efficiency, flops)
    # FP4 kernels stream their weights slower than their stored bytes (calibrated for NVFP4); MXFP4's
    # smaller scales are taken in proportion.
    fp4_read = hw.fp4_weight_read_bytes_per_param * stored / table.NVFP4.expert_bytes_per_param
    read = jnp.where(on_nvfp4 | on_mxfp4, fp4_read, stored)
    floor = jnp.where(on_nvfp4 | on_mxfp4, hw.fp4_gemm_floor_s, jnp.where(on_fp8, hw.fp8_gemm_floor_s, hw.gemm_floor_s))
    return flops, read, floor


def moe_layer_time_s(model: ModelShape, hw: Hardware, layout: Layout, tokens, group_tokens, roofline, dense_flops_per_s, dense_read_bytes):
    """Seconds of one MoE layer's GEMMs on the busiest GPU of its expert group.

    tokens: this rank's tokens (one micro-batch); group_tokens: the tokens of all lockstep ranks
    that meet in the layer (= tokens without lock-step). The shared experts run over this rank's
    tokens at the dense weights' rate (`dense_flops_per_s`, `dense_read_bytes` per parameter); the
    routed experts at their format's (`expert_gemm_rate`). One roofline for the layer, at least two
    of the experts' GEMM floors (gate-up and down)."""
    h = model.hidden_size
    k, e, p = model.experts_per_token, model.num_experts, model.expert_params
    g = layout.expert_group_gpus
    ep = layout.expert_parallel > 0
    intermediate = p / (3.0 * jnp.maximum(h, 1.0))  # one expert's FFN width (gate, up, down)
    pairs = group_tokens * k
    # Sliced: every GPU computes every pair on 1/G of the expert; EP: the busiest GPU's pairs on whole experts.
    gpu_pairs = jnp.where(ep, busiest_gpu_pairs(pairs, g), pairs)
    params_per_pair = jnp.where(ep, p, p / g)
    touched = expected_experts_touched(e, k, group_tokens)
    touched_on_gpu = jnp.where(ep, routed_experts_per_gpu(model, layout) * touched / jnp.maximum(e, 1.0), touched / g)
    expert_flops_per_s, expert_read_bytes, floor_s = expert_gemm_rate(hw, layout)
    tp = layout.tensor_parallel_size
    shared_params = model.shared_experts * p / tp
    compute_s = 2.0 * gpu_pairs * params_per_pair / expert_flops_per_s + 2.0 * tokens * shared_params / dense_flops_per_s
    # Sliced: every token in and its FFN activation's slice out; EP: each pair's token in and activation out.
    activations = jnp.where(ep, gpu_pairs * (h + intermediate), group_tokens * (h + model.ffn_intermediate_per_token / g))
    moved = touched_on_gpu * p * expert_read_bytes + shared_params * dense_read_bytes + activations * ACTIVATION_BYTES
    memory_s = moved / (hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency)
    return roofline(roofline(compute_s, memory_s), 2.0 * floor_s)


def dispatch_combine_time_s(hw: Hardware, layout: Layout, group_tokens, hidden_size, allreduce_efficiency):
    """Seconds one MoE layer spends gathering the lockstep ranks' hidden states and scattering the
    outputs back (all-gather + reduce-scatter over the ranks: the traffic of one ring all-reduce of
    the group's hidden states); 0 without lock-step. Over NVLink while the group fits a node."""
    ranks = layout.lockstep_ranks
    message = group_tokens * hidden_size * ACTIVATION_BYTES
    crosses = layout.expert_group_gpus > hw.gpus_per_node
    link = jnp.where(crosses, hw.inter_node_bandwidth_bytes_per_s, hw.intra_node_bandwidth_bytes_per_s)
    ring = 2.0 * (ranks - 1.0) / jnp.maximum(ranks, 1.0) * message / (link * allreduce_efficiency(hw, ranks))
    latency = 2.0 * hw.allreduce_latency_s * jnp.where(crosses, 4.0, 1.0)
    return jnp.where(ranks > 1, latency + ring, 0.0)
