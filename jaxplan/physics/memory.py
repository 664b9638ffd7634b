"""Memory per GPU: weights, KV cache, activations, runtime reserve.

All functions are elementwise over broadcastable arrays (a scalar layout or
[C] candidates) and return bytes per GPU of the worst pipeline stage.
"""

from __future__ import annotations

import jax.numpy as jnp

from jaxplan.physics.weight_formats import expert_bytes_per_param
from jaxplan.physics.moe import moe_weight_params_per_gpu
from jaxplan.physics.shapes import Hardware, Layout, ModelShape

GIB_BYTES = 1024.0**3
# vLLM sizes its KV cache as gpu_memory_utilization x the memory the runtime reports
# (GpuSpec.visible_hbm_fraction), minus the weights, the profile run's peak activations and the
# non-torch memory (NCCL, custom all-reduce buffers). Measured in vLLM's start-up logs (H100, vLLM
# 0.10-0.11: github.com/llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md; the
# same identity holds to 0.01 GiB on each run there): non-torch memory 0.13-0.14 GiB on one GPU,
# 0.55 GiB at TP=2. CUDA graphs are captured after the KV cache is allocated, out of the
# (1 - gpu_memory_utilization) headroom, so they are not reserved.
RUNTIME_RESERVE_BYTES = 0.15 * GIB_BYTES
MULTI_GPU_RESERVE_BYTES = 0.4 * GIB_BYTES
EMBEDDING_BYTES_PER_PARAM = 2.0  # embeddings and LM head stay BF16 under FP8 quantisation
ACTIVATION_BYTES = 2.0
# The profile run's peak is the sampler's dummy run on min(max_num_seqs, token budget) rows of
# full-vocabulary fp32 logits (gathered on every TP rank) with its softmax, sort and index copies,
# plus the forward's last hidden states: 4.76-7.38 GiB at 1,024 rows on six models with vocabularies
# of 128,256-201,088 (the source above, and an H200 log of Qwen3-Next at TP=2: 5.58 GiB), i.e.
# 38.3-38.6 bytes per logit once the hidden states are taken off, at TP 1 and 2 alike. Where the
# vocabulary is small the forward sets the peak: a vLLM 0.10.2 log of LLaVA-1.6-Mistral-7B (32k
# vocabulary, 16,384-token budget, H100) peaks at 1.97 GiB, against 2.06 for the forward here (the
# sampler would be 1.3).
SAMPLER_BYTES_PER_LOGIT = 38.4
ACTIVATION_BUFFERS_PER_TOKEN = 6.0  # residual, normed input, attention output, q/k/v, ... (hidden-sized)


def pipeline_stages(model: ModelShape, layout: Layout) -> jnp.ndarray:
    """The layer count's divisor for the largest pipeline stage: num_layers / ceil(num_layers / PP).

    vLLM splits the layers unevenly when PP does not divide them (vllm/distributed/utils.py
    get_pp_indices: floor(L / PP) per stage, one more on L mod PP of them), and the largest stage
    holds the most weights and KV per token and sets the pipeline's pace. Exactly PP when PP divides
    the layers. Layer kinds (dense, MoE, sliding, linear) are taken in the model's proportions."""
    return model.num_layers / jnp.ceil(model.num_layers / layout.pipeline_parallel_size)


def kv_heads_per_gpu(model: ModelShape, layout: Layout) -> jnp.ndarray:
    """KV heads held per GPU: kv_heads / TP, but never below one (replicated past TP = kv_heads)."""
    return jnp.maximum(model.kv_heads / layout.tensor_parallel_size, 1.0)


def kv_split_factor(model: ModelShape, layout: Layout) -> jnp.ndarray:
    """Fraction of one layer's KV a GPU holds: 1/min(TP, kv_heads) for GQA, 1 for MLA."""
    gqa = kv_heads_per_gpu(model, layout) / model.kv_heads
    return model.kv_split_by_tp * gqa + (1.0 - model.kv_split_by_tp)


