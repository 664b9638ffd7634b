"""ModelSpec: the architecture numbers the physics needs, validated once.

Per-layer attention kinds are counts (layers are homogeneous within a kind):
full grouped-query attention, sliding-window attention (KV capped at the
window), linear attention (constant recurrent state per request, e.g.
Gated DeltaNet in Qwen3.5), and multi-head latent attention (MLA, a
compressed KV latent per token, as in DeepSeek-V3). The feed-forward is dense
or mixture-of-experts (total vs active experts).
"""

from __future__ import annotations

import dataclasses

from jaxplan.errors import PlanError, bad_value

POSITIVE_INT_FIELDS = (
    "num_layers",
    "hidden_size",
    "vocab_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
)
# Optional counts and dims: 0 means "not used"; negative values are never meaningful.
NON_NEGATIVE_INT_FIELDS = (
    "sliding_window_layers",
    "sliding_window_tokens",
    "linear_attention_layers",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel",
    "linear_state_bytes_per_element",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_experts",
    "experts_per_token",
    "moe_intermediate_size",
    "num_shared_experts",
    "first_dense_layers",
    "sparse_attention_topk",
    "indexer_heads",
    "indexer_head_dim",
    "chunked_attention_layers",
    "attention_chunk_tokens",
)
# Native weight format of the checkpoint an hf_id names ("" = not recorded). A MoE checkpoint stored as
# mxfp4 or int4 (experts only) is planned in that format by default (`SearchSpace.for_model`).
CHECKPOINT_WEIGHT_FORMATS = ("", "bf16", "fp8", "nvfp4", "mxfp4", "int4", "other")
# Guards against absurd inputs (a 10^30-parameter model): generous upper bounds.
MAX_DIM = 1 << 20
MAX_LAYERS = 4096
MAX_PARAMS = 1e14


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """A transformer's shape. All counts are plain ints; bytes come from dtypes later."""

    name: str
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    max_position_embeddings: int
    hf_id: str = ""
    aliases: tuple[str, ...] = ()
    tie_word_embeddings: bool = False
    attn_output_gate: bool = False
    # One RMSNorm over all of an attention layer's query heads and one over its key heads, rather
    # than per head (MiniMax-M2's qk_norm_type "per_layer"): under TP, vLLM all-reduces their
    # variances across the ranks in every attention layer (MiniMaxText01RMSNormTP.forward_qk).
    qk_norm_across_heads: bool = False
    # Attention kinds: counts of layers of each kind; they sum to num_layers.
    full_attention_layers: int = -1  # -1: all layers not of another kind
    sliding_window_layers: int = 0
    sliding_window_tokens: int = 0
    # Chunked local attention (Llama 4's `attention_chunk_size`): of the full-attention layers, these
    # attend only within their query's chunk of `attention_chunk_tokens`; they keep every token's KV,
    # as vLLM's cache does without its hybrid manager (docs/moe.md).
    chunked_attention_layers: int = 0
    attention_chunk_tokens: int = 0
    linear_attention_layers: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    linear_state_bytes_per_element: int = 4  # recurrent state kept in fp32
    # Multi-head latent attention (all full-attention layers are MLA when kv_lora_rank > 0).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # DeepSeek sparse attention (DeepSeek-V3.2, GLM-5: `index_topk`, `index_n_heads`, `index_head_dim`):
    # an indexer scores every earlier token with its own small keys, and each query attends to the
    # `sparse_attention_topk` best (0: dense attention).
    sparse_attention_topk: int = 0
    indexer_heads: int = 0
    indexer_head_dim: int = 0
    # Mixture of experts (num_experts == 0: dense).
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    first_dense_layers: int = 0
    checkpoint_weight_format: str = ""
    # The user named this very checkpoint (a quantised checkpoint's id, or a config.json): vLLM serves
    # it in its stored format, which the sweep then plans by default (`SearchSpace.for_model`).
    named_checkpoint: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        where = f"model {self.name!r}"
        for field in POSITIVE_INT_FIELDS:
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise bad_value(field, value, "must be a positive integer", where=where)
            if value > (MAX_LAYERS if field == "num_layers" else MAX_DIM * 256):
                raise bad_value(field, value, "is implausibly large for a transformer; check the units", where=where)
        for field in NON_NEGATIVE_INT_FIELDS + ("full_attention_layers",):
            value = getattr(self, field)
            low = -1 if field == "full_attention_layers" else 0  # -1: derived below
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_DIM * 256:
                raise bad_value(field, value, f"must be an integer in {low}..{MAX_DIM * 256}", where=where)
        if self.full_attention_layers == -1:
            object.__setattr__(
                self,
                "full_attention_layers",
                self.num_layers - self.sliding_window_layers - self.linear_attention_layers,
            )
        kinds = self.full_attention_layers + self.sliding_window_layers + self.linear_attention_layers
        if min(self.full_attention_layers, self.sliding_window_layers, self.linear_attention_layers) < 0 or kinds != self.num_layers:
            raise bad_value(
                "full_attention_layers + sliding_window_layers + linear_attention_layers",
                kinds,
                f"must equal num_layers = {self.num_layers}",
                where=where,
            )
        if self.num_attention_heads % self.num_kv_heads:
            raise bad_value(
                "num_kv_heads", self.num_kv_heads, f"must divide num_attention_heads = {self.num_attention_heads}", where=where
            )
        if self.sliding_window_layers and self.sliding_window_tokens <= 0:
            raise bad_value("sliding_window_tokens", self.sliding_window_tokens, "must be > 0 when sliding_window_layers > 0", where=where)
        if self.linear_attention_layers:
            for field in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim"):
                if getattr(self, field) <= 0:
                    raise bad_value(field, getattr(self, field), "linear-attention layers need their head counts and dims > 0", where=where)
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts:
                raise bad_value("experts_per_token", self.experts_per_token, f"must be in 1..num_experts = {self.num_experts}", where=where)
            if self.moe_intermediate_size <= 0:
                raise bad_value("moe_intermediate_size", self.moe_intermediate_size, "must be > 0 for a mixture-of-experts model", where=where)
            if self.first_dense_layers > self.num_layers:
                raise bad_value("first_dense_layers", self.first_dense_layers, f"must be <= num_layers = {self.num_layers}", where=where)
        if self.is_mla and min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) <= 0:
            raise bad_value("qk_rope_head_dim", self.qk_rope_head_dim, "MLA needs qk_nope_head_dim, qk_rope_head_dim and v_head_dim > 0", where=where)
        if self.chunked_attention_layers > self.full_attention_layers:
            raise bad_value("chunked_attention_layers", self.chunked_attention_layers, f"must be <= full_attention_layers = {self.full_attention_layers}", where=where)
        if self.chunked_attention_layers and self.attention_chunk_tokens <= 0:
            raise bad_value("attention_chunk_tokens", self.attention_chunk_tokens, "must be > 0 when chunked_attention_layers > 0", where=where)
        if self.sparse_attention_topk and min(self.indexer_heads, self.indexer_head_dim) <= 0:
            raise bad_value("indexer_heads", self.indexer_heads, "sparse attention (sparse_attention_topk > 0) needs indexer_heads and indexer_head_dim > 0", where=where)
        if self.checkpoint_weight_format not in CHECKPOINT_WEIGHT_FORMATS:
            raise bad_value(
                "checkpoint_weight_format", self.checkpoint_weight_format,
                f"use one of {', '.join(repr(f) for f in CHECKPOINT_WEIGHT_FORMATS)}", where=where,
            )
        if self.total_params > MAX_PARAMS:
            raise PlanError(f"{where}: {self.total_params:.3g} parameters is implausible (limit {MAX_PARAMS:.0e}); check the config's sizes")

    # ---- attention shapes -------------------------------------------------------
    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def served_weight_dtype(self) -> str:
        """The weight format vLLM serves this checkpoint in when no other is asked for: the one it is
        stored in (gpt-oss: mxfp4; an -FP8 checkpoint: fp8), bf16 where that is not recorded or priced."""
        return self.checkpoint_weight_format if self.checkpoint_weight_format not in ("", "other") else "bf16"

    @property
    def q_heads_dim(self) -> int:
        """Query width of one attention layer (heads x per-head query dim)."""
        per_head = self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim
        return self.num_attention_heads * per_head

    def attention_params_per_layer(self) -> int:
        """Projection weights of one softmax-attention layer (GQA or MLA)."""
        h = self.hidden_size
        if self.is_mla:
            q_up = self.q_lora_rank * self.q_heads_dim if self.q_lora_rank else h * self.q_heads_dim
            kv_b = self.kv_lora_rank * self.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim)
            o = self.num_attention_heads * self.v_head_dim * h
            return self._mla_down_projection_params() + q_up + kv_b + o + self.indexer_params_per_layer()
        q = h * self.num_attention_heads * self.head_dim * (2 if self.attn_output_gate else 1)
        kv = 2 * h * self.num_kv_heads * self.head_dim
        o = self.num_attention_heads * self.head_dim * h
        return q + kv + o

    def indexer_params_per_layer(self) -> int:
        """Sparse attention's indexer: its queries from the compressed query (or the hidden state), one
        key and one weight per head from the hidden state (vLLM's Indexer: wq_b, wk, weights_proj)."""
        if not self.sparse_attention_topk:
            return 0
        width = self.indexer_heads * self.indexer_head_dim
        return (self.q_lora_rank or self.hidden_size) * width + self.hidden_size * (self.indexer_head_dim + self.indexer_heads)

    def indexer_bytes_per_token_per_layer(self) -> int:
        """The indexer's key of one token in one layer: FP8 values and a 4-byte scale per 128 of them
        (vLLM's DeepseekV32IndexerCache), whatever the KV cache's dtype; every TP rank holds it."""
        if not self.sparse_attention_topk:
            return 0
        return self.indexer_head_dim + -(-self.indexer_head_dim // 128) * 4

    def fp8_kv_extra_bytes_per_token_per_layer(self) -> int:
        """Bytes an FP8 cache stores per token and layer beyond one per element. Sparse MLA in FP8 is
        vLLM's `fp8_ds_mla` record (FlashMLA's sparse kernels): the latent in FP8 with a 4-byte scale per
        128 values, and the RoPE dims kept in BF16, 656 B for DeepSeek-V3.2's 576 elements. Other FP8
        caches keep one scale per tensor."""
        if not (self.sparse_attention_topk and self.is_mla):
            return 0
        return -(-self.kv_lora_rank // 128) * 4 + self.qk_rope_head_dim

    def replicated_attention_params_per_layer(self) -> int:
        """Projections of one softmax layer that every TP rank holds whole: MLA's down-projections of the
        query and the joint KV latent (vLLM's q_a_proj and kv_a_proj_with_mqa, or their fused form) and
        the whole sparse-attention indexer (wq_b, wk, weights_proj), all `ReplicatedLinear` in vLLM."""
        if not self.is_mla:
            return 0
        return self._mla_down_projection_params() + self.indexer_params_per_layer()

    def _mla_down_projection_params(self) -> int:
        """MLA's down-projections of one layer: the query's to its rank (none without q_lora_rank) and
        the joint KV latent's with the RoPE key."""
        return self.hidden_size * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)

    def context_upprojection_widths(self) -> tuple[int, int]:
        """(input, output) elements per token of MLA's key/value up-projection (kv_b_proj: the latent
        -> every head's no-RoPE key and value), which dense MLA prefill applies again to the cached
        context of a prompt chunk at every chunk (vLLM's MLA chunked-context path attends in the
        heads' space, not the latent one). (0, 0) for GQA, and for sparse MLA, whose prefill attends
        in the latent space."""
        if not self.is_mla or self.sparse_attention_topk:
            return 0, 0
        return self.kv_lora_rank, self.num_attention_heads * (self.qk_nope_head_dim + self.v_head_dim)

    def kv_params_per_layer(self) -> int:
        """K and V projection weights of one GQA layer (replicated when TP > KV heads)."""
        return 0 if self.is_mla else 2 * self.hidden_size * self.num_kv_heads * self.head_dim

    def linear_attention_params_per_layer(self) -> int:
        """Projection weights of one linear-attention (Gated DeltaNet) layer."""
        if not self.linear_attention_layers:
            return 0
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        in_proj = self.hidden_size * (2 * key_dim + 2 * value_dim + 2 * self.linear_num_value_heads)
        conv = self.linear_conv_kernel * (2 * key_dim + value_dim)
        return in_proj + conv + value_dim * self.hidden_size

    # ---- feed-forward -------------------------------------------------------------
    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def dense_mlp_layers(self) -> int:
        return self.num_layers - self.moe_layers

    def expert_params(self) -> int:
        """One routed expert's weights (gate, up, down)."""
        return 3 * self.hidden_size * self.moe_intermediate_size

    def dense_mlp_params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    # ---- totals -----------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def layer_params(self, *, active: bool) -> int:
        """All transformer-layer weights; active=True counts only routed experts a token uses."""
        softmax_layers = self.full_attention_layers + self.sliding_window_layers
        attn = softmax_layers * self.attention_params_per_layer()
        attn += self.linear_attention_layers * self.linear_attention_params_per_layer()
        experts = self.experts_per_token if active else self.num_experts
        moe = self.moe_layers * (
            (experts + self.num_shared_experts) * self.expert_params() + self.hidden_size * self.num_experts
        )
        dense = self.dense_mlp_layers * self.dense_mlp_params()
        return attn + moe + dense

    @property
    def total_params(self) -> int:
        return self.layer_params(active=False) + self.embedding_params + self.lm_head_params

    @property
    def active_params(self) -> int:
        return self.layer_params(active=True) + self.embedding_params + self.lm_head_params

    # ---- KV cache -----------------------------------------------------------------
    def kv_elements_per_token_per_layer(self) -> int:
        """Cached elements per token in one softmax-attention layer (whole model, no TP split)."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, kv_bytes_per_element: int = 2) -> int:
        """KV bytes per token if every softmax layer kept every token (no window cap, no TP)."""
        layers = self.full_attention_layers + self.sliding_window_layers
        fp8_extra = self.fp8_kv_extra_bytes_per_token_per_layer() if kv_bytes_per_element == 1 else 0
        return layers * (self.kv_elements_per_token_per_layer() * kv_bytes_per_element + fp8_extra + self.indexer_bytes_per_token_per_layer())

    def linear_state_bytes_per_request_per_layer(self) -> int:
        """Constant recurrent + conv state one request holds in one linear-attention layer."""
        if not self.linear_attention_layers:
            return 0
        key_dim = self.linear_num_key_heads * self.linear_key_head_dim
        value_dim = self.linear_num_value_heads * self.linear_value_head_dim
        ssm = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
        conv = max(self.linear_conv_kernel - 1, 0) * (2 * key_dim + value_dim)
        return ssm * self.linear_state_bytes_per_element + conv * 2

    def allowed_tensor_parallel_sizes(self, candidates=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64)) -> list[int]:
        """The candidates vLLM's TP rules (`funnel.rules`: heads and hidden size, KV heads) admit."""
        import numpy as np

        from jaxplan.funnel.rules import KV_HEADS, TP_HEADS
        from jaxplan.physics.shapes import model_shape

        shape, tp = model_shape(self), np.array(candidates, float)
        refused = np.asarray(TP_HEADS.fails(shape, tp, 1.0, np.nan, np.nan)) | np.asarray(KV_HEADS.fails(shape, tp, 1.0, np.nan, np.nan))
        return [t for t, no in zip(candidates, refused) if not no]

    def describe(self) -> str:
        sparse = f", sparse top-{self.sparse_attention_topk}" if self.sparse_attention_topk else ""
        if self.chunked_attention_layers:
            sparse += f", {self.chunked_attention_layers} in {self.attention_chunk_tokens}-token chunks"
        kinds = [f"{self.full_attention_layers} {'MLA' if self.is_mla else 'full-attention'}{sparse}"]
        if self.sliding_window_layers:
            kinds.append(f"{self.sliding_window_layers} sliding-window ({self.sliding_window_tokens} tokens)")
        if self.linear_attention_layers:
            kinds.append(f"{self.linear_attention_layers} linear-attention")
        ffn = f"MoE {self.experts_per_token}/{self.num_experts} experts" if self.is_moe else "dense FFN"
        checkpoint = ""
        if self.checkpoint_weight_format in ("mxfp4", "int4"):
            checkpoint = f", {self.checkpoint_weight_format} experts in the checkpoint"
        elif self.checkpoint_weight_format == "other":
            checkpoint = ", checkpoint in a format jaxplan does not model"
        return (
            f"{self.name}: {self.total_params / 1e9:.1f}B params ({self.active_params / 1e9:.1f}B active), "
            f"{self.num_layers} layers ({', '.join(kinds)}), {ffn}{checkpoint}"
        )

