"""Step time: seconds for one scheduler step of one replica. The single source of truth.

Per operator: time = roofline(FLOPs / achievable FLOP/s, bytes / achievable
bandwidth) (FP8 and NVFP4 GEMMs add the quantisation of their input, a memory-bound
kernel of its own; and a weight GEMM takes at least its dtype's floor, the least time
of its kernels), where `roofline` is a smooth maximum (never below the true max,
at most 10% above it where both terms are equal, differentiable everywhere,
and cheap: one square root). Added to that: a fixed latency per layer (the small kernels between
the GEMMs and the gaps between launches: the fixed cost of a step grows with the model's depth),
two all-reduces per layer under TP (latency + ring bandwidth term, on the
inter-node link once the TP group spans nodes), a third, of two float32 variances per token, in each
attention layer of a model whose q/k norm spans all its heads (MiniMax-M2), PP point-to-point hops, and a
per-sequence runtime overhead (scheduling, sampling; a per-step one only where a parameter file sets
it, `params.BOUNDS`), and under PP the per-sequence
output processing vLLM then runs on the step's critical path (`pipeline_host_overhead_s`).

Mixture-of-experts layers (`physics.moe`): expert GEMMs per GPU of the expert group (sliced or
expert-parallel, over lockstep DP ranks x TP), only the experts a step touches streamed, and under
lock-step DP the dispatch and combine of the ranks' tokens. Dense MLA (DeepSeek-V3, Kimi-K2.5) prefill
up-projects each prompt chunk's cached context again (`context_upprojection_time_s`), so with a small
token budget a long prompt's prefill grows with the square of its chunk count.

Pipeline parallelism: a step's batch is split into PP micro-batches that flow
through the stages concurrently, so a replica emits one token for every
request once per `L x t_layer(batch / PP)` plus the hops, while each GPU
holds only L / PP layers. When PP does not divide the layers (vLLM then splits them
unevenly), the pipeline runs at the pace of its largest stage, ceil(L / PP) layers:
the per-layer terms are priced at PP x ceil(L / PP) layers.

Elementwise over broadcastable arrays: StepBatch, Layout and Hardware fields
may be scalars, [C] candidates or [F] finalists.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxplan.physics.batch import StepBatch
from jaxplan.physics.memory import EMBEDDING_BYTES_PER_PARAM, attention_params_per_gpu, fp8_kv_cache, kv_entry_bytes_per_layer, kv_token_bytes_per_layer, pipeline_stages
from jaxplan.physics.moe import dispatch_combine_time_s, moe_layer_time_s
from jaxplan.physics.shapes import Hardware, Layout, ModelShape

ROOFLINE_SOFTNESS = 0.1
ACTIVATION_BYTES = 2.0
NORM_ALLREDUCE_BYTES_PER_TOKEN = 8.0  # the q and the k variance, float32 (vLLM's MiniMaxText01RMSNormTP.forward_qk)


def roofline(compute_s, memory_s):
    """Smooth max(c, m) = (c + m + sqrt((c - m)^2 + (0.1 (c + m))^2)) / 2 for c, m >= 0.

    Equals max(c, m) + 10% of it where c = m (there the root is 0.1 x 2c), tends to max(c, m)
    where one dominates."""
    total = compute_s + memory_s
    gap = compute_s - memory_s
    # The 1e-24 s^2 floor keeps the gradient finite where both terms are 0 (an absent operator).
    return 0.5 * (total + jnp.sqrt(gap * gap + (ROOFLINE_SOFTNESS * total) ** 2 + 1e-24))


class StepCost(NamedTuple):
    """Breakdown of one step (seconds); `total_s` is what a request waits per step."""

    gemm_s: jnp.ndarray
    attention_s: jnp.ndarray
    communication_s: jnp.ndarray
    overhead_s: jnp.ndarray
    total_s: jnp.ndarray


# Weight bytes per parameter below which a layout's weights are FP8 (1) or NVFP4 (0.5625), not bf16 (2).
FP8_WEIGHTS_BELOW_BYTES = 1.5
FP4_WEIGHTS_BELOW_BYTES = 0.75


def fp4_weights(weight_bytes_per_param):
    """NVFP4 weights (whatever the GPU)."""
    return weight_bytes_per_param < FP4_WEIGHTS_BELOW_BYTES


def fp8_weights(weight_bytes_per_param):
    """FP8 weights (whatever the GPU)."""
    return (weight_bytes_per_param < FP8_WEIGHTS_BELOW_BYTES) & ~fp4_weights(weight_bytes_per_param)


def uses_fp4_gemms(hw: Hardware, layout: Layout):
    """NVFP4 weights on a GPU with FP4 tensor cores."""
    return fp4_weights(layout.weight_bytes_per_param) & (hw.fp4_flops_per_s > 0)


def uses_fp8_gemms(hw: Hardware, layout: Layout):
    """FP8 weights on a GPU with FP8 tensor cores."""
    return fp8_weights(layout.weight_bytes_per_param) & (hw.fp8_flops_per_s > 0)


def by_gemm_kind(hw: Hardware, layout: Layout, bf16, fp8, fp4):
    """`fp4` where the layout's GEMMs run on FP4 tensor cores, `fp8` on FP8 ones, else `bf16` (also for
    FP8 / NVFP4 weights on a GPU without those cores: weight-only, bf16 GEMMs)."""
    return jnp.where(uses_fp4_gemms(hw, layout), fp4, jnp.where(uses_fp8_gemms(hw, layout), fp8, bf16))


def gemm_flops_per_s(hw: Hardware, layout: Layout):
    """Achievable GEMM FLOP/s: the FP4 (FP8) tensor cores for NVFP4 (FP8) weights where the GPU has
    them, each at its own efficiency (NVFP4: `fp4_gemm_flops_efficiency`), else bf16."""
    return by_gemm_kind(hw, layout, hw.bf16_flops_per_s * hw.gemm_flops_efficiency, hw.fp8_flops_per_s * hw.gemm_flops_efficiency,
                        hw.fp4_flops_per_s * hw.fp4_gemm_flops_efficiency)


def gemm_input_elements_per_token(model: ModelShape, layout: Layout):
    """Activation elements per token that enter the weight GEMMs of one forward (all layers):
    the hidden state into QKV / gate-up, the TP shard of the attention output into O and of the
    FFN activation into the down projection."""
    tp = layout.tensor_parallel_size
    h = model.hidden_size
    attention = (model.softmax_layers + model.linear_layers) * h * (1.0 + 1.0 / tp)
    ffn = (model.dense_mlp_layers + model.moe_layers) * (h + model.ffn_intermediate_per_token / tp)
    return attention + ffn


def quant_bytes_per_input_element(hw: Hardware, layout: Layout):
    """HBM bytes per GEMM input element that quantising the bf16 input costs: the GPU's
    `fp8_quant_bytes_per_element` (`fp4_quant_bytes_per_element`) for FP8 (NVFP4) GEMMs, 0 for bf16."""
    return by_gemm_kind(hw, layout, 0.0, hw.fp8_quant_bytes_per_element, hw.fp4_quant_bytes_per_element)


def input_quant_s_per_token(model: ModelShape, hw: Hardware, layout: Layout):
    """FP8 and NVFP4 GEMMs quantise their bf16 input first, a memory-bound kernel of its own: seconds
    per token = input elements x `quant_bytes_per_input_element` at the achievable HBM bandwidth; 0 for
    bf16. Shaped like the layout and hardware (per configuration, not per step)."""
    moved = gemm_input_elements_per_token(model, layout) * quant_bytes_per_input_element(hw, layout)
    return moved / (hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency)


def input_quant_time_s(model: ModelShape, hw: Hardware, layout: Layout, tokens):
    """Seconds the input quantisation of `tokens` tokens takes (see `input_quant_s_per_token`)."""
    return tokens * input_quant_s_per_token(model, hw, layout)


def weight_read_bytes_per_param(hw: Hardware, layout: Layout):
    """HBM bytes a weight GEMM streams per parameter: the stored 2 (bf16) or 1 (FP8); for NVFP4
    GEMMs on FP4 tensor cores the GPU's `fp4_weight_read_bytes_per_param` (its kernels stream the
    0.5625 stored bytes slower than FP8's stream one)."""
    return jnp.where(uses_fp4_gemms(hw, layout), hw.fp4_weight_read_bytes_per_param, layout.weight_bytes_per_param)


