"""The numbers the physics consumes, as PyTrees of arrays.

`ModelShape` is a model reduced to per-layer-kind counts, as Python floats:
hashable, so the sweep's chunk kernel over a large grid takes it as a static
argument and XLA folds the model's constants into the kernel: one compilation
per model buys a kernel with the per-model arithmetic done at compile time,
which pays off over tens of millions of candidates (`funnel.chunk.chunk_model`).
Smaller grids and kernels over a few rows (predict, the calibration fit, the
replay, report rows, sensitivities) pass it `traced` instead: one compilation
serves every model.
`Hardware` is a GPU type plus its
calibrated efficiencies; fields are scalars or [G] arrays (one per GPU type)
and are gathered per candidate with `take`. `Layout` is a candidate's
parallel layout and dtypes, every field [C] (or scalar).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.physics.weight_formats import code_of_bytes
from jaxplan.specs.gpu import GpuSpec
from jaxplan.specs.model import ModelSpec


class ModelShape(NamedTuple):
    """Whole-model (un-sharded) element counts; Python floats (or arrays, if traced)."""

    num_layers: jnp.ndarray
    hidden_size: jnp.ndarray
    vocab_size: jnp.ndarray
    softmax_layers: jnp.ndarray  # full + sliding-window (GQA or MLA) layers
    full_layers: jnp.ndarray
    sliding_layers: jnp.ndarray
    sliding_window_tokens: jnp.ndarray
    linear_layers: jnp.ndarray
    attn_params_per_layer: jnp.ndarray  # softmax-attention projections (incl. K/V)
    kv_proj_params_per_layer: jnp.ndarray  # the K/V part, replicated once TP > KV heads
    replicated_attn_params_per_layer: jnp.ndarray  # the part every TP rank holds whole (MLA's down-projections, an indexer)
    linear_params_per_layer: jnp.ndarray
    linear_state_bytes_per_layer: jnp.ndarray  # per request, constant
    linear_flops_per_token_per_layer: jnp.ndarray  # recurrent state update
    dense_mlp_layers: jnp.ndarray
    dense_mlp_params_per_layer: jnp.ndarray
    moe_layers: jnp.ndarray
    num_experts: jnp.ndarray  # routed experts (1 for dense models, unused)
    experts_per_token: jnp.ndarray
    shared_experts: jnp.ndarray
    expert_params: jnp.ndarray
    router_params_per_layer: jnp.ndarray
    embedding_params: jnp.ndarray
    lm_head_params: jnp.ndarray  # 0 when tied (weights counted once); compute always vocab*hidden
    kv_heads: jnp.ndarray  # KV heads that TP splits (GQA); MLA latent is not split
    kv_split_by_tp: jnp.ndarray  # 1.0 for GQA, 0.0 for MLA (latent replicated on every TP rank)
    kv_elements_per_token_per_layer: jnp.ndarray  # whole model, one layer
    q_heads: jnp.ndarray
    attn_score_dim_prefill: jnp.ndarray  # per-head q.k dim in prefill
    attn_value_dim_prefill: jnp.ndarray
    attn_score_dim_decode: jnp.ndarray  # MLA decode attends in the latent space
    attn_value_dim_decode: jnp.ndarray
    norm_allreduce_layers: jnp.ndarray  # attention layers whose q/k norm all-reduces across TP ranks
    ffn_intermediate_per_token: jnp.ndarray  # widest FFN activation per token (workspace)
    chunked_layers: jnp.ndarray  # full layers whose queries attend within their chunk (they keep every token's KV)
    attention_chunk_tokens: jnp.ndarray
    sparse_attention_topk: jnp.ndarray  # tokens a query attends to in the full layers (0: all)
    indexer_flops_per_pair_per_layer: jnp.ndarray  # sparse attention's indexer scoring one (query, key) pair
    indexer_bytes_per_token_per_layer: jnp.ndarray  # its stored key, on every TP rank
    fp8_kv_extra_bytes_per_token_per_layer: jnp.ndarray  # an FP8 cache's scales and BF16 parts (sparse MLA)
    # Dense MLA's kv_b_proj, re-applied to a prompt chunk's cached context (in x out weights a layer; 0 without it):
    context_upprojection_in_per_token: jnp.ndarray  # its input per context token: the latent
    context_upprojection_out_per_token: jnp.ndarray  # its output per context token: every head's no-RoPE key and value


def traced(model: ModelShape) -> ModelShape:
    """The ModelShape as float32 arrays: passed to a jitted function as arguments (not as a static
    argument), one compiled program serves every model."""
    return jax.tree.map(jnp.float32, model)


def model_shape(model: ModelSpec) -> ModelShape:
    """Reduce a ModelSpec to the counts the cost model needs."""
    if model.is_mla:
        score_prefill = model.qk_nope_head_dim + model.qk_rope_head_dim
        value_prefill = model.v_head_dim
        score_decode = model.kv_lora_rank + model.qk_rope_head_dim
        value_decode = model.kv_lora_rank
    else:
        score_prefill = value_prefill = score_decode = value_decode = model.head_dim
    linear_flops = 0
    if model.linear_attention_layers:
        # Gated delta rule: read, update and read out a (dk x dv) state per value head per token.
        linear_flops = 6 * model.linear_num_value_heads * model.linear_key_head_dim * model.linear_value_head_dim
    ffn = max(
        model.intermediate_size if model.dense_mlp_layers else 0,
        (model.experts_per_token + model.num_shared_experts) * model.moe_intermediate_size,
    )
    softmax_layers = model.full_attention_layers + model.sliding_window_layers
    upprojection_in, upprojection_out = model.context_upprojection_widths()
    values = dict(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        vocab_size=model.vocab_size,
        softmax_layers=softmax_layers,
        full_layers=model.full_attention_layers,
        sliding_layers=model.sliding_window_layers,
        sliding_window_tokens=max(model.sliding_window_tokens, 1),
        linear_layers=model.linear_attention_layers,
        attn_params_per_layer=model.attention_params_per_layer(),
        kv_proj_params_per_layer=model.kv_params_per_layer(),
        replicated_attn_params_per_layer=model.replicated_attention_params_per_layer(),
        linear_params_per_layer=model.linear_attention_params_per_layer(),
        linear_state_bytes_per_layer=model.linear_state_bytes_per_request_per_layer(),
        linear_flops_per_token_per_layer=linear_flops,
        dense_mlp_layers=model.dense_mlp_layers,
        dense_mlp_params_per_layer=model.dense_mlp_params(),
        moe_layers=model.moe_layers,
        num_experts=max(model.num_experts, 1),
        experts_per_token=model.experts_per_token,
        shared_experts=model.num_shared_experts,
        expert_params=model.expert_params() if model.is_moe else 0,
        router_params_per_layer=model.hidden_size * model.num_experts,
        embedding_params=model.embedding_params,
        lm_head_params=model.lm_head_params,
        kv_heads=model.num_kv_heads,
        kv_split_by_tp=0.0 if model.is_mla else 1.0,
        kv_elements_per_token_per_layer=model.kv_elements_per_token_per_layer(),
        q_heads=model.num_attention_heads,
        attn_score_dim_prefill=score_prefill,
        attn_value_dim_prefill=value_prefill,
        attn_score_dim_decode=score_decode,
        attn_value_dim_decode=value_decode,
        norm_allreduce_layers=softmax_layers if model.qk_norm_across_heads else 0,
        ffn_intermediate_per_token=ffn,
        chunked_layers=model.chunked_attention_layers,
        attention_chunk_tokens=max(model.attention_chunk_tokens, 1),
        sparse_attention_topk=model.sparse_attention_topk,
        indexer_flops_per_pair_per_layer=2 * model.indexer_heads * model.indexer_head_dim,
        indexer_bytes_per_token_per_layer=model.indexer_bytes_per_token_per_layer(),
        fp8_kv_extra_bytes_per_token_per_layer=model.fp8_kv_extra_bytes_per_token_per_layer(),
        context_upprojection_in_per_token=upprojection_in,
        context_upprojection_out_per_token=upprojection_out,
    )
    return ModelShape(**{k: float(v) for k, v in values.items()})


class Hardware(NamedTuple):
    """Peak numbers (spec sheet) and calibrated efficiencies; scalars or [G]."""

    hbm_bytes: jnp.ndarray
    visible_hbm_fraction: jnp.ndarray  # of hbm_bytes, what the runtime reports (GpuSpec)
    hbm_bandwidth_bytes_per_s: jnp.ndarray
    bf16_flops_per_s: jnp.ndarray
    fp8_flops_per_s: jnp.ndarray  # 0: no FP8 tensor cores
    fp4_flops_per_s: jnp.ndarray  # 0: no FP4 tensor cores
    mxfp4_flops_per_s: jnp.ndarray  # 0: no MXFP4 tensor cores (Hopper, Ampere, MI300X: weight-only)
    compute_capability: jnp.ndarray  # CUDA compute capability; 0: not CUDA / not stated
    intra_node_bandwidth_bytes_per_s: jnp.ndarray
    inter_node_bandwidth_bytes_per_s: jnp.ndarray
    gpus_per_node: jnp.ndarray
    price_usd_per_hour: jnp.ndarray
    # Calibrated (see jaxplan/physics/params.py).
    gemm_flops_efficiency: jnp.ndarray
    fp8_quant_bytes_per_element: jnp.ndarray
    fp8_kv_read_bytes_per_element: jnp.ndarray  # decode attention's HBM bytes per FP8 KV element read
    fp4_gemm_flops_efficiency: jnp.ndarray  # NVFP4 GEMMs, of the FP4 peak
    fp4_quant_bytes_per_element: jnp.ndarray
    fp4_weight_read_bytes_per_param: jnp.ndarray  # HBM bytes per NVFP4 weight a GEMM streams (FP8: 1)
    gemm_floor_s: jnp.ndarray  # least seconds of one weight GEMM: BF16, FP8, NVFP4
    fp8_gemm_floor_s: jnp.ndarray
    fp4_gemm_floor_s: jnp.ndarray
    memory_bandwidth_efficiency: jnp.ndarray
    attention_flops_efficiency: jnp.ndarray
    layer_latency_s: jnp.ndarray
    allreduce_latency_s: jnp.ndarray
    allreduce_bandwidth_efficiency: jnp.ndarray
    allreduce_two_gpu_ratio: jnp.ndarray
    step_overhead_s: jnp.ndarray
    per_seq_overhead_s: jnp.ndarray
    p2p_latency_s: jnp.ndarray
    pipeline_seq_overhead_s: jnp.ndarray  # host s per sequence per step, PP > 1 only (params.py)
    request_overhead_s: jnp.ndarray  # per request, outside the engine step (API server)
    # The fused-MoE kernel per expert format (params.MOE_KERNEL_DEFAULTS): least s per layer, fraction of
    # the HBM peak its expert weights stream at, fraction of the format's peak its GEMMs reach.
    moe_bf16_floor_s: jnp.ndarray
    moe_bf16_hbm_fraction: jnp.ndarray
    moe_bf16_flops_fraction: jnp.ndarray
    moe_fp8_floor_s: jnp.ndarray
    moe_fp8_hbm_fraction: jnp.ndarray
    moe_fp8_flops_fraction: jnp.ndarray
    moe_nvfp4_floor_s: jnp.ndarray
    moe_nvfp4_hbm_fraction: jnp.ndarray
    moe_nvfp4_flops_fraction: jnp.ndarray
    moe_mxfp4_floor_s: jnp.ndarray
    moe_mxfp4_hbm_fraction: jnp.ndarray
    moe_mxfp4_flops_fraction: jnp.ndarray
    moe_int4_floor_s: jnp.ndarray
    moe_int4_hbm_fraction: jnp.ndarray
    moe_int4_flops_fraction: jnp.ndarray


def hardware_table(gpus: tuple[GpuSpec, ...], efficiency: dict[str, dict[str, float]]) -> Hardware:
    """Stack GPU specs and their efficiencies into [G] arrays (order = `gpus`)."""
    peak = {
        "hbm_bytes": [g.hbm_bytes for g in gpus],
        "visible_hbm_fraction": [g.visible_hbm_fraction for g in gpus],
        "hbm_bandwidth_bytes_per_s": [g.hbm_bandwidth_bytes_per_s for g in gpus],
        "bf16_flops_per_s": [g.bf16_flops_per_s for g in gpus],
        "fp8_flops_per_s": [g.fp8_flops_per_s for g in gpus],
        "fp4_flops_per_s": [g.fp4_flops_per_s for g in gpus],
        "mxfp4_flops_per_s": [g.mxfp4_flops_per_s for g in gpus],
        "compute_capability": [g.compute_capability for g in gpus],
        "intra_node_bandwidth_bytes_per_s": [g.intra_node_bandwidth_bytes_per_s for g in gpus],
        "inter_node_bandwidth_bytes_per_s": [g.inter_node_bandwidth_bytes_per_s for g in gpus],
        "gpus_per_node": [g.gpus_per_node for g in gpus],
        "price_usd_per_hour": [g.price_usd_per_hour for g in gpus],
    }
    calibrated = {
        field: [efficiency[g.name][field] for g in gpus]
        for field in Hardware._fields
        if field not in peak
    }
    # device_put is a host transfer; jnp.asarray would compile a small staging program for every G.
    return Hardware(**{k: jax.device_put(np.asarray(v, np.float32)) for k, v in {**peak, **calibrated}.items()})


def take(table: Hardware, gpu_index: jnp.ndarray) -> Hardware:
    """Per-candidate hardware: gather each [G] field at `gpu_index` [C]."""
    return jax.tree.map(lambda field: field[gpu_index], table)


class Layout(NamedTuple):
    """One engine rank's layout and dtypes; every field float32, scalar or [C].

    `data_parallel_size` counts engine ranks, each with its own scheduler, batch and KV cache (a
    replica of TP x PP GPUs). For a MoE model, `lockstep_ranks` of them (vLLM's
    `--data-parallel-size`) step together and share the expert layers, which are split over
    lockstep_ranks x TP GPUs: whole experts per GPU with `expert_parallel` (vLLM's
    `--enable-expert-parallel`), else every expert sliced that many ways. lockstep_ranks = 1 and
    expert_parallel = 0 is one server per replica, experts tensor-parallel: what a dense model is.
    """

    tensor_parallel_size: jnp.ndarray
    pipeline_parallel_size: jnp.ndarray
    data_parallel_size: jnp.ndarray
    weight_bytes_per_param: jnp.ndarray  # every weight but the routed experts: 2 (bf16), 1 (fp8), 0.5625 (nvfp4)
    kv_bytes_per_element: jnp.ndarray  # 2 (auto = bf16) or 1 (fp8)
    max_num_seqs: jnp.ndarray
    max_num_batched_tokens: jnp.ndarray
    expert_weight_format: jnp.ndarray  # routed experts' format code (physics.formats)
    lockstep_ranks: jnp.ndarray  # DP ranks that share the expert layers and step together (1: none)
    expert_parallel: jnp.ndarray  # 1.0: whole experts per GPU (EP), 0.0: experts sliced (TP)

    @property
    def gpus_per_replica(self) -> jnp.ndarray:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def num_gpus(self) -> jnp.ndarray:
        return self.gpus_per_replica * self.data_parallel_size

    @property
    def expert_group_gpus(self) -> jnp.ndarray:
        """GPUs one MoE layer's experts are split over (per pipeline stage): lockstep ranks x TP."""
        return self.lockstep_ranks * self.tensor_parallel_size


def make_layout(tp=1, pp=1, dp=1, weight_bytes=2, kv_bytes=2, max_num_seqs=256, max_num_batched_tokens=8192,
                expert_weight_format=None, lockstep_ranks=1, expert_parallel=0) -> Layout:
    """A Layout from plain numbers or arrays (broadcast together). `expert_weight_format` defaults to
    the format of `weight_bytes` (bf16, fp8 or nvfp4 for every weight)."""
    if expert_weight_format is None:
        expert_weight_format = code_of_bytes(weight_bytes)
    values = (tp, pp, dp, weight_bytes, kv_bytes, max_num_seqs, max_num_batched_tokens, expert_weight_format, lockstep_ranks, expert_parallel)
    arrays = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float32) for v in values))
    return Layout(*arrays)