def attention_params_per_gpu(model: ModelShape, tp) -> jnp.ndarray:
    """One softmax layer's projection weights on one of `tp` ranks: split by TP, except the K/V
    projections (at most kv_heads ways) and the replicated part (whole on every rank)."""
    kv, whole = model.kv_proj_params_per_layer, model.replicated_attn_params_per_layer
    return (model.attn_params_per_layer - kv - whole) / tp + kv / jnp.minimum(tp, model.kv_heads) + whole


def weight_bytes_per_gpu(model: ModelShape, layout: Layout) -> jnp.ndarray:
    """Weight shard of the heaviest pipeline stage on one GPU (bytes): the largest stage's layers and
    the larger of the embedding and the LM head (an upper bound when PP does not divide the layers:
    vLLM gives the extra layers to the stages between the first and the last)."""
    tp, pp = layout.tensor_parallel_size, layout.pipeline_parallel_size
    attn = model.softmax_layers * attention_params_per_gpu(model, tp)
    linear = model.linear_layers * model.linear_params_per_layer / tp
    dense = model.dense_mlp_layers * model.dense_mlp_params_per_layer / tp
    routed, moe_other = moe_weight_params_per_gpu(model, layout)
    other = attn + linear + dense + model.moe_layers * moe_other
    experts = model.moe_layers * routed * expert_bytes_per_param(layout.expert_weight_format)
    layers_bytes = (other * layout.weight_bytes_per_param + experts) / pipeline_stages(model, layout)
    # pp == 1: one stage holds embedding and LM head; pp > 1: the first holds one, the last the other.
    embed = model.embedding_params / tp * EMBEDDING_BYTES_PER_PARAM
    head = model.lm_head_params / tp * EMBEDDING_BYTES_PER_PARAM
    ends = jnp.where(pp > 1, jnp.maximum(embed, head), embed + head)
    return layers_bytes + ends


def kv_token_bytes_per_layer(model: ModelShape, layout: Layout) -> jnp.ndarray:
    """Cache one token holds in one softmax layer on one GPU: its K/V (or MLA latent) share with an FP8
    cache's scales, plus a sparse-attention indexer's key, which every TP rank keeps whole."""
    return kv_entry_bytes_per_layer(model, layout, layout.kv_bytes_per_element) + model.indexer_bytes_per_token_per_layer


def fp8_kv_cache(layout: Layout) -> jnp.ndarray:
    """Whether the layout's KV cache is FP8 (1 byte an element; BF16 is 2)."""
    return layout.kv_bytes_per_element < 1.5


def kv_entry_bytes_per_layer(model: ModelShape, layout: Layout, bytes_per_element) -> jnp.ndarray:
    """One token's K/V (or latent) share in one layer on one GPU at `bytes_per_element`, plus what an
    FP8 cache stores beside its one-byte elements (sparse MLA's scales and BF16 RoPE dims)."""
    fp8_extra = jnp.where(fp8_kv_cache(layout), model.fp8_kv_extra_bytes_per_token_per_layer, 0.0)
    return model.kv_elements_per_token_per_layer * kv_split_factor(model, layout) * bytes_per_element + fp8_extra


def kv_bytes_per_token_per_gpu(model: ModelShape, layout: Layout) -> jnp.ndarray:
    """KV bytes one more token costs a GPU across its stage's softmax layers (no window cap)."""
    per_layer = kv_token_bytes_per_layer(model, layout)
    return model.softmax_layers / pipeline_stages(model, layout) * per_layer


def request_kv_bytes_per_gpu(model: ModelShape, layout: Layout, context_tokens, block_size_tokens=16.0) -> jnp.ndarray:
    """Cache one request of `context_tokens` holds on one GPU: full layers grow, sliding layers cap at
    the window, linear-attention layers hold a constant state. Token counts round up to whole blocks."""
    blocks = jnp.ceil(context_tokens / block_size_tokens) * block_size_tokens
    per_layer = kv_token_bytes_per_layer(model, layout)
    windowed = jnp.minimum(blocks, jnp.ceil(model.sliding_window_tokens / block_size_tokens) * block_size_tokens)
    state = model.linear_state_bytes_per_layer / layout.tensor_parallel_size
    per_stage = model.full_layers * per_layer * blocks + model.sliding_layers * per_layer * windowed + model.linear_layers * state
    return per_stage / pipeline_stages(model, layout)