def gemm_floor_s(hw: Hardware, layout: Layout):
    """The least seconds one weight GEMM of the layout takes: the GPU's `gemm_floor_s`, or for FP8 and
    NVFP4 GEMMs (on their tensor cores) `fp8_gemm_floor_s` / `fp4_gemm_floor_s`, which include the
    kernel that quantises their input."""
    return by_gemm_kind(hw, layout, hw.gemm_floor_s, hw.fp8_gemm_floor_s, hw.fp4_gemm_floor_s)


def _gemm(tokens, params_per_gpu, weight_bytes, in_width, out_width, flops_per_s, bytes_per_s, floor_s):
    """One linear operator: T x in -> T x out over a weight shard of `params_per_gpu`, at least
    `floor_s` (the floor of its GEMMs; smooth, like the roofline)."""
    flops = 2.0 * tokens * params_per_gpu
    moved = params_per_gpu * weight_bytes + tokens * (in_width + out_width) * ACTIVATION_BYTES
    return roofline(roofline(flops / flops_per_s, moved / bytes_per_s), floor_s)


def gemm_time_s(model: ModelShape, hw: Hardware, layout: Layout, tokens, logit_tokens, group_tokens=None):
    """All weight GEMMs of one full forward over `tokens` tokens (seconds, all layers); the expert
    layers see `group_tokens`, the tokens of all lockstep ranks (default: `tokens` x lockstep_ranks,
    every rank as busy as this one)."""
    if group_tokens is None:
        group_tokens = tokens * layout.lockstep_ranks
    tp = layout.tensor_parallel_size
    flops_per_s = gemm_flops_per_s(hw, layout)
    bytes_per_s = hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency
    wb = weight_read_bytes_per_param(hw, layout)
    h = model.hidden_size
    attn_params = attention_params_per_gpu(model, tp)
    # Each operator below is two GEMMs (QKV and O; the in- and out-projections; gate/up and down), so
    # at least two floors.
    pair_floor_s = 2.0 * gemm_floor_s(hw, layout)
    attn = model.softmax_layers * _gemm(tokens, attn_params, wb, h, 2.0 * h / tp, flops_per_s, bytes_per_s, pair_floor_s)
    linear = model.linear_layers * _gemm(tokens, model.linear_params_per_layer / tp, wb, h, 2.0 * h / tp, flops_per_s, bytes_per_s, pair_floor_s)
    ffn_width = model.ffn_intermediate_per_token / tp
    dense = model.dense_mlp_layers * _gemm(tokens, model.dense_mlp_params_per_layer / tp, wb, h, ffn_width, flops_per_s, bytes_per_s, pair_floor_s)
    moe = model.moe_layers * moe_layer_time_s(model, hw, layout, tokens, group_tokens, roofline, flops_per_s, wb)
    head_params = model.vocab_size * h / tp
    head = _gemm(logit_tokens, head_params, EMBEDDING_BYTES_PER_PARAM, h, model.vocab_size / tp, hw.bf16_flops_per_s * hw.gemm_flops_efficiency, bytes_per_s, hw.gemm_floor_s)
    return attn + linear + dense + moe + head + input_quant_time_s(model, hw, layout, tokens)


