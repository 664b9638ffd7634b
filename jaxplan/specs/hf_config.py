"""Read a Hugging Face `config.json` into a ModelSpec.

Handles the fields that differ between families: `text_config` nesting
(multimodal wrappers), missing `head_dim` (hidden / heads), tied embeddings,
`layer_types` lists (full / sliding / linear attention), Gemma 3's
`sliding_window_pattern`, Gemma 2's alternation, Qwen2's `use_sliding_window`, a
bare window on every layer (Mistral-7B-v0.1, Phi-3), Qwen3.5's
`full_attention_interval`, MoE field names (`num_experts`, `num_local_experts`,
`n_routed_experts`), shared experts (`n_shared_experts`, `shared_expert_intermediate_size`, Llama 4's
unnamed one), Llama 4's `interleave_moe_layer_step` and `intermediate_size_mlp`, DeepSeek's MLA,
sparse attention (`index_topk`), Llama 4's chunked attention (`attention_chunk_size`,
`no_rope_layers`) and `first_k_dense_replace`, and the checkpoint's native weight
format from `quantization_config` (gpt-oss's MXFP4, Kimi-K2.5's INT4 compressed-tensors, FP8 blocks,
ModelOpt NVFP4), recorded in `checkpoint_weight_format`. Unknown extra fields are ignored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

from jaxplan.errors import PlanError, bad_value
from jaxplan.specs.model import ModelSpec

HF_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
FULL_KINDS = {"full_attention", "attention", "full", "global", "global_attention"}
SLIDING_KINDS = {"sliding_attention", "sliding_window", "local", "local_attention"}
# Llama 4's chunked layers keep every token's KV; their chunk is read from attention_chunk_size.
CHUNKED_KINDS = {"chunked_attention"}
LINEAR_KINDS = {"linear_attention", "gated_deltanet", "linear"}
STATE_SPACE_KINDS = {"mamba", "mamba2", "ssm"}


def _get(cfg: dict, *names: str, default=None):
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def _int_field(cfg: dict, where: str, *names: str, default=None) -> int:
    value = _get(cfg, *names, default=default)
    field = next((name for name in names if cfg.get(name) is not None), names[0])  # the one that was read
    if value is None:
        raise bad_value(field, None, "is missing; add it to the config.json", where=where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
        isinstance(value, float) and (not math.isfinite(value) or value != int(value))
    ):
        raise bad_value(field, value, "must be an integer", where=where)
    return int(value)


def _bool_field(cfg: dict, where: str, name: str, default: bool) -> bool:
    value = _get(cfg, name, default=default)
    if not isinstance(value, bool):
        raise bad_value(name, value, "must be true or false", where=where)
    return value


def _list_field(cfg: dict, where: str, name: str) -> list:
    value = _get(cfg, name, default=[])
    if not isinstance(value, list):
        raise bad_value(name, value, "must be a list", where=where)
    return value


def _layer_kind_counts(cfg: dict, num_layers: int, where: str) -> tuple[int, int, int]:
    """(full, sliding, linear) layer counts."""
    layer_types = _list_field(cfg, where, "layer_types")
    if layer_types:
        if len(layer_types) != num_layers:
            raise bad_value("layer_types", f"{len(layer_types)} entries", f"must list num_hidden_layers = {num_layers} entries", where=where)
        known = FULL_KINDS | SLIDING_KINDS | CHUNKED_KINDS | LINEAR_KINDS
        unknown = next((kind for kind in layer_types if not (isinstance(kind, str) and kind in known)), None)
        if unknown is not None:
            what = "a state-space (Mamba) layer" if isinstance(unknown, str) and unknown in STATE_SPACE_KINDS else "a layer kind"
            raise bad_value(
                "layer_types", f"[..., {unknown!r}, ...]",
                f"{unknown!r} is {what} jaxplan does not model: it prices full, sliding-window and chunked softmax "
                "attention (MLA and sparse included) and Gated DeltaNet linear attention", where=where,
            )
        sliding = sum(1 for kind in layer_types if kind in SLIDING_KINDS)
        linear = sum(1 for kind in layer_types if kind in LINEAR_KINDS)
        return num_layers - sliding - linear, sliding, linear
    interval = _int_field(cfg, where, "full_attention_interval", default=0)
    if _int_field(cfg, where, "linear_num_value_heads", default=0) and interval:
        full = num_layers // interval
        return full, 0, num_layers - full
    window = _int_field(cfg, where, "sliding_window", default=0)
    pattern = _int_field(cfg, where, "sliding_window_pattern", default=0)
    if window and pattern:
        full = num_layers // pattern
        return full, num_layers - full, 0
    if window and cfg.get("model_type") == "gemma2":
        # Gemma 2's config.json names no pattern: its layers alternate, the first one sliding
        # (transformers' Gemma2Config fills layer_types so, and vLLM reads those)
        sliding = (num_layers + 1) // 2
        return num_layers - sliding, sliding, 0
    if window and _has_window_switch(cfg):
        # Qwen2/Qwen3 semantics: the window is off unless use_sliding_window says otherwise, and then
        # only layers from max_window_layers on slide
        if not _bool_field(cfg, where, "use_sliding_window", False):
            return num_layers, 0, 0
        max_window_layers = _int_field(cfg, where, "max_window_layers", default=num_layers)
        sliding = max(num_layers - max_window_layers, 0)
        return num_layers - sliding, sliding, 0
    if window:
        # A bare window (Mistral-7B-v0.1, Phi-3, Starcoder2) slides on every layer: transformers' attention
        # reads it in each layer, and vLLM's Attention falls back to the model-wide window
        # (ModelConfig.get_sliding_window -> CacheConfig.sliding_window) where a layer names none
        return 0, num_layers, 0
    return num_layers, 0, 0


LINEAR_SHAPE_FIELDS = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")


def _has_window_switch(cfg: dict) -> bool:
    """Whether the family gates its window with `use_sliding_window` (transformers' Qwen2/Qwen3 configs
    default it to false even when config.json leaves it out)."""
    model_type = cfg.get("model_type")
    return "use_sliding_window" in cfg or (isinstance(model_type, str) and model_type.startswith(("qwen2", "qwen3")))


def _is_llama4(cfg: dict) -> bool:
    return cfg.get("model_type") in ("llama4", "llama4_text") or "interleave_moe_layer_step" in cfg


# Fields only state-space (Mamba) hybrids carry: Nemotron-H's layer pattern and state size, Jamba's
# attention period, the Mamba state and head counts (Falcon-H1, Granite-4.0-H, Zamba). Qwen3.5's
# `mamba_ssm_dtype` names its Gated DeltaNet state's dtype, which is modelled.
STATE_SPACE_FIELDS = ("hybrid_override_pattern", "attn_layer_period", "ssm_state_size", "mamba_d_state", "mamba_n_heads", "mamba_num_heads")


def _chunked_layers(cfg: dict, num_layers: int, where: str) -> int:
    """Llama 4's layers that attend within chunks: the `chunked_attention` entries of layer_types where
    it names them, else those with RoPE (`no_rope_layers[i]` 1), by default all but every fourth
    (transformers' Llama4TextConfig, no_rope_layer_interval 4)."""
    kinds = _list_field(cfg, where, "layer_types")
    chunked = sum(1 for kind in kinds if isinstance(kind, str) and kind in CHUNKED_KINDS)
    if chunked:
        return chunked
    flags = _list_field(cfg, where, "no_rope_layers")
    if not flags:
        return num_layers - num_layers // 4
    if len(flags) != num_layers or any(f not in (0, 1) for f in flags):
        raise bad_value("no_rope_layers", f"{len(flags)} entries", f"must list num_hidden_layers = {num_layers} flags of 0 or 1", where=where)
    return sum(flags)


# Attention that is neither softmax nor Gated DeltaNet, each named by the field that shows it:
# DeepSeek-V4's compressed attention, MiniMax-Text-01 / M1's lightning attention (0s in
# attn_type_list), Kimi Linear's delta attention.
UNMODELLED_ATTENTION = {
    "compress_ratios": "names compressed attention (DeepSeek-V4's CSA / HCA layers)",
    "attn_type_list": "names lightning (linear) attention layers (its 0 entries)",
    "linear_attn_config": "configures Kimi Delta Attention layers",
}


def _refuse_unmodelled_attention(cfg: dict, where: str) -> None:
    """Refuse a config whose attention jaxplan would misprice as softmax or Gated DeltaNet layers."""
    for field, what in UNMODELLED_ATTENTION.items():
        value = cfg.get(field)
        if value is None or (field == "attn_type_list" and isinstance(value, list) and 0 not in value):
            continue
        raise bad_value(
            field, value,
            f"{what}, which jaxplan does not model yet: it prices softmax attention (full, sliding-window, "
            "chunked, MLA, sparse) and Gated DeltaNet linear attention", where=where,
        )


def _refuse_state_space_layers(cfg: dict, where: str) -> None:
    """A Mamba hybrid read as a transformer would price every layer as attention plus MLP and hold KV
    for layers that keep none: refuse it by name rather than plan it wrong."""
    field = next((k for k in STATE_SPACE_FIELDS if cfg.get(k) is not None), None)
    if field is not None:
        raise bad_value(
            field, cfg[field],
            "names state-space (Mamba) layers, which jaxplan does not model yet: it prices softmax attention "
            "(full, sliding-window, MLA, sparse) and Gated DeltaNet linear attention",
            where=where,
        )


def _refuse_hyper_connections(cfg: dict, where: str) -> None:
    """Manifold-constrained hyper-connections (mHC, `hc_mult` > 1) carry hc_mult residual streams
    through every layer and mix them around attention and the FFN: more activation traffic and
    kernels a step than one residual stream, which jaxplan would not price."""
    value = cfg.get("hc_mult")
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 1):
        raise bad_value(
            "hc_mult", value,
            "names hyper-connections (hc_mult residual streams a layer, mHC), which jaxplan does not model yet: "
            "it prices one residual stream a layer",
            where=where,
        )


