"""A plain-Python reference of funnel stages 1-3 (and a per-candidate stage 4 tally).

Written for the tests, independently of `jaxplan.physics` and `jaxplan.funnel`: every candidate of
the grid is visited in a Python loop (grid index order: GPU type outermost, KV dtype innermost), and
the structure, memory and capacity sieves are re-derived here in float64 from the raw architecture
fields of the ModelSpec (head counts, dims, layer kinds), not from `ModelSpec`'s derived counts nor
from `ModelShape`. Stage 4 (the steady-state estimate) is too long to re-derive, so `stage4_counts`
calls `jaxplan.funnel.estimate.estimate_stage` on the stage-3 survivors; what it checks there is the
funnel's plumbing (paging, compaction, padding, histogramming), not the estimate's physics.

The memory model being re-derived (jaxplan's documented assumptions):
  * the largest pipeline stage holds max(vLLM's split) of the layers (get_pp_indices: floor(L / PP)
    per stage, one more on the L mod PP stages before the last), each layer kind in the model's
    proportions; its share of the layer weights and of the KV per GPU is that count / L;
  * weights of the heaviest pipeline stage on one GPU: the largest stage's transformer-layer weights
    split over TP ranks, except GQA's K/V projections, split at most `num_kv_heads` ways
    (replicated past that) and MoE routers (replicated); embedding and LM head are BF16 and split by
    TP, both on the single stage when PP = 1, one each on the first/last stage when PP > 1;
  * activations at the token budget: T x (6 hidden + 3 widest-FFN / TP) BF16 values, plus fp32
    logits of max_num_seqs x vocab / TP;
  * a runtime reserve of 1 GiB, plus 0.4 GiB when the replica has more than one GPU;
  * KV: per softmax layer and token 2 x kv_heads x head_dim elements (GQA; split by min(TP, kv
    heads)) or kv_lora_rank + rope dim (MLA; not split); sliding layers hold at most the window;
    linear-attention layers a constant recurrent + conv state per request, split by TP;
  * stage 2: reject when gpu_memory_utilization x HBM - weights - activations - reserve <= 0, or
    when it is below one longest (p99) request's KV, rounded up to whole blocks;
  * stage 3: slots = min(max_num_seqs, KV free / KV of a request at the mean live context ISL + OSL/2
    (no block rounding), PP x token budget x OSL / (OSL + uncached ISL)); reject when < 1.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np

from jaxplan.funnel.reasons import Reason
from jaxplan.specs.space import DTYPE_BYTES

GIB = 1024.0**3
P99_Z = 2.326


# ---- architecture, from the raw config fields ------------------------------------------------------
def softmax_attention_params(m) -> tuple[float, float, float]:
    """(all projection weights of one softmax-attention layer, the K/V-projection part of them, the part
    vLLM replicates on every TP rank: MLA's q_a / kv_a down-projections and a sparse-attention indexer)."""
    h = m.hidden_size
    if m.kv_lora_rank:  # MLA: q (optionally low-rank), joint KV down-projection, per-head up-projection, o
        q_dim = m.num_attention_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim)
        q = h * m.q_lora_rank + m.q_lora_rank * q_dim if m.q_lora_rank else h * q_dim
        kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim)
        kv_up = m.kv_lora_rank * m.num_attention_heads * (m.qk_nope_head_dim + m.v_head_dim)
        o = m.num_attention_heads * m.v_head_dim * h
        # a sparse-attention indexer: query up-projection from the compressed query, a key and a head weight from h
        indexer = (m.q_lora_rank or h) * m.indexer_heads * m.indexer_head_dim + h * (m.indexer_head_dim + m.indexer_heads)
        indexer = indexer if m.sparse_attention_topk else 0
        return float(q + kv_down + kv_up + o + indexer), 0.0, float(h * m.q_lora_rank + kv_down + indexer)
    q = h * m.num_attention_heads * m.head_dim * (2 if m.attn_output_gate else 1)  # gated: q and its gate
    k = v = h * m.num_kv_heads * m.head_dim
    o = m.num_attention_heads * m.head_dim * h
    return float(q + k + v + o), float(k + v), 0.0