def context_upprojection_time_s(model: ModelShape, hw: Hardware, layout: Layout, context_tokens):
    """Dense MLA's prefill attends in the heads' space: at every prompt chunk vLLM up-projects the
    chunk's cached context again (kv_b_proj: the latent to every head's key and value, the TP shard of
    the heads), a GEMM over `context_tokens` tokens whose weights the chunk's own tokens already stream:
    its FLOPs and the latent it reads and the keys and values it writes. Other attention has no such
    projection (its widths are 0: the roofline's floor, 5e-13 s a layer). Not masked with a `where`:
    the test suite's -O0 build mis-evaluated the chunk kernel with one (tests/conftest.py)."""
    tp = layout.tensor_parallel_size
    width_in, width_out = model.context_upprojection_in_per_token, model.context_upprojection_out_per_token / tp
    flops = 2.0 * context_tokens * width_in * width_out
    moved = context_tokens * (width_in + width_out) * ACTIVATION_BYTES
    bytes_per_s = hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency
    return model.softmax_layers * roofline(flops / gemm_flops_per_s(hw, layout), moved / bytes_per_s)


def kv_read_bytes_per_element(hw: Hardware, layout: Layout):
    """HBM bytes decode attention spends per KV element it reads: the stored 2 for BF16, the GPU's
    `fp8_kv_read_bytes_per_element` for an FP8 cache (its kernels dequantise as they read)."""
    return jnp.where(fp8_kv_cache(layout), hw.fp8_kv_read_bytes_per_element, layout.kv_bytes_per_element)


