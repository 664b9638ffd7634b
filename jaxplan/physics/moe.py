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


def expert_peak_flops_per_s(hw: Hardware, code):
    """The peak the routed experts' GEMMs of format `code` run against: FP8 and NVFP4 on their tensor
    cores where the GPU has them, MXFP4 at the FP8 rate where the GPU has MX tensor cores (vLLM runs it
    with MXFP8 activations there), else, and for INT4 and BF16, the BF16 peak (weight-only kernels
    dequantise into bf16 GEMMs). `calibrate.moe_kernels.expert_peaks` reads it for spec numbers."""
    fp8 = jnp.where(hw.fp8_flops_per_s > 0, hw.fp8_flops_per_s, hw.bf16_flops_per_s)
    peak = jnp.where(formats.is_format(code, table.FP8), fp8, hw.bf16_flops_per_s)
    peak = jnp.where(formats.is_format(code, table.NVFP4) & (hw.fp4_flops_per_s > 0), hw.fp4_flops_per_s, peak)
    return jnp.where(formats.is_format(code, table.MXFP4) & (hw.mxfp4_flops_per_s > 0), fp8, peak)


def expert_kernel(hw: Hardware, code):
    """(least seconds per layer, achievable FLOP/s, achievable HBM bytes/s) of the fused-MoE kernel of
    format `code` on `hw`: its `moe_<format>_*` fields (`calibrate.moe_kernels`)."""
    floor_s, hbm, flops = hw.moe_bf16_floor_s, hw.moe_bf16_hbm_fraction, hw.moe_bf16_flops_fraction
    for fmt in table.FORMATS[1:]:
        here = formats.is_format(code, fmt)
        floor_s = jnp.where(here, getattr(hw, f"moe_{fmt.name}_floor_s"), floor_s)
        hbm = jnp.where(here, getattr(hw, f"moe_{fmt.name}_hbm_fraction"), hbm)
        flops = jnp.where(here, getattr(hw, f"moe_{fmt.name}_flops_fraction"), flops)
    return floor_s, expert_peak_flops_per_s(hw, code) * flops, hw.hbm_bandwidth_bytes_per_s * hbm


def moe_layer_time_s(model: ModelShape, hw: Hardware, layout: Layout, tokens, group_tokens, roofline, dense_flops_per_s, dense_read_bytes):
    """Seconds of one MoE layer on the busiest GPU of its expert group.

    tokens: this rank's tokens (one micro-batch); group_tokens: the tokens of all lockstep ranks
    that meet in the layer (= tokens without lock-step). The routed experts cost what NVIDIA's MoE
    kernel tables say vLLM's fused kernel costs (`expert_kernel`): its least time, plus the touched
    experts' stored bytes at its streaming rate, plus their pairs' FLOPs at its GEMM rate, added as
    the tables were read (`calibrate.moe_kernels`). The shared experts run over this rank's tokens at
    the dense weights' rate (`dense_flops_per_s`, `dense_read_bytes` per parameter), one roofline with
    the tokens' activations."""
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
    code = layout.expert_weight_format
    floor_s, expert_flops_per_s, expert_bytes_per_s = expert_kernel(hw, code)
    routed_s = (2.0 * gpu_pairs * params_per_pair / expert_flops_per_s
                + touched_on_gpu * p * formats.expert_bytes_per_param(code) / expert_bytes_per_s)
    tp = layout.tensor_parallel_size
    shared_params = model.shared_experts * p / tp
    # Sliced: every token in and its FFN activation's slice out; EP: each pair's token in and activation out.
    activations = jnp.where(ep, gpu_pairs * (h + intermediate), group_tokens * (h + model.ffn_intermediate_per_token / g))
    shared_s = roofline(2.0 * tokens * shared_params / dense_flops_per_s,
                        (shared_params * dense_read_bytes + activations * ACTIVATION_BYTES) / (hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency))
    return floor_s + routed_s + shared_s


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