def linear_attention_params(m) -> float:
    """Gated DeltaNet layer: q/k/v/z and b/a input projections, a causal conv over q, k, v, out proj."""
    if not m.linear_attention_layers:
        return 0.0
    qk = m.linear_num_key_heads * m.linear_key_head_dim
    vv = m.linear_num_value_heads * m.linear_value_head_dim
    return float(m.hidden_size * (qk + qk + vv + vv) + m.hidden_size * 2 * m.linear_num_value_heads + m.linear_conv_kernel * (qk + qk + vv) + vv * m.hidden_size)


def linear_state_bytes(m) -> float:
    """Per request and linear layer: fp32-ish (dk x dv) state per value head plus the conv tail (BF16)."""
    if not m.linear_attention_layers:
        return 0.0
    qk = m.linear_num_key_heads * m.linear_key_head_dim
    vv = m.linear_num_value_heads * m.linear_value_head_dim
    recurrent = m.linear_num_value_heads * m.linear_key_head_dim * m.linear_value_head_dim * m.linear_state_bytes_per_element
    conv = max(m.linear_conv_kernel - 1, 0) * (qk + qk + vv) * 2
    return float(recurrent + conv)


def layer_counts(m) -> dict[str, int]:
    moe = m.num_layers - m.first_dense_layers if m.num_experts else 0
    return {
        "full": m.full_attention_layers,
        "sliding": m.sliding_window_layers,
        "linear": m.linear_attention_layers,
        "moe": moe,
        "dense": m.num_layers - moe,
    }


def kv_elements_per_token_per_layer(m) -> float:
    if m.kv_lora_rank:
        return float(m.kv_lora_rank + m.qk_rope_head_dim)
    return float(2 * m.num_kv_heads * m.head_dim)


def kv_fraction_per_gpu(m, tp: int) -> float:
    """Share of one layer's KV a TP rank holds: GQA heads split at most kv_heads ways; MLA replicated."""
    if m.kv_lora_rank:
        return 1.0
    return 1.0 / min(tp, m.num_kv_heads)


# ---- pipeline stages -----------------------------------------------------------------------------------
def stage_layers(num_layers: int, pp: int) -> list[int]:
    """vLLM's layer count per pipeline stage when PP does not divide the layers."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def largest_stage_share(m, pp: int) -> float:
    """The largest stage's share of the layers."""
    return max(stage_layers(m.num_layers, pp)) / m.num_layers


# ---- weight formats, layout kinds ------------------------------------------------------------------------
# (bytes of a routed-expert parameter, bytes of every other parameter): MXFP4 = 4 bits + an 8-bit scale per
# 32; INT4 = 4 bits + a 16-bit scale per 32; NVFP4 = 4 bits + an 8-bit scale per 16. MXFP4 and INT4
# checkpoints quantise only the experts.
FORMAT_BYTES = {"bf16": (2.0, 2.0), "fp8": (1.0, 1.0), "nvfp4": (0.5625, 0.5625), "mxfp4": (0.53125, 2.0), "int4": (0.5625, 2.0)}


def kind_of(label: str) -> tuple[bool, int]:
    """A grid layout-kind label ('tp', 'ep', 'dp:4', 'dp_ep:4') -> (expert parallel, lock-step ranks)."""
    kind, _, ranks = label.partition(":")
    return kind in ("ep", "dp_ep"), int(ranks) if ranks else 1