def attention_time_s(model: ModelShape, hw: Hardware, layout: Layout, batch: StepBatch):
    """Attention cores of one full forward: decode reads each request's KV, prefill is quadratic."""
    tp = layout.tensor_parallel_size
    heads = model.q_heads / tp
    bytes_per_s = hw.hbm_bandwidth_bytes_per_s * hw.memory_bandwidth_efficiency
    flops_per_s = hw.bf16_flops_per_s * hw.attention_flops_efficiency
    kv_token_bytes = kv_token_bytes_per_layer(model, layout)
    # Sliding-window layers read at most the window per decoding request, sparse layers the top-k.
    windowed_context = jnp.minimum(batch.decode_context_tokens, batch.decode_tokens * model.sliding_window_tokens)
    sparse = model.sparse_attention_topk > 0
    full_context = jnp.where(sparse, jnp.minimum(batch.decode_context_tokens, batch.decode_tokens * model.sparse_attention_topk), batch.decode_context_tokens)
    # Chunked layers attend within their chunk: at most a chunk per decoding request (an upper bound:
    # a query at position p reads p mod chunk + 1).
    chunked_context = jnp.minimum(full_context, batch.decode_tokens * model.attention_chunk_tokens)
    context_read = (model.full_layers - model.chunked_layers) * full_context + model.chunked_layers * chunked_context + model.sliding_layers * windowed_context
    decode_flops = 2.0 * heads * (model.attn_score_dim_decode + model.attn_value_dim_decode) * context_read
    decode = roofline(decode_flops / flops_per_s, context_read * kv_entry_bytes_per_layer(model, layout, kv_read_bytes_per_element(hw, layout)) / bytes_per_s)
    pairs = batch.prefill_attention_pairs
    chunked_pairs = jnp.minimum(pairs, batch.prefill_tokens * model.attention_chunk_tokens)
    layer_pairs = (model.softmax_layers - model.chunked_layers) * pairs + model.chunked_layers * chunked_pairs
    prefill_flops = 2.0 * heads * (model.attn_score_dim_prefill + model.attn_value_dim_prefill) * layer_pairs
    # Sparse prefill: where the prompts reach past the top-k, each query attends to k tokens in the
    # latent space (vLLM's sparse MLA prefill); shorter ones run dense attention.
    sparse_pairs = batch.prefill_tokens * model.sparse_attention_topk
    sparse_prefill = sparse & (pairs > sparse_pairs)
    sparse_flops = 2.0 * heads * (model.attn_score_dim_decode + model.attn_value_dim_decode) * sparse_pairs * model.softmax_layers
    prefill_flops = jnp.where(sparse_prefill, sparse_flops, prefill_flops)
    written = model.softmax_layers * batch.prefill_tokens * kv_token_bytes
    prefill = roofline(prefill_flops / flops_per_s, written / bytes_per_s)
    # The indexer scores every earlier token of every query (its keys read whole, on every TP rank).
    indexer_flops = model.indexer_flops_per_pair_per_layer * (pairs + batch.decode_context_tokens)
    indexer_bytes = model.indexer_bytes_per_token_per_layer * batch.decode_context_tokens
    indexer = model.full_layers * jnp.where(sparse, roofline(indexer_flops / flops_per_s, indexer_bytes / bytes_per_s), 0.0)
    # Linear attention: per-token state update plus reading/writing each sequence's state once.
    seqs = batch.decode_tokens + batch.prefill_seqs
    state_bytes = 2.0 * seqs * model.linear_state_bytes_per_layer / tp
    linear_flops = (batch.prefill_tokens + batch.decode_tokens) * model.linear_flops_per_token_per_layer / tp
    linear = model.linear_layers * roofline(linear_flops / flops_per_s, state_bytes / bytes_per_s)
    return decode + prefill + linear + indexer


def allreduce_efficiency(hw: Hardware, tp):
    """Ring-equivalent fraction of the link an all-reduce over `tp` GPUs reaches: the 8-GPU value
    times `allreduce_two_gpu_ratio` ^ ((3 - log2 tp) / 2), i.e. the ratio at 2 GPUs, its square root
    at 4, 1 from 8 on."""
    below_eight = jnp.clip(3.0 - jnp.log2(jnp.maximum(tp, 1.0)), 0.0, 2.0)
    return hw.allreduce_bandwidth_efficiency * hw.allreduce_two_gpu_ratio ** (0.5 * below_eight)