def _moe_fields(cfg: dict, num_layers: int, where: str) -> dict:
    experts = _int_field(cfg, where, "n_routed_experts", "num_local_experts", "num_experts", default=0)
    if not experts:
        return {}
    first_dense = _int_field(cfg, where, "first_k_dense_replace", default=0)
    first_dense += len(_list_field(cfg, where, "mlp_only_layers"))
    step = _int_field(cfg, where, "decoder_sparse_step", default=1)
    if step > 1:
        first_dense = num_layers - num_layers // step
    # Llama 4: layer i is MoE where (i + 1) % interleave_moe_layer_step == 0 (Maverick's 2: every
    # second; 0: none), as vLLM's Llama4DecoderLayer builds it; the dense count is what is priced.
    interleave = _int_field(cfg, where, "interleave_moe_layer_step", default=1)
    if interleave != 1:
        first_dense = num_layers - (num_layers // interleave if interleave > 0 else 0)
    moe_width = _int_field(cfg, where, "moe_intermediate_size", "intermediate_size")
    return dict(
        num_experts=experts,
        experts_per_token=_int_field(cfg, where, "num_experts_per_tok", "num_experts_per_token", "moe_topk", default=1),
        moe_intermediate_size=moe_width,
        num_shared_experts=_shared_experts(cfg, where, moe_width),
        first_dense_layers=first_dense,
    )


def _shared_experts(cfg: dict, where: str, moe_width: int) -> int:
    """Shared experts per MoE layer, each as wide as a routed one. DeepSeek-style configs count them
    (`n_shared_experts`); Qwen2-MoE / Qwen3-Next give one shared MLP's width
    (`shared_expert_intermediate_size`, counted here in routed-expert widths, rounded up); every Llama 4
    MoE layer has one shared expert as wide as a routed one, which its config does not name (vLLM's
    Llama4MoE.shared_expert)."""
    named = _int_field(cfg, where, "n_shared_experts", "num_shared_experts", default=-1)
    if named >= 0:
        return named
    width = _int_field(cfg, where, "shared_expert_intermediate_size", default=0)
    if width > 0:
        return -(-width // moe_width)
    return 1 if _is_llama4(cfg) else 0


SIXTEEN_BIT_DTYPES = {"bfloat16", "float16", "bf16", "fp16", "half"}


def _quantized_format(quant: dict) -> str:
    """A `quantization_config` table -> bf16 | fp8 | nvfp4 | mxfp4 | int4 | other."""
    method = str(quant.get("quant_method", "")).lower()
    if method in ("mxfp4", "fp8", "fbgemm_fp8"):
        return "mxfp4" if method == "mxfp4" else "fp8"
    if method == "modelopt":  # ModelOpt names its algorithm: FP8, NVFP4, ...
        algo = str(quant.get("quant_algo", "")).lower()
        return {"fp8": "fp8", "nvfp4": "nvfp4"}.get(algo, "other")
    if method in ("awq", "gptq", "gptq_marlin", "awq_marlin") and quant.get("bits") == 4:
        return "int4"
    if method == "compressed-tensors":
        # the weight scheme of its config groups: num_bits 4 + type int (Kimi-K2.5's INT4 QAT experts),
        # num_bits 8 + type float (FP8), num_bits 4 + type float (NVFP4)
        groups = quant.get("config_groups")
        schemes = {
            (weights.get("num_bits"), weights.get("type"))
            for group in (groups.values() if isinstance(groups, dict) else [])
            if isinstance(group, dict) and isinstance(weights := group.get("weights"), dict)
        }
        known = {(4, "int"): "int4", (8, "float"): "fp8", (4, "float"): "nvfp4"}
        formats = {known.get(scheme, "other") for scheme in schemes}
        return formats.pop() if len(formats) == 1 else "other"
    return "other"


def _checkpoint_weight_format(raw: dict, cfg: dict) -> str:
    """The native weight format of the checkpoint this config.json ships with ("" when it does not say).

    `quantization_config` may sit at the top or in `text_config` (Kimi-K2.5); without one, a 16-bit
    `torch_dtype` / `dtype` means bf16 weights."""
    quant = _get(cfg, "quantization_config", default=raw.get("quantization_config"))
    if isinstance(quant, dict):
        return _quantized_format(quant)
    dtype = _get(cfg, "torch_dtype", "dtype", default=_get(raw, "torch_dtype", "dtype"))
    return "bf16" if isinstance(dtype, str) and dtype.lower() in SIXTEEN_BIT_DTYPES else ""


def model_from_hf_dict(raw: dict, name: str, *, hf_id: str = "", source: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed config.json (text_config is used when present)."""
    where = f"config {source or name}"
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: expected a JSON object at the top level")
    cfg = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    _refuse_state_space_layers(cfg, where)
    _refuse_unmodelled_attention(cfg, where)
    _refuse_hyper_connections(cfg, where)
    num_layers = _int_field(cfg, where, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int_field(cfg, where, "hidden_size", "n_embd", "d_model")
    heads = _int_field(cfg, where, "num_attention_heads", "n_head")
    kv_heads = _int_field(cfg, where, "num_key_value_heads", default=heads)
    if heads <= 0:
        raise bad_value("num_attention_heads", heads, "must be > 0", where=where)
    if _get(cfg, "head_dim") is None and hidden % heads:
        raise bad_value("head_dim", None, f"is missing and hidden_size = {hidden} is not a multiple of num_attention_heads = {heads}; add head_dim", where=where)
    head_dim = _int_field(cfg, where, "head_dim", default=hidden // heads)
    full, sliding, linear = _layer_kind_counts(cfg, num_layers, where)
    window = _int_field(cfg, where, "sliding_window", default=0) if sliding else 0
    fields = dict(
        name=name,
        hf_id=hf_id,
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=_int_field(cfg, where, "vocab_size", default=raw.get("vocab_size")),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        # Llama 4 names its dense layers' width `intermediate_size_mlp` and its experts' `intermediate_size`
        intermediate_size=_int_field(cfg, where, *(("intermediate_size_mlp",) if _is_llama4(cfg) else ()), "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden),
        max_position_embeddings=_int_field(cfg, where, "max_position_embeddings", "n_positions", "seq_length", default=131072),
        tie_word_embeddings=_bool_field(cfg, where, "tie_word_embeddings", _get(raw, "tie_word_embeddings", default=False)),
        attn_output_gate=_bool_field(cfg, where, "attn_output_gate", False),
        qk_norm_across_heads=_bool_field(cfg, where, "use_qk_norm", False) and _get(cfg, "qk_norm_type") == "per_layer",
        full_attention_layers=full,
        sliding_window_layers=sliding,
        sliding_window_tokens=window,
        linear_attention_layers=linear,
        source=source,
    )
    if sliding and not window:
        raise bad_value("sliding_window", _get(cfg, "sliding_window"), f"must give the window in tokens: the config names {sliding} sliding-window layers", where=where)
    if linear:
        # the config's names are the spec's: linear_num_key_heads, ..., linear_value_head_dim
        shape = {k: _int_field(cfg, where, k, default=0) for k in LINEAR_SHAPE_FIELDS}
        missing = next((k for k, v in shape.items() if not v), None)
        if missing is not None:
            raise bad_value(missing, _get(cfg, missing), f"must be > 0: the config names {linear} linear-attention layers, priced as Gated DeltaNet from "
                            + ", ".join(LINEAR_SHAPE_FIELDS), where=where)
        fields.update(shape, linear_conv_kernel=_int_field(cfg, where, "linear_conv_kernel_dim", default=4))
    if _int_field(cfg, where, "kv_lora_rank", default=0):
        fields.update(
            kv_lora_rank=_int_field(cfg, where, "kv_lora_rank"),
            q_lora_rank=_int_field(cfg, where, "q_lora_rank", default=0),
            qk_nope_head_dim=_int_field(cfg, where, "qk_nope_head_dim", default=0),
            qk_rope_head_dim=_int_field(cfg, where, "qk_rope_head_dim", default=0),
            v_head_dim=_int_field(cfg, where, "v_head_dim", default=0),
        )
    chunk = _int_field(cfg, where, "attention_chunk_size", default=0)
    if chunk and full:
        fields.update(chunked_attention_layers=_chunked_layers(cfg, num_layers, where), attention_chunk_tokens=chunk)
    if _int_field(cfg, where, "index_topk", default=0):  # DeepSeek sparse attention (DeepSeek-V3.2, GLM-5)
        fields.update(
            sparse_attention_topk=_int_field(cfg, where, "index_topk"),
            indexer_heads=_int_field(cfg, where, "index_n_heads"),
            indexer_head_dim=_int_field(cfg, where, "index_head_dim"),
        )
    fields.update(_moe_fields(cfg, num_layers, where))
    fields["checkpoint_weight_format"] = _checkpoint_weight_format(raw, cfg)
    return ModelSpec(**fields)


def model_from_hf_file(path: Path) -> ModelSpec:
    """Load a Hugging Face config.json; the model is named after its folder (or file stem)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except UnicodeDecodeError as err:
        raise PlanError(f"{path}: not UTF-8 text (byte {err.start}); save the config.json as UTF-8") from None
    except (ValueError, RecursionError) as err:  # an integer over 4300 digits, nesting past the recursion limit
        raise PlanError(f"{path}: unreadable JSON ({type(err).__name__}: {err})") from None
    except OSError as err:
        raise PlanError(f"{path}: cannot read ({err.strerror})") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    named = str(raw.get("_name_or_path", "")) if isinstance(raw, dict) else ""
    # `_name_or_path` is often the publisher's local folder ("/fsx/ckpt/..."): only an "org/name" is an id.
    hf_id = named if HF_ID.fullmatch(named) else ""
    return dataclasses.replace(model_from_hf_dict(raw, name, hf_id=hf_id, source=str(path)), named_checkpoint=True)