# ---- memory per GPU ----------------------------------------------------------------------------------
def weight_bytes_per_gpu(m, tp: int, pp: int, weight_dtype: str, expert_parallel: bool = False, lockstep: int = 1) -> float:
    """Routed experts split over lockstep x TP GPUs: sliced, or whole (the heaviest GPU holds the
    ceiling) with expert parallelism; everything else as a dense model."""
    expert_bytes, other_bytes = FORMAT_BYTES[weight_dtype]
    n = layer_counts(m)
    h = m.hidden_size
    attn_all, attn_kv, attn_whole = softmax_attention_params(m)
    softmax = (n["full"] + n["sliding"]) * ((attn_all - attn_kv - attn_whole) / tp + attn_kv / min(tp, m.num_kv_heads) + attn_whole)
    linear = n["linear"] * linear_attention_params(m) / tp
    dense = n["dense"] * 3 * h * m.intermediate_size / tp
    expert = 3 * h * m.moe_intermediate_size
    group = tp * lockstep
    routed = math.ceil(m.num_experts / group) if expert_parallel else m.num_experts / group
    other = softmax + linear + dense + n["moe"] * (m.num_shared_experts * expert / tp + h * m.num_experts)
    per_stage = (other * other_bytes + n["moe"] * routed * expert * expert_bytes) * largest_stage_share(m, pp)
    embed = m.vocab_size * h / tp * 2.0
    head = 0.0 if m.tie_word_embeddings else m.vocab_size * h / tp * 2.0
    return per_stage + (embed + head if pp == 1 else max(embed, head))


def activation_bytes_per_gpu(m, tp: int, max_num_seqs: int, max_num_batched_tokens: int) -> float:
    """vLLM's profile peak: the forward at the token budget or the sampler's dummy run, whichever is
    larger (38.4 B per full-vocabulary logit row element, plus the last hidden states)."""
    dense_ffn = m.intermediate_size if layer_counts(m)["dense"] else 0
    moe_ffn = (m.experts_per_token + m.num_shared_experts) * m.moe_intermediate_size
    widest = max(dense_ffn, moe_ffn)
    forward = max_num_batched_tokens * (6.0 * m.hidden_size + 3.0 * widest / tp) * 2.0
    sampler = min(max_num_seqs, max_num_batched_tokens) * m.vocab_size * 38.4 + max_num_batched_tokens * m.hidden_size * 2.0
    return max(forward, sampler)


def reserve_bytes(tp: int, pp: int) -> float:
    return 0.15 * GIB + (0.4 * GIB if tp * pp > 1 else 0.0)


def free_kv_bytes_per_gpu(m, gpu, space, tp, pp, weight_bytes, max_num_seqs, max_num_batched_tokens) -> float:
    """`weight_bytes`: a weight dtype name, or (dtype, expert parallel, lock-step ranks)."""
    usable = space.gpu_memory_utilization * gpu.visible_hbm_fraction * gpu.hbm_bytes
    weights = weight_bytes_per_gpu(m, tp, pp, *weight_bytes) if isinstance(weight_bytes, tuple) else weight_bytes_per_gpu(m, tp, pp, weight_bytes)
    return usable - weights - activation_bytes_per_gpu(m, tp, max_num_seqs, max_num_batched_tokens) - reserve_bytes(tp, pp)


def request_kv_bytes_per_gpu(m, tp: int, pp: int, kv_bytes: float, tokens: float, block: int | None) -> float:
    """KV + state one request of `tokens` holds on one GPU; `block` rounds tokens up (None: exact)."""
    per_layer_token = kv_elements_per_token_per_layer(m) * kv_fraction_per_gpu(m, tp) * kv_bytes
    if m.sparse_attention_topk:  # the sparse-attention indexer's FP8 key, a 4-byte scale per 128 values, on every rank
        per_layer_token += m.indexer_head_dim + 4 * math.ceil(m.indexer_head_dim / 128)
        if kv_bytes == 1 and m.kv_lora_rank:  # vLLM's fp8_ds_mla record: a 4-byte scale per 128 latent values, RoPE dims in BF16
            per_layer_token += 4 * math.ceil(m.kv_lora_rank / 128) + m.qk_rope_head_dim
    if block:
        tokens = math.ceil(tokens / block) * block
        window = math.ceil(m.sliding_window_tokens / block) * block
    else:
        window = m.sliding_window_tokens
    total = m.full_attention_layers * per_layer_token * tokens
    total += m.sliding_window_layers * per_layer_token * min(tokens, window)
    total += m.linear_attention_layers * linear_state_bytes(m) / tp
    return total * largest_stage_share(m, pp)


