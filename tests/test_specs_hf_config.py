"""Hugging Face config.json -> ModelSpec: real configs against the bundled TOMLs, and the oddities.

The real configs and the per-model fact table live in ../shared/data/specs/ (outside the
repository); those tests skip when it is absent. The oddities use small synthetic dicts.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from jaxplan.calibrate._data import default_data_root
from jaxplan.errors import PlanError
from jaxplan.physics.memory import request_kv_bytes_per_gpu
from jaxplan.physics.shapes import make_layout, model_shape
from jaxplan.specs import ModelSpec, load_model
from jaxplan.specs.hf_config import model_from_hf_dict, model_from_hf_file

SPECS_DATA = default_data_root() / "specs"  # $JAXPLAN_SHARED_DATA/specs, else <repo>/../shared/data/specs
RAW_CONFIGS = sorted((SPECS_DATA / "raw_model_configs").glob("*.json"))
needs_shared = pytest.mark.skipif(not SPECS_DATA.is_dir(), reason="../shared/data/specs is not present")

# name/aliases/source describe where a spec came from; hf_id comes from `_name_or_path`,
# which published config.json files do not carry.
PROVENANCE = {"name", "aliases", "source", "hf_id", "named_checkpoint"}


def _architecture(spec: ModelSpec) -> dict:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name not in PROVENANCE}


def _hf_id_of(config_path: Path) -> str:
    """'meta-llama--Meta-Llama-3.1-8B_config.json' -> 'meta-llama/Meta-Llama-3.1-8B'."""
    return config_path.name.removesuffix("_config.json").replace("--", "/")


# ---- the real configs ----------------------------------------------------------------------


@needs_shared
def test_raw_configs_are_present():
    assert len(RAW_CONFIGS) >= 7


def _is_bundled(hf_id: str) -> bool:
    try:
        load_model(hf_id)
    except PlanError:
        return False
    return True


BUNDLED_RAW_CONFIGS = [path for path in RAW_CONFIGS if _is_bundled(_hf_id_of(path))]


@needs_shared
def test_the_bundled_models_have_their_raw_configs():
    assert len(BUNDLED_RAW_CONFIGS) >= 13  # every bundled model but gemma-3-27b


@needs_shared
@pytest.mark.parametrize("path", BUNDLED_RAW_CONFIGS, ids=lambda p: p.name)
def test_raw_config_parses_to_the_bundled_spec(path):
    parsed = model_from_hf_file(path)
    bundled = load_model(_hf_id_of(path))  # resolved through the HF id / alias table
    assert _architecture(parsed) == _architecture(bundled)


@needs_shared
@pytest.mark.parametrize("path", RAW_CONFIGS, ids=lambda p: p.name)
def test_every_raw_config_parses(path):
    """The configs of models jaxplan does not bundle (GLM-5, Llama-4-Scout, FP8 checkpoints, ...) load too."""
    spec = model_from_hf_file(path)
    assert spec.total_params > spec.active_params > 0 if spec.is_moe else spec.total_params == spec.active_params > 0
    assert spec.checkpoint_weight_format in ("bf16", "fp8", "mxfp4", "int4")


@needs_shared
@pytest.mark.parametrize("path", RAW_CONFIGS, ids=lambda p: p.name)
def test_raw_config_loads_from_a_directory(path, tmp_path):
    folder = tmp_path / "some-model"
    folder.mkdir()
    (folder / "config.json").write_text(path.read_text())
    spec = load_model(str(folder))
    assert spec.name == "some-model" and _architecture(spec) == _architecture(model_from_hf_file(path))


def _csv_int(text: str) -> int | None:
    """Leading integer of a models.csv cell ('128 (MLA; latent cache)' -> 128); None for blanks/prose."""
    head = text.strip().split(" ")[0] if text.strip() else ""
    return int(head) if head.isdigit() else None


MODEL_ROWS = list(csv.DictReader((SPECS_DATA / "models.csv").read_text().splitlines())) if SPECS_DATA.is_dir() else []


@needs_shared
@pytest.mark.parametrize("row", MODEL_ROWS, ids=lambda r: r["model"])
def test_bundled_spec_matches_models_csv(row):
    spec = load_model(row["hf_id"].split(" ")[0])  # 'google/gemma-3-27b-it (text_config)' -> the HF id
    columns = {
        "layers": spec.num_layers,
        "hidden": spec.hidden_size,
        "heads": spec.num_attention_heads,
        "kv_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "intermediate": spec.intermediate_size,
        "moe_intermediate": spec.moe_intermediate_size,
        "vocab": spec.vocab_size,
        "experts": spec.num_experts,
        "experts_per_tok": spec.experts_per_token,
        "shared_experts": spec.num_shared_experts,
        "first_dense_layers": spec.first_dense_layers,
        "attn_layers_with_kv": spec.full_attention_layers + spec.sliding_window_layers,
        "sliding_window": spec.sliding_window_tokens,
        "max_position_embeddings": spec.max_position_embeddings,
        "kv_bytes_per_token_bf16": spec.kv_bytes_per_token(2),
    }
    checked = 0
    for column, actual in columns.items():
        expected = _csv_int(row[column])
        if expected is None:
            continue
        if column == "head_dim" and spec.is_mla:  # the MLA row gives qk/v dims in prose
            continue
        assert actual == expected, f"{row['model']}: {column}"
        checked += 1
    assert checked >= 9
    if row["tie_word_embeddings"] in ("True", "False"):
        assert spec.tie_word_embeddings == (row["tie_word_embeddings"] == "True")


# ---- synthetic oddities -------------------------------------------------------------------

LLAMA_LIKE = {
    "num_hidden_layers": 4,
    "hidden_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
    "vocab_size": 1000,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
}


def _parse(**changes) -> ModelSpec:
    cfg = {**LLAMA_LIKE, **changes}
    return model_from_hf_dict({k: v for k, v in cfg.items() if v is not ...}, "synthetic")


def test_llama_like_config():
    m = _parse()
    # head_dim absent -> hidden / heads = 512 / 8 = 64
    assert (m.num_layers, m.hidden_size, m.head_dim, m.num_kv_heads, m.full_attention_layers) == (4, 512, 64, 2, 4)
    assert not m.is_moe and not m.is_mla and not m.tie_word_embeddings


@pytest.mark.parametrize(
    "changes, across",
    [
        (dict(use_qk_norm=True, qk_norm_type="per_layer"), True),  # MiniMax-M2: one norm over all q (k) heads
        (dict(use_qk_norm=True), False),  # Llama 4: a norm per head, nothing to all-reduce
        (dict(use_qk_norm=False, qk_norm_type="per_layer"), False),
        (dict(), False),
    ],
)
def test_a_qk_norm_over_all_heads_is_read_from_the_config(changes, across):
    assert _parse(**changes).qk_norm_across_heads is across


def test_explicit_head_dim_wins_over_hidden_over_heads():
    # Qwen3-32B style: 64 heads x 128 = 8192 != hidden 5120
    assert _parse(head_dim=128).head_dim == 128
    assert _parse(head_dim=None).head_dim == 64  # null -> derived


def test_head_dim_missing_and_hidden_not_divisible_is_an_error():
    with pytest.raises(PlanError, match="head_dim"):
        _parse(hidden_size=500)  # 500 / 8 heads is not whole; used to be floored to 62 silently


def test_tied_embeddings_drop_the_lm_head():
    untied, tied = _parse(), _parse(tie_word_embeddings=True)
    assert untied.total_params - tied.total_params == 1000 * 512  # vocab x hidden


def test_tie_word_embeddings_from_the_top_level_of_a_wrapper():
    m = model_from_hf_dict({"tie_word_embeddings": True, "text_config": dict(LLAMA_LIKE, tie_word_embeddings=None)}, "w")
    assert m.tie_word_embeddings


def test_text_config_nesting_and_top_level_vocab():
    inner = {k: v for k, v in LLAMA_LIKE.items() if k != "vocab_size"}
    raw = {"architectures": ["X"], "vocab_size": 1000, "text_config": inner, "vision_config": {"hidden_size": 3}}
    assert _architecture(model_from_hf_dict(raw, "m")) == _architecture(_parse())


@pytest.mark.parametrize("rope", [None, {"type": "yarn", "factor": 40, "beta_fast": 32}, {"rope_type": "default"}, "linear", []])
def test_rope_scaling_is_ignored(rope):
    assert _parse(rope_scaling=rope).max_position_embeddings == 8192


def test_missing_kv_heads_means_multi_head_attention():
    m = _parse(num_key_value_heads=...)
    assert m.num_kv_heads == m.num_attention_heads == 8
    assert _parse(num_key_value_heads=None).num_kv_heads == 8


def test_null_values_fall_back_to_defaults():
    m = _parse(sliding_window=None, q_lora_rank=None, num_experts=None, layer_types=None, mlp_only_layers=None, head_dim=None)
    assert _architecture(m) == _architecture(_parse())


def test_layer_types_list():
    kinds = ["sliding_attention", "full_attention", "linear_attention", "full_attention"]
    m = _parse(layer_types=kinds, sliding_window=256, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4)
    assert (m.full_attention_layers, m.sliding_window_layers, m.linear_attention_layers, m.sliding_window_tokens) == (2, 1, 1, 256)
    assert m.linear_conv_kernel == 4


def test_layer_types_length_must_match():
    with pytest.raises(PlanError, match="layer_types"):
        _parse(layer_types=["full_attention"] * 3)


def test_gemma3_sliding_window_pattern():
    # Gemma-3-27B text_config (shared/data/specs/models.csv): every 6th layer is global -> 62 // 6 = 10 global, 52 local
    gemma_text = {
        "num_hidden_layers": 62, "hidden_size": 5376, "num_attention_heads": 32, "num_key_value_heads": 16,
        "head_dim": 128, "intermediate_size": 21504, "vocab_size": 262208, "max_position_embeddings": 131072,
        "sliding_window": 1024, "sliding_window_pattern": 6, "query_pre_attn_scalar": 168,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    }
    parsed = model_from_hf_dict({"tie_word_embeddings": True, "text_config": gemma_text}, "gemma")
    assert _architecture(parsed) == _architecture(load_model("google/gemma-3-27b-it"))
    # the newer layer_types form of the same config gives the same spec
    layer_types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(62)]
    newer = dict(gemma_text, sliding_window_pattern=None, layer_types=layer_types)
    assert _architecture(model_from_hf_dict({"tie_word_embeddings": True, "text_config": newer}, "g")) == _architecture(parsed)


def test_gemma2_alternates_sliding_and_full_layers():
    """Gemma-2-27B's config.json (public values) names a window but no pattern: transformers' Gemma2Config
    makes layer i sliding when i is even, so 23 of its 46 layers keep only the last 4,096 tokens. The
    same config written with the newer layer_types gives the same spec."""
    gemma2 = {
        "model_type": "gemma2", "num_hidden_layers": 46, "hidden_size": 4608, "num_attention_heads": 32,
        "num_key_value_heads": 16, "head_dim": 128, "intermediate_size": 36864, "vocab_size": 256000,
        "max_position_embeddings": 8192, "sliding_window": 4096, "query_pre_attn_scalar": 144, "tie_word_embeddings": True,
    }
    m = model_from_hf_dict(gemma2, "gemma-2-27b")
    assert (m.full_attention_layers, m.sliding_window_layers, m.sliding_window_tokens) == (23, 23, 4096)
    layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(46)]
    assert _architecture(model_from_hf_dict(dict(gemma2, layer_types=layer_types), "g")) == _architecture(m)
    assert model_from_hf_dict(dict(gemma2, num_hidden_layers=3), "odd").sliding_window_layers == 2


def test_a_bare_window_slides_on_every_layer():
    """Mistral-7B-v0.1's config.json (public values) names a 4,096-token window and nothing else about it:
    transformers applies it in every layer, and vLLM's Attention takes the model-wide window where the
    layer names none. So a 32,768-token request keeps 4,096 tokens per layer: 512 MiB, not 4 GiB, in BF16.
    Qwen2 and Qwen3 gate the window with use_sliding_window, false by default even when left out."""
    mistral = {
        "model_type": "mistral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768,
        "sliding_window": 4096, "tie_word_embeddings": False,
    }
    m = model_from_hf_dict(mistral, "mistral-7b-v0.1")
    assert (m.full_attention_layers, m.sliding_window_layers, m.sliding_window_tokens) == (0, 32, 4096)
    bytes_per_token = 2 * 8 * 128 * 2 * 32  # K and V, 8 KV heads of 128, BF16, 32 layers: 131,072
    shape, layout = model_shape(m), make_layout(weight_bytes=2, kv_bytes=2)
    assert float(request_kv_bytes_per_gpu(shape, layout, 32768.0)) == bytes_per_token * 4096 == 512 * 2**20
    assert float(request_kv_bytes_per_gpu(shape, layout, 1000.0)) == bytes_per_token * 1008  # whole 16-token blocks
    assert model_from_hf_dict(dict(mistral, sliding_window=None), "v0.2").sliding_window_layers == 0
    assert model_from_hf_dict(dict(mistral, model_type="qwen2"), "q").sliding_window_layers == 0
    assert model_from_hf_dict(dict(mistral, model_type="qwen3", use_sliding_window=True, max_window_layers=28), "q").sliding_window_layers == 4


def test_qwen2_style_use_sliding_window():
    # Qwen2 semantics: the first max_window_layers layers use full attention, the rest the window
    m = _parse(sliding_window=4096, use_sliding_window=True, max_window_layers=3)
    assert (m.full_attention_layers, m.sliding_window_layers, m.sliding_window_tokens) == (3, 1, 4096)
    assert _parse(sliding_window=4096, use_sliding_window=False).sliding_window_layers == 0


def test_full_attention_interval_without_layer_types():
    # Qwen3-Next / Qwen3.5 style: every 4th layer is full attention
    m = _parse(num_hidden_layers=8, full_attention_interval=4, linear_num_key_heads=2, linear_num_value_heads=4,
               linear_key_head_dim=16, linear_value_head_dim=16)
    assert (m.full_attention_layers, m.linear_attention_layers, m.linear_conv_kernel) == (2, 6, 4)


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts", "n_routed_experts"])
def test_moe_expert_count_names_agree(key):
    m = _parse(**{key: 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256})
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size, m.moe_layers) == (8, 2, 256, 4)


def test_mixtral_style_moe_uses_intermediate_size_per_expert():
    m = _parse(num_local_experts=8, num_experts_per_tok=2)
    assert m.moe_intermediate_size == 1024  # no moe_intermediate_size: each expert is intermediate_size wide


def test_moe_dense_layers():
    assert _parse(n_routed_experts=8, moe_intermediate_size=64, first_k_dense_replace=1).dense_mlp_layers == 1
    assert _parse(num_experts=8, moe_intermediate_size=64, mlp_only_layers=[0, 2]).dense_mlp_layers == 2
    # Qwen2-MoE decoder_sparse_step 2: every second layer is MoE -> 4 - 4 // 2 = 2 dense
    assert _parse(num_experts=8, moe_intermediate_size=64, decoder_sparse_step=2).dense_mlp_layers == 2
    with pytest.raises(PlanError, match="first_dense_layers"):
        _parse(n_routed_experts=8, moe_intermediate_size=64, first_k_dense_replace=9)


@pytest.mark.parametrize(
    "changes, moe_layers, shared, dense_width",
    [
        # Scout: every layer MoE, one shared expert as wide as a routed one (the config does not name it)
        (dict(model_type="llama4_text", interleave_moe_layer_step=1, intermediate_size_mlp=4096), 4, 1, 4096),
        # Maverick: layers 1 and 3 (i + 1 divisible by 2) MoE, the others dense at intermediate_size_mlp
        (dict(model_type="llama4_text", interleave_moe_layer_step=2, intermediate_size_mlp=4096), 2, 1, 4096),
        (dict(model_type="llama4_text", interleave_moe_layer_step=0, intermediate_size_mlp=4096), 0, 1, 4096),
        # Qwen2-MoE: one shared MLP 4 routed experts wide; Qwen3-Coder writes 0
        (dict(model_type="qwen2_moe", shared_expert_intermediate_size=4096), 4, 4, 1024),
        (dict(model_type="qwen3_moe", shared_expert_intermediate_size=0), 4, 0, 1024),
        (dict(n_shared_experts=2, shared_expert_intermediate_size=4096), 4, 2, 1024),  # a count wins
    ],
)
def test_shared_experts_and_interleaved_moe_layers(changes, moe_layers, shared, dense_width):
    m = _parse(num_local_experts=8, num_experts_per_tok=1, **changes)
    assert (m.moe_intermediate_size, m.moe_layers, m.num_shared_experts, m.intermediate_size) == (1024, moe_layers, shared, dense_width)
    h = 512
    attention = 4 * (h * 8 * 64 + 2 * h * 2 * 64 + 8 * 64 * h)
    layers = moe_layers * ((1 + shared) * 3 * h * 1024 + h * 8) + (4 - moe_layers) * 3 * h * dense_width
    assert m.active_params == attention + layers + 2 * 1000 * h  # by hand; untied embeddings and head


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(hybrid_override_pattern="M-M*-"), "hybrid_override_pattern"),  # Nemotron-H
        (dict(attn_layer_period=8, attn_layer_offset=4), "attn_layer_period"),  # Jamba
        (dict(layer_types=["mamba", "mamba", "attention", "mamba"], mamba_n_heads=64, mamba_d_state=128), "mamba_d_state"),  # Granite-4.0-H
        (dict(ssm_state_size=128), "ssm_state_size"),
    ],
)
def test_state_space_hybrids_are_refused_by_the_field_that_names_them(changes, field):
    """Read as a transformer, a Mamba hybrid would be priced as attention and MLP on every layer,
    with KV for layers that hold none."""
    with pytest.raises(PlanError, match=rf"{field} = .*state-space \(Mamba\) layers"):
        _parse(**changes)


@pytest.mark.parametrize(
    "changes, message",
    [
        # DeepSeek-V4 (its config: compressed attention on every layer but the first, hyper-connections)
        (dict(compress_ratios=[0, 4, 128, 4], hc_mult=4, index_topk=512, index_n_heads=64, index_head_dim=128), r"compress_ratios = \[0, 4, 128, 4\]: names compressed attention"),
        # MiniMax-Text-01 / M1: 0 marks a lightning-attention layer
        (dict(attn_type_list=[0, 0, 0, 1]), r"attn_type_list = \[0, 0, 0, 1\]: names lightning \(linear\) attention"),
        # Kimi Linear: delta-attention layers configured apart from the Gated DeltaNet fields
        (dict(layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
              linear_attn_config={"kda_layers": [1, 2, 3], "full_attn_layers": [4], "num_heads": 32, "head_dim": 128}), r"linear_attn_config = \{'kda_layers': .*: configures Kimi Delta Attention"),
        (dict(layer_types=["full_attention", "deepseek_sparse_attention", "full_attention", "full_attention"]), r"layer_types = .*'deepseek_sparse_attention' is a layer kind jaxplan does not model"),
        (dict(layer_types=["mamba", "attention", "mamba", "attention"]), r"'mamba' is a state-space \(Mamba\) layer"),
        (dict(layer_types=[{"kind": "full"}] * 4), r"layer_types = .*is a layer kind jaxplan does not model"),
        # a linear layer without the Gated DeltaNet shape, or a sliding layer without its window, is priced as nothing
        (dict(layer_types=["linear_attention", "full_attention"] * 2), r"linear_num_key_heads = None: must be > 0: the config names 2 linear-attention layers"),
        (dict(layer_types=["sliding_attention", "full_attention"] * 2), r"sliding_window = None: must give the window in tokens: the config names 2 sliding-window layers"),
    ],
)
def test_attention_jaxplan_does_not_model_is_refused_by_the_field_that_names_it(changes, message):
    """Read as softmax or Gated DeltaNet layers, these would be priced silently wrong (compressed or
    lightning attention as full attention, a linear or sliding layer without its shape as free)."""
    with pytest.raises(PlanError, match=message):
        _parse(**changes)
    assert _parse(attn_type_list=[1, 1, 1, 1]).full_attention_layers == 4  # all softmax: nothing unmodelled


@pytest.mark.parametrize("hc_mult", [4, 2, "4"])
def test_hyper_connections_are_refused(hc_mult):
    """mHC keeps hc_mult residual streams a layer (DeepSeek's mHC configs: 4); priced as one stream it
    would be planned silently wrong, on its own as beside compressed attention."""
    with pytest.raises(PlanError, match=r"hc_mult = .*: names hyper-connections"):
        _parse(hc_mult=hc_mult)
    assert _parse(hc_mult=1) == _parse()  # one stream: an ordinary residual


def test_llama_4_chunked_attention_layers_from_layer_types():
    """transformers' newer Llama4TextConfig writes layer_types ("chunked_attention" for the layers with
    RoPE): those layers are chunked full-attention layers, not sliding ones."""
    kinds = ["chunked_attention", "chunked_attention", "chunked_attention", "full_attention"]
    m = _parse(layer_types=kinds, attention_chunk_size=8192)
    assert (m.full_attention_layers, m.sliding_window_layers, m.chunked_attention_layers, m.attention_chunk_tokens) == (4, 0, 3, 8192)


def test_llama_4_chunked_attention_layers():
    """The layers with RoPE attend within `attention_chunk_size` chunks: no_rope_layers' 1s, by default
    all but every fourth (transformers' Llama4TextConfig); every layer still counts as full attention."""
    m = _parse(model_type="llama4_text", attention_chunk_size=8192)
    assert (m.full_attention_layers, m.chunked_attention_layers, m.attention_chunk_tokens) == (4, 3, 8192)
    assert _parse(model_type="llama4_text", attention_chunk_size=64, no_rope_layers=[1, 0, 0, 1]).chunked_attention_layers == 2
    assert _parse(model_type="llama4_text").chunked_attention_layers == 0
    with pytest.raises(PlanError, match="no_rope_layers"):
        _parse(attention_chunk_size=64, no_rope_layers=[1, 0])
    with pytest.raises(PlanError, match="chunked_attention_layers"):
        dataclasses.replace(m, chunked_attention_layers=5)


def test_sparse_attention_fields_are_read():
    m = _parse(kv_lora_rank=64, q_lora_rank=96, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, index_topk=2048, index_n_heads=4, index_head_dim=128)
    assert (m.sparse_attention_topk, m.indexer_heads, m.indexer_head_dim) == (2048, 4, 128)
    # the indexer: 96 -> 4 x 128 queries, 512 -> 128 key and 512 -> 4 head weights, per layer
    assert m.indexer_params_per_layer() == 96 * 512 + 512 * 132
    # layers x (latent + rope in FP8, the fp8_ds_mla record's scale per 128 and the rope's second bytes, the indexer's 128 + 4 B)
    assert m.kv_bytes_per_token(1) == 4 * (80 + 4 + 16 + 132)
    assert _parse().sparse_attention_topk == 0 and _parse().indexer_params_per_layer() == 0
    with pytest.raises(PlanError, match="index_n_heads = None: is missing"):
        _parse(index_topk=2048)
    with pytest.raises(PlanError, match="indexer_heads"):
        dataclasses.replace(m, indexer_heads=0)


@needs_shared
def test_glm_5_counts_the_publishers_parameters():
    """Z.ai: 744B parameters, 40B active (the multi-token-prediction layer not counted)."""
    spec = model_from_hf_file(SPECS_DATA / "raw_model_configs" / "zai-org--GLM-5_config.json")
    assert spec.sparse_attention_topk == 2048
    assert spec.total_params == pytest.approx(744e9, rel=0.01)
    assert spec.active_params == pytest.approx(40e9, rel=0.05)


@needs_shared
def test_llama_4_scout_counts_the_publishers_parameters():
    """Meta's model card: 17B active and 109B total parameters (the vision tower, ~1B, included).
    Without the shared expert the config reads as 11.1B active and 101.7B."""
    spec = model_from_hf_file(SPECS_DATA / "raw_model_configs" / "meta-llama--Llama-4-Scout-17B-16E-Instruct_config.json")
    assert spec.active_params == pytest.approx(17e9, rel=0.02)
    assert spec.total_params == pytest.approx(109e9, rel=0.02)


def test_deepseek_style_mla():
    m = _parse(kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
    assert m.is_mla and m.q_lora_rank == 0
    assert m.kv_bytes_per_token(2) == 4 * (64 + 16) * 2  # layers x (latent + rope key) x 2 bytes


@pytest.mark.parametrize(
    "field",
    [
        "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
        "intermediate_size", "max_position_embeddings", "num_local_experts", "num_experts", "n_routed_experts",
        "sliding_window", "kv_lora_rank", "full_attention_interval",
    ],
)
@pytest.mark.parametrize("value", ["8", "eight", [8], {"n": 8}, 8.5, float("nan"), float("inf"), True])
def test_wrong_types_raise_plan_error(field, value):
    # strings where ints belong used to raise ValueError/TypeError from int(), or be accepted ("8")
    with pytest.raises(PlanError) as err:
        _parse(**{field: value})
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(sliding_window=16, sliding_window_pattern="6"), "sliding_window_pattern"),
        (dict(sliding_window=16, use_sliding_window=True, max_window_layers="2"), "max_window_layers"),
        (dict(sliding_window=16, use_sliding_window="yes"), "use_sliding_window"),
        (dict(tie_word_embeddings="false"), "tie_word_embeddings"),  # bool("false") was True
        (dict(attn_output_gate=1), "attn_output_gate"),
        (dict(mlp_only_layers=3, num_experts=4, moe_intermediate_size=8), "mlp_only_layers"),
        (dict(layer_types="full_attention"), "layer_types"),
        (dict(num_experts=4, moe_intermediate_size=None, intermediate_size=None), "intermediate_size"),
        (dict(num_experts=4, num_experts_per_tok="2", moe_intermediate_size=8), "num_experts_per_tok"),
        (dict(num_experts=4, first_k_dense_replace="1", moe_intermediate_size=8), "first_k_dense_replace"),
        (dict(num_experts=4, n_shared_experts=[1], moe_intermediate_size=8), "n_shared_experts"),
        (dict(kv_lora_rank=8, qk_rope_head_dim="64"), "qk_rope_head_dim"),
        (dict(layer_types=["linear_attention"] * 4, linear_num_key_heads=None), "linear_num_key_heads"),
        (dict(num_hidden_layers=None), "num_hidden_layers"),
        (dict(vocab_size=...), "vocab_size"),
        (dict(num_attention_heads=0), "num_attention_heads"),
    ],
)
def test_bad_optional_fields_raise_plan_error(changes, field):
    with pytest.raises(PlanError) as err:
        _parse(**changes)
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("raw", [[], "config", 3, None])
def test_top_level_must_be_an_object(raw):
    with pytest.raises(PlanError, match="JSON object"):
        model_from_hf_dict(raw, "x")