def smooth_request_kv_bytes_per_gpu(model: ModelShape, layout: Layout, context_tokens) -> jnp.ndarray:
    """`request_kv_bytes_per_gpu` without block rounding: differentiable in `context_tokens`."""
    per_layer = kv_token_bytes_per_layer(model, layout)
    windowed = jnp.minimum(context_tokens, model.sliding_window_tokens)
    state = model.linear_state_bytes_per_layer / layout.tensor_parallel_size
    per_stage = model.full_layers * per_layer * context_tokens + model.sliding_layers * per_layer * windowed + model.linear_layers * state
    return per_stage / pipeline_stages(model, layout)


def activation_bytes_per_gpu(model: ModelShape, layout: Layout) -> jnp.ndarray:
    """Peak activation memory of vLLM's start-up profile run (bytes): the larger of the forward pass
    at the token budget and the sampler's dummy run over min(max_num_seqs, token budget) requests."""
    tp = layout.tensor_parallel_size
    tokens = layout.max_num_batched_tokens
    hidden_buffers = ACTIVATION_BUFFERS_PER_TOKEN * model.hidden_size
    ffn_buffers = 3.0 * model.ffn_intermediate_per_token / tp  # gate, up and their product
    forward = tokens * (hidden_buffers + ffn_buffers) * ACTIVATION_BYTES
    sampled_rows = jnp.minimum(layout.max_num_seqs, tokens)
    sampler = sampled_rows * model.vocab_size * SAMPLER_BYTES_PER_LOGIT + tokens * model.hidden_size * ACTIVATION_BYTES
    return jnp.maximum(forward, sampler)


def runtime_reserve_bytes(layout: Layout) -> jnp.ndarray:
    return RUNTIME_RESERVE_BYTES + jnp.where(layout.gpus_per_replica > 1, MULTI_GPU_RESERVE_BYTES, 0.0)


def kv_budget_bytes_per_gpu(model: ModelShape, hw: Hardware, layout: Layout, gpu_memory_utilization) -> jnp.ndarray:
    """Bytes left for the KV cache on one GPU (negative: the model does not fit)."""
    usable = gpu_memory_utilization * hw.visible_hbm_fraction * hw.hbm_bytes
    return usable - weight_bytes_per_gpu(model, layout) - activation_bytes_per_gpu(model, layout) - runtime_reserve_bytes(layout)


def kv_blocks_per_replica(model: ModelShape, hw: Hardware, layout: Layout, gpu_memory_utilization, block_size_tokens=16.0) -> jnp.ndarray:
    """KV blocks a replica can hold (every GPU of a replica holds the same tokens' slice)."""
    free = jnp.maximum(kv_budget_bytes_per_gpu(model, hw, layout, gpu_memory_utilization), 0.0)
    return jnp.floor(free / (block_size_tokens * kv_bytes_per_token_per_gpu(model, layout)))


def replay_kv_blocks(model: ModelShape, hw: Hardware, layout: Layout, gpu_memory_utilization, block_size_tokens, mean_context_tokens) -> jnp.ndarray:
    """KV blocks for the replay's scheduler, which gives a request of context c ceil(c / block) blocks
    of `kv_bytes_per_token_per_gpu` (every softmax layer's KV). A model with sliding-window layers
    holds less per request (vLLM frees their blocks outside the window) and one with linear-attention
    layers more (a constant state): the cache counts as `kv_blocks_per_replica` x what a request of
    `mean_context_tokens` (ISL + OSL / 2) would hold at the full per-token cost over what it holds,
    the capacity stage 4 (`steady_state.max_concurrency`) prices. Full-attention models: unchanged."""
    blocks = kv_blocks_per_replica(model, hw, layout, gpu_memory_utilization, block_size_tokens)
    full = kv_bytes_per_token_per_gpu(model, layout) * mean_context_tokens
    held = smooth_request_kv_bytes_per_gpu(model, layout, mean_context_tokens)
    uniform = (model.sliding_layers == 0) & (model.linear_layers == 0)
    return jnp.where(uniform, blocks, jnp.floor(blocks * full / jnp.maximum(held, 1e-30)))