# ---- the workload's lengths ---------------------------------------------------------------------------
def p99_over_mean(distribution: str, spread: float) -> float:
    """p99 / mean of a length distribution (uniform on mean x [1 - s, 1 + s]; lognormal with CV s)."""
    if distribution == "uniform":
        low, high = 1.0 - spread, 1.0 + spread
        return low + 0.99 * (high - low)
    if distribution == "lognormal" and spread > 0:
        sigma = math.sqrt(math.log(1.0 + spread * spread))
        return math.exp(-0.5 * sigma * sigma + P99_Z * sigma)  # mean = 1 -> mu = -sigma^2 / 2
    return 1.0


def longest_request_tokens(w) -> float:
    isl = w.isl_mean_tokens * p99_over_mean(w.isl_distribution.value, w.isl_spread)
    osl = w.osl_mean_tokens * p99_over_mean(w.osl_distribution.value, w.osl_spread)
    return isl + osl


# ---- the sieves, one candidate at a time ----------------------------------------------------------------
def structure_reason(m, gpu, space, tp, pp, dp, seqs, budget_tokens, weight_dtype, expert_parallel=False, lockstep=1) -> Reason:
    """`dp` counts servers; a lock-step server holds `lockstep` ranks of TP x PP GPUs."""
    other_bytes = FORMAT_BYTES[weight_dtype][1]
    if m.num_attention_heads % tp or m.hidden_size % tp:
        return Reason.TP_HEADS
    kv = m.num_kv_heads
    if not m.kv_lora_rank and kv and (kv % tp if kv >= tp else tp % kv):  # GQA: TP splits or replicates KV heads
        return Reason.KV_HEADS
    if pp > m.num_layers:
        return Reason.PP_LAYERS
    if expert_parallel and tp * lockstep == 1:
        return Reason.EP_ONE_GPU
    if tp * pp * lockstep > gpu.gpus_per_node and not space.allow_multi_node:
        return Reason.NODE_FIT
    if tp * pp * lockstep * dp > space.gpu_budget:
        return Reason.GPU_BUDGET
    if other_bytes == 1 and gpu.fp8_flops_per_s <= 0:
        return Reason.FP8_UNSUPPORTED
    if other_bytes < 1 and gpu.fp4_flops_per_s <= 0:
        return Reason.FP4_UNSUPPORTED
    if weight_dtype in ("mxfp4", "int4") and 0 < gpu.compute_capability < 8.0:
        return Reason.EXPERT_FORMAT_UNSUPPORTED
    if budget_tokens < seqs:
        return Reason.BUDGET_BELOW_SEQS
    return Reason.ADMITTED


def memory_reason(m, gpu, space, w, tp, pp, seqs, budget_tokens, weight_bytes, kv_bytes) -> Reason:
    free = free_kv_bytes_per_gpu(m, gpu, space, tp, pp, weight_bytes, seqs, budget_tokens)
    if free <= 0:
        return Reason.WEIGHTS_DONT_FIT
    if free < request_kv_bytes_per_gpu(m, tp, pp, kv_bytes, longest_request_tokens(w), space.block_size_tokens):
        return Reason.NO_KV_FOR_LONGEST_REQUEST
    return Reason.ADMITTED


def slots(m, gpu, space, w, tp, pp, seqs, budget_tokens, weight_bytes, kv_bytes) -> float:
    free = max(free_kv_bytes_per_gpu(m, gpu, space, tp, pp, weight_bytes, seqs, budget_tokens), 0.0)
    live = w.isl_mean_tokens + 0.5 * w.osl_mean_tokens
    by_kv = free / request_kv_bytes_per_gpu(m, tp, pp, kv_bytes, live, None)
    uncached = w.isl_mean_tokens * (1.0 - w.prefix_hit_rate)
    by_budget = pp * budget_tokens * w.osl_mean_tokens / (w.osl_mean_tokens + uncached)
    return min(seqs, by_kv, by_budget)


def candidates(gpus, space):
    """(index, digits, {axis name: value}) of every candidate, in grid-index order (the axis order is
    the grid's definition, `jaxplan.grid.AXES`, outermost first)."""
    from jaxplan.grid import AXES

    values = {"gpu": list(gpus), **{name: list(v) for name, v in space.axis_values().items()}}
    axes = [values[name] for name in AXES]
    for index, digits in enumerate(itertools.product(*(range(len(a)) for a in axes))):
        yield index, digits, {name: axis[d] for name, axis, d in zip(AXES, axes, digits)}