@pytest.mark.parametrize(
    "content, match",
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "unreadable JSON"),  # RecursionError before
        (b'{"num_hidden_layers": ' + b"9" * 5000 + b"}", "unreadable JSON"),  # int over 4300 digits: ValueError before
        (b'{"num_hidden_layers": NaN}', "num_hidden_layers"),  # json accepts NaN literals
        (b"[1, 2]", "JSON object"),
    ],
)
def test_bad_json_files(tmp_path, content, match):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(PlanError, match=match) as err:
        model_from_hf_file(path)
    assert "\n" not in str(err.value)


def test_missing_file(tmp_path):
    with pytest.raises(PlanError, match="cannot read"):
        model_from_hf_file(tmp_path / "nope.json")


def test_vllm_serve_is_given_an_id_or_a_folder_it_can_load(tmp_path):
    """`vllm serve` needs a Hugging Face id or the weights folder: a publisher's local `_name_or_path`
    or a renamed config file's stem is neither."""
    from jaxplan.report.vllm_command import model_argument

    folder = tmp_path / "Qwen2.5-72B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(LLAMA_LIKE, _name_or_path="/fsx/ckpt/qwen2.5-72b")))
    m = model_from_hf_file(folder / "config.json")
    assert (m.name, m.hf_id, model_argument(m)) == ("Qwen2.5-72B", "", str(folder.resolve()))
    renamed = tmp_path / "qwen25.json"
    renamed.write_text(json.dumps(LLAMA_LIKE))
    assert model_argument(model_from_hf_file(renamed)) == "<Hugging Face id or weights folder of qwen25.json>"
    renamed.write_text(json.dumps(dict(LLAMA_LIKE, _name_or_path="Qwen/Qwen2.5-72B-Instruct")))
    assert model_argument(model_from_hf_file(renamed)) == "Qwen/Qwen2.5-72B-Instruct"
    assert model_argument(load_model("llama-3.1-70b")) == "meta-llama/Llama-3.1-70B"


def test_file_name_and_hf_id(tmp_path):
    path = tmp_path / "my-model.json"
    path.write_text(json.dumps(dict(LLAMA_LIKE, _name_or_path="org/My-Model")))
    m = model_from_hf_file(path)
    assert (m.name, m.hf_id, m.source) == ("my-model", "org/My-Model", str(path))