def allreduce_time_s(hw: Hardware, layout: Layout, message_bytes):
    """One ring all-reduce of `message_bytes` over the TP group; 0 when TP = 1."""
    tp = layout.tensor_parallel_size
    link = jnp.where(tp > hw.gpus_per_node, hw.inter_node_bandwidth_bytes_per_s, hw.intra_node_bandwidth_bytes_per_s)
    ring = 2.0 * (tp - 1.0) / tp * message_bytes / (link * allreduce_efficiency(hw, tp))
    # Crossing nodes adds network latency per ring hop that leaves the node.
    latency = hw.allreduce_latency_s * jnp.where(tp > hw.gpus_per_node, 4.0, 1.0)
    return jnp.where(tp > 1, latency + ring, 0.0)


def p2p_time_s(hw: Hardware, layout: Layout, message_bytes):
    """PP - 1 stage-to-stage sends of the activations (inter-node once a replica spans nodes)."""
    pp = layout.pipeline_parallel_size
    crosses = layout.gpus_per_replica > hw.gpus_per_node
    link = jnp.where(crosses, hw.inter_node_bandwidth_bytes_per_s, hw.intra_node_bandwidth_bytes_per_s)
    return (pp - 1.0) * (hw.p2p_latency_s + message_bytes / link)


def pipeline_host_overhead_s(hw: Hardware, layout: Layout, seqs):
    """Host seconds a pipeline-parallel replica (PP > 1) adds to a step of `seqs` running sequences:
    `pipeline_seq_overhead_s` each, the per-sequence output processing that vLLM's V0 engine, which serves
    PP without asynchronous output processing, runs between steps instead of behind them. 0 without PP."""
    return jnp.where(layout.pipeline_parallel_size > 1, hw.pipeline_seq_overhead_s * seqs, 0.0)


def step_cost(model: ModelShape, hw: Hardware, layout: Layout, batch: StepBatch, group_batch_tokens=None) -> StepCost:
    """Time of one scheduler step of a replica over `batch` (see the module docstring).

    group_batch_tokens: the tokens (prefill + decode) all lockstep ranks carry this step, for the
    expert layers they share; default `lockstep_ranks` x this rank's (stage 4's even spread)."""
    pp = layout.pipeline_parallel_size
    micro = StepBatch(*(field / pp for field in batch))  # one PP micro-batch
    tokens = micro.prefill_tokens + micro.decode_tokens
    group_tokens = tokens * layout.lockstep_ranks if group_batch_tokens is None else group_batch_tokens / pp
    logit_tokens = micro.decode_tokens + micro.prefill_seqs
    # Every stage works through PP micro-batches per step, so the largest stage sets the step:
    # PP x its layers, the whole model (1.0) when PP divides the layers. The LM head, on the last
    # stage, is scaled with the layers (less than PP / L too much of it).
    uneven = pp / pipeline_stages(model, layout)
    gemm = (gemm_time_s(model, hw, layout, tokens, logit_tokens, group_tokens) + context_upprojection_time_s(model, hw, layout, micro.prefill_context_tokens)) * uneven
    attention = attention_time_s(model, hw, layout, micro) * uneven
    message = tokens * model.hidden_size * ACTIVATION_BYTES
    dispatch = model.moe_layers * dispatch_combine_time_s(hw, layout, group_tokens, model.hidden_size, allreduce_efficiency)
    norms = model.norm_allreduce_layers * allreduce_time_s(hw, layout, tokens * NORM_ALLREDUCE_BYTES_PER_TOKEN)
    communication = (2.0 * model.num_layers * allreduce_time_s(hw, layout, message) + norms + dispatch) * uneven + p2p_time_s(hw, layout, message)
    seqs = batch.decode_tokens + batch.prefill_seqs
    overhead = model.num_layers * hw.layer_latency_s * uneven + hw.step_overhead_s + hw.per_seq_overhead_s * seqs + pipeline_host_overhead_s(hw, layout, seqs)
    total = gemm + attention + communication + overhead
    return StepCost(gemm, attention, communication, overhead, total)


def step_time_s(model: ModelShape, hw: Hardware, layout: Layout, batch: StepBatch, group_batch_tokens=None):
    """Seconds per step (the replay's and stage 4's clock)."""
    return step_cost(model, hw, layout, batch, group_batch_tokens).total_s


def step_times_s(model: ModelShape, hw: Hardware, layout: Layout, batches: StepBatch, group_batch_tokens):
    """`step_time_s` of K batches of one replica at once: batches' fields and group_batch_tokens carry
    a leading axis [K, ...]; result [K, ...]. One traced step function instead of K: the step is most
    of stage 4's code, and the compilation's HLO passes and emitters grow with it (bench/README.md)."""
    return jax.vmap(step_time_s, in_axes=(None, None, None, 0, 0))(model, hw, layout, batches, group_batch_tokens)