def candidate_reason(m, w, space, c: dict) -> Reason:
    """Stages 1-3 of one candidate `c` ({axis name: value} as `candidates` gives it, "gpu" a GpuSpec):
    the first sieve's reason, or ADMITTED. bench/bench_baseline.py calls it too."""
    gpu, tp, pp, dp = c["gpu"], c["tensor_parallel_size"], c["pipeline_parallel_size"], c["data_parallel_size"]
    seqs, budget_tokens = c["max_num_seqs"], c["max_num_batched_tokens"]
    expert_parallel, lockstep = kind_of(c["layout_kind"])
    wb, kvb = (c["weight_dtype"], expert_parallel, lockstep), DTYPE_BYTES[c["kv_cache_dtype"]]
    reason = structure_reason(m, gpu, space, tp, pp, dp, seqs, budget_tokens, *wb)
    if reason == Reason.ADMITTED:
        reason = memory_reason(m, gpu, space, w, tp, pp, seqs, budget_tokens, wb, kvb)
    if reason == Reason.ADMITTED and slots(m, gpu, space, w, tp, pp, seqs, budget_tokens, wb, kvb) < 1.0:
        reason = Reason.NO_CONCURRENCY
    return reason


def stages_1_to_3(m, gpus, w, space):
    """(Counter of reasons of stages 1-3, digits of the candidates that pass stage 3)."""
    counts: Counter = Counter()
    survivors = []
    for _, digits, c in candidates(gpus, space):
        reason = candidate_reason(m, w, space, c)
        if reason == Reason.ADMITTED:
            survivors.append(digits)
        else:
            counts[reason] += 1
    return counts, np.array(survivors, np.int32).reshape(len(survivors), -1)


PAD = 4096  # stage-4 inputs are padded to this many candidates: one compilation for every test


def stage4_counts(ctx, survivor_digits: np.ndarray) -> Counter:
    """Stage-4 reasons of the stage-3 survivors: one jaxplan estimate over all of them at once (no
    chunks, no pages, no DP factorisation; padded to PAD rows, the padding is dropped)."""
    import jax.numpy as jnp

    counts: Counter = Counter()
    n = len(survivor_digits)
    if n == 0:
        return counts
    assert n <= PAD
    padded = np.concatenate([survivor_digits, np.repeat(survivor_digits[:1], PAD - n, axis=0)])
    from jaxplan.funnel.chunk import rows_context

    # the model traced and the DP axis padded: the same compilation serves every model and space
    reason = np.asarray(_stage4_reason(rows_context(ctx), jnp.asarray(padded)))[:n]
    for r in reason:
        counts[Reason(int(r))] += 1
    return counts


def _stage4_reason_impl(ctx, digits):
    from jaxplan.funnel.estimate import estimate_stage
    import jax.numpy as jnp

    from jaxplan.funnel.chunk import layout_of
    from jaxplan.grid import AXES, candidates_from_digits
    from jaxplan.physics.shapes import take
    from jaxplan.physics.steady_state import max_concurrency

    hw = take(ctx.hardware, digits[:, AXES.index("gpu")])
    # Stage 4 is jaxplan's own estimate here (see the module docstring): the grid's decoding serves.
    layout = layout_of(candidates_from_digits(ctx.axis_values, digits, jnp.ones(digits.shape[0], bool)))
    capacity = max_concurrency(ctx.model, hw, layout, ctx.workload, ctx.gpu_memory_utilization)
    reason, *_ = estimate_stage(ctx.model, hw, layout, ctx.workload, ctx.gpu_memory_utilization, capacity)
    return reason


def _stage4_reason(ctx, digits):
    import jax

    global _STAGE4_JIT
    if _STAGE4_JIT is None:
        _STAGE4_JIT = jax.jit(_stage4_reason_impl)
    return _STAGE4_JIT(ctx, digits)


_STAGE4_JIT = None
