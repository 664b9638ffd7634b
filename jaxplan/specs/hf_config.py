"""Read a Hugging Face `config.json` into a ModelSpec.

Handles the fields that differ between families: `text_config` nesting
(multimodal wrappers), missing `head_dim` (hidden / heads), tied embeddings,
`layer_types` lists (full / sliding / linear attention), Gemma's
`sliding_window_pattern`, Qwen3.5's `full_attention_interval`, MoE field names
(`num_experts`, `num_local_experts`, `n_routed_experts`), DeepSeek's MLA and
`first_k_dense_replace`. Unknown extra fields are ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxplan.errors import PlanError, bad_value
from jaxplan.specs.model import ModelSpec

SLIDING_KINDS = {"sliding_attention", "sliding_window", "local", "local_attention", "chunked_attention"}
LINEAR_KINDS = {"linear_attention", "mamba", "gated_deltanet", "linear"}


def _get(cfg: dict, *names: str, default=None):
    for name in names:
        if cfg.get(name) is not None:
            return cfg[name]
    return default


def _int_field(cfg: dict, where: str, *names: str, default=None) -> int:
    value = _get(cfg, *names, default=default)
    if value is None:
        raise bad_value(names[0], None, "is missing; add it to the config.json", where=where)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise bad_value(names[0], value, "must be an integer", where=where)
    return int(value)


def _layer_kind_counts(cfg: dict, num_layers: int, where: str) -> tuple[int, int, int]:
    """(full, sliding, linear) layer counts."""
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        if len(layer_types) != num_layers:
            raise bad_value("layer_types", f"{len(layer_types)} entries", f"must list num_hidden_layers = {num_layers} entries", where=where)
        sliding = sum(1 for kind in layer_types if str(kind) in SLIDING_KINDS)
        linear = sum(1 for kind in layer_types if str(kind) in LINEAR_KINDS)
        return num_layers - sliding - linear, sliding, linear
    interval = cfg.get("full_attention_interval")
    if cfg.get("linear_num_value_heads") and interval:
        full = num_layers // int(interval)
        return full, 0, num_layers - full
    window = cfg.get("sliding_window")
    pattern = cfg.get("sliding_window_pattern")
    if window and pattern:
        full = num_layers // int(pattern)
        return full, num_layers - full, 0
    if window and cfg.get("use_sliding_window"):
        max_window_layers = int(cfg.get("max_window_layers", num_layers))
        sliding = max(num_layers - max_window_layers, 0)
        return num_layers - sliding, sliding, 0
    return num_layers, 0, 0


def _moe_fields(cfg: dict, num_layers: int) -> dict:
    experts = int(_get(cfg, "n_routed_experts", "num_local_experts", "num_experts", default=0) or 0)
    if not experts:
        return {}
    first_dense = int(_get(cfg, "first_k_dense_replace", default=0) or 0)
    first_dense += len(cfg.get("mlp_only_layers") or [])
    step = int(cfg.get("decoder_sparse_step", 1) or 1)
    if step > 1:
        first_dense = num_layers - num_layers // step
    moe_inter = _get(cfg, "moe_intermediate_size", default=None) or cfg.get("intermediate_size")
    return dict(
        num_experts=experts,
        experts_per_token=int(_get(cfg, "num_experts_per_tok", "num_experts_per_token", "moe_topk", default=1)),
        moe_intermediate_size=int(moe_inter),
        num_shared_experts=int(_get(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0),
        first_dense_layers=first_dense,
    )


def model_from_hf_dict(raw: dict, name: str, *, hf_id: str = "", source: str = "") -> ModelSpec:
    """Build a ModelSpec from a parsed config.json (text_config is used when present)."""
    where = f"config {source or name}"
    if not isinstance(raw, dict):
        raise PlanError(f"{where}: expected a JSON object at the top level")
    cfg = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    num_layers = _int_field(cfg, where, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int_field(cfg, where, "hidden_size", "n_embd", "d_model")
    heads = _int_field(cfg, where, "num_attention_heads", "n_head")
    kv_heads = _int_field(cfg, where, "num_key_value_heads", default=heads)
    if heads <= 0:
        raise bad_value("num_attention_heads", heads, "must be > 0", where=where)
    head_dim = _get(cfg, "head_dim", default=None) or hidden // heads
    full, sliding, linear = _layer_kind_counts(cfg, num_layers, where)
    fields = dict(
        name=name,
        hf_id=hf_id,
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=_int_field(cfg, where, "vocab_size", default=raw.get("vocab_size")),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=int(head_dim),
        intermediate_size=_int_field(cfg, where, "intermediate_size", "ffn_dim", "n_inner", default=4 * hidden),
        max_position_embeddings=_int_field(cfg, where, "max_position_embeddings", "n_positions", "seq_length", default=131072),
        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=raw.get("tie_word_embeddings", False))),
        attn_output_gate=bool(cfg.get("attn_output_gate", False)),
        full_attention_layers=full,
        sliding_window_layers=sliding,
        sliding_window_tokens=int(cfg.get("sliding_window") or 0) if sliding else 0,
        linear_attention_layers=linear,
        source=source,
    )
    if linear:
        fields.update(
            linear_num_key_heads=int(cfg.get("linear_num_key_heads", 0)),
            linear_num_value_heads=int(cfg.get("linear_num_value_heads", 0)),
            linear_key_head_dim=int(cfg.get("linear_key_head_dim", 0)),
            linear_value_head_dim=int(cfg.get("linear_value_head_dim", 0)),
            linear_conv_kernel=int(cfg.get("linear_conv_kernel_dim", 4)),
        )
    if cfg.get("kv_lora_rank"):
        fields.update(
            kv_lora_rank=int(cfg["kv_lora_rank"]),
            q_lora_rank=int(cfg.get("q_lora_rank") or 0),
            qk_nope_head_dim=int(cfg.get("qk_nope_head_dim", 0)),
            qk_rope_head_dim=int(cfg.get("qk_rope_head_dim", 0)),
            v_head_dim=int(cfg.get("v_head_dim", 0)),
        )
    fields.update(_moe_fields(cfg, num_layers))
    return ModelSpec(**fields)


def model_from_hf_file(path: Path) -> ModelSpec:
    """Load a Hugging Face config.json; the model is named after its folder (or file stem)."""
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise PlanError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except OSError as err:
        raise PlanError(f"{path}: cannot read ({err.strerror})") from None
    name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_from_hf_dict(raw, name, hf_id=str(raw.get("_name_or_path", "")) if isinstance(raw, dict) else "", source=str(path))
