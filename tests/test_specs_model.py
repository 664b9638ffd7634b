"""ModelSpec: derived parameter / KV counts against hand-computed numbers, and validation.

Every expected number below is worked out by hand in the comment next to it from the
published architecture (the HF config.json numbers), not from jaxplan's code. Parameter
counts cover the weight matrices (attention projections, FFN / experts, router,
embeddings, LM head); norms and biases are left out by design, which is < 0.01% of any
model here, so published totals (rounded to the quoted digits) agree within the
tolerances stated at each assertion.
"""

from __future__ import annotations

import dataclasses

import pytest

from jaxplan.errors import PlanError
from jaxplan.specs import ModelSpec, load_model


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


# ---- KV cache bytes per token ------------------------------------------------------------


def test_llama_70b_kv_bytes_per_token():
    # 2 (K and V) * 80 layers * 8 KV heads * 128 head_dim * 2 bytes (BF16) = 327,680 bytes/token
    assert load_model("llama-3.1-70b").kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2 == 327_680
    # FP8 KV cache halves it: 163,840
    assert load_model("llama-3.1-70b").kv_bytes_per_token(1) == 163_840


@pytest.mark.parametrize(
    "name, expected",
    [
        ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),  # 131,072
        ("qwen3-32b", 2 * 64 * 8 * 128 * 2),  # 262,144 (head_dim 128 though hidden/heads = 80)
        ("qwen3-30b-a3b", 2 * 48 * 4 * 128 * 2),  # 98,304
        ("mixtral-8x7b", 2 * 32 * 8 * 128 * 2),  # 131,072
        # MLA keeps one compressed latent (kv_lora_rank 512) + the shared RoPE key (64) per token and layer:
        ("deepseek-v3", (512 + 64) * 61 * 2),  # 70,272
        # Only the 16 full-attention layers keep a per-token KV cache (48 are linear attention):
        ("qwen3.5-27b", 2 * 16 * 4 * 256 * 2),  # 65,536
        # Gemma-3-27B, every one of 62 layers counted at full length (the window cap is applied later):
        ("gemma-3-27b", 2 * 62 * 16 * 128 * 2),  # 507,904
    ],
)
def test_kv_bytes_per_token(name, expected):
    assert load_model(name).kv_bytes_per_token(2) == expected


def test_qwen35_keeps_kv_in_16_of_64_layers_and_a_constant_linear_state():
    m = load_model("qwen3.5-27b")
    assert (m.num_layers, m.full_attention_layers, m.linear_attention_layers, m.sliding_window_layers) == (64, 16, 48, 0)
    # Gated DeltaNet recurrent state: 48 value heads x 128 (key dim) x 128 (value dim) fp32 = 3,145,728 bytes;
    # conv state: (kernel 4 - 1) x (2 x 16 key heads x 128 + 48 value heads x 128 = 10,240 channels) x 2 bytes = 61,440.
    ssm = 48 * 128 * 128 * 4
    conv = (4 - 1) * (2 * 16 * 128 + 48 * 128) * 2
    assert ssm == 3_145_728 and conv == 61_440
    assert m.linear_state_bytes_per_request_per_layer() == ssm + conv
    # the conv state is the "small" part: under 2% of the per-layer state
    assert conv / (ssm + conv) < 0.02


def test_gemma3_27b_has_10_global_and_52_sliding_layers():
    m = load_model("gemma-3-27b")
    assert (m.full_attention_layers, m.sliding_window_layers, m.sliding_window_tokens) == (10, 52, 1024)
    # the 10 global layers alone: 10 * 2 * 16 * 128 * 2 = 81,920 bytes per token (models.csv notes)
    assert m.full_attention_layers * m.kv_elements_per_token_per_layer() * 2 == 81_920


def test_models_without_linear_attention_hold_no_linear_state():
    for name in ("llama-3.1-8b", "deepseek-v3", "gemma-3-27b"):
        assert load_model(name).linear_state_bytes_per_request_per_layer() == 0
        assert load_model(name).linear_attention_params_per_layer() == 0


# ---- parameter counts --------------------------------------------------------------------
#
# Dense GQA layer: q = h*H*d, k and v = 2*h*K*d, o = H*d*h; SwiGLU FFN = 3*h*I.


def test_llama_8b_params():
    # attention per layer: 4096*4096 + 2*4096*8*128 + 4096*4096 = 41,943,040; x32 = 1,342,177,280
    # FFN per layer: 3*4096*14336 = 176,160,768; x32 = 5,637,144,576
    # embeddings + untied LM head: 2 * 128256*4096 = 1,050,673,152
    expected = 1_342_177_280 + 5_637_144_576 + 1_050_673_152  # 8,029,995,008
    m = load_model("llama-3.1-8b")
    assert m.total_params == expected == m.active_params
    assert _rel(m.total_params, 8.03e9) < 0.001  # Meta: 8.03B (rounded to 3 digits)


def test_llama_70b_params():
    # attention: 8192*8192 + 2*8192*1024 + 8192*8192 = 150,994,944; x80 = 12,079,595,520
    # FFN: 3*8192*28672 = 704,643,072; x80 = 56,371,445,760
    # embeddings + LM head: 2 * 128256*8192 = 2,101,346,304
    expected = 12_079_595_520 + 56_371_445_760 + 2_101_346_304  # 70,552,387,584
    assert load_model("llama-3.1-70b").total_params == expected
    assert _rel(expected, 70.6e9) < 0.001  # 70.55e9 vs the quoted 70.6B: rounding


def test_qwen3_32b_params():
    # attention: 5120*(64*128) + 2*5120*(8*128) + (64*128)*5120 = 94,371,840; x64 = 6,039,797,760
    # FFN: 3*5120*25600 = 393,216,000; x64 = 25,165,824,000
    # embeddings + LM head: 2 * 151936*5120 = 1,555,824,640
    expected = 6_039_797_760 + 25_165_824_000 + 1_555_824_640  # 32,761,446,400
    assert load_model("qwen3-32b").total_params == expected
    assert _rel(expected, 32.8e9) < 0.002  # Qwen: 32.8B


def test_qwen3_30b_a3b_params():
    # attention: 2048*4096 + 2*2048*512 + 4096*2048 = 18,874,368; x48 = 905,969,664
    # one expert: 3*2048*768 = 4,718,592; router 2048*128 = 262,144
    # all experts per layer: 128*4,718,592 + 262,144 = 604,241,920; x48 = 29,003,612,160
    # 8 active per layer: 8*4,718,592 + 262,144 = 38,010,880; x48 = 1,824,522,240
    # embeddings + LM head: 2 * 151936*2048 = 622,329,856
    total = 905_969_664 + 29_003_612_160 + 622_329_856  # 30,531,911,680
    active = 905_969_664 + 1_824_522_240 + 622_329_856  # 3,352,821,760
    m = load_model("qwen3-30b-a3b")
    assert (m.total_params, m.active_params) == (total, active)
    assert _rel(total, 30.5e9) < 0.002  # Qwen: 30.5B total
    assert _rel(active, 3.3e9) < 0.02  # Qwen: "3.3B activated" (3.35 rounds to 3.3 or 3.4)


def test_mixtral_8x7b_params():
    # attention: 4096*4096 + 2*4096*1024 + 4096*4096 = 41,943,040; x32 = 1,342,177,280
    # one expert: 3*4096*14336 = 176,160,768; router 4096*8 = 32,768
    # all 8: 1,409,286,144 + 32,768 = 1,409,318,912; x32 = 45,098,205,184
    # 2 active: 352,321,536 + 32,768 = 352,354,304; x32 = 11,275,337,728
    # embeddings + LM head: 2 * 32000*4096 = 262,144,000
    total = 1_342_177_280 + 45_098_205_184 + 262_144_000  # 46,702,526,464
    active = 1_342_177_280 + 11_275_337_728 + 262_144_000  # 12,879,659,008
    m = load_model("mixtral-8x7b")
    assert (m.total_params, m.active_params) == (total, active)
    assert _rel(total, 46.7e9) < 0.001 and _rel(active, 12.9e9) < 0.002  # Mistral: 46.7B / 12.9B


def test_deepseek_v3_params():
    # MLA per layer: q_a 7168*1536 = 11,010,048; q_b 1536*128*(128+64) = 37,748,736;
    #   kv_a 7168*(512+64) = 4,128,768; kv_b 512*128*(128+128) = 16,777,216; o 128*128*7168 = 117,440,512
    #   = 187,105,280; x61 = 11,413,422,080
    # 3 dense FFN layers: 3 * 3*7168*18432 = 1,189,085,184
    # one expert 3*7168*2048 = 44,040,192; router 7168*256 = 1,835,008
    # 58 MoE layers, 256 routed + 1 shared: (257*44,040,192 + 1,835,008) * 58 = 656,569,532,416
    #   active, 8 routed + 1 shared:        (9*44,040,192 + 1,835,008) * 58 = 23,095,410,688
    # embeddings + LM head: 2 * 129280*7168 = 1,853,358,080
    common = 11_413_422_080 + 1_189_085_184 + 1_853_358_080
    total = common + 656_569_532_416  # 671,025,397,760
    active = common + 23_095_410_688  # 37,551,276,032
    m = load_model("deepseek-v3")
    assert (m.total_params, m.active_params) == (total, active)
    assert _rel(total, 671e9) < 0.001  # DeepSeek: 671B (main model, MTP module excluded)
    assert _rel(active, 37e9) < 0.02  # DeepSeek: "37B activated"; 37.55B here, the paper rounds down


def test_qwen35_27b_params():
    # linear-attention layer: in_proj hidden*(2*2048 + 2*6144 + 2*48) = 5120*16,480 = 84,377,600;
    #   conv 4*(2*2048 + 6144) = 40,960; out 6144*5120 = 31,457,280 -> 115,875,840; x48 = 5,562,040,320
    # gated full attention: q (doubled by the gate) 5120*24*256*2 = 62,914,560; kv 2*5120*4*256 = 10,485,760;
    #   o 24*256*5120 = 31,457,280 -> 104,857,600; x16 = 1,677,721,600
    # FFN: 3*5120*17408 = 267,386,880; x64 = 17,112,760,320
    # embeddings + LM head: 2 * 248320*5120 = 2,542,796,800
    expected = 5_562_040_320 + 1_677_721_600 + 17_112_760_320 + 2_542_796_800  # 26,895,319,040
    assert load_model("qwen3.5-27b").total_params == expected
    assert _rel(expected, 27e9) < 0.01  # "27B" names the text decoder plus a ~0.4B vision tower


def test_gemma3_27b_params():
    # attention: 5376*(32*128) + 2*5376*(16*128) + 4096*5376 = 66,060,288; x62 = 4,095,737,856
    # FFN: 3*5376*21504 = 346,816,512; x62 = 21,502,623,744
    # tied embeddings, counted once: 262208*5376 = 1,409,630,208
    expected = 4_095_737_856 + 21_502_623_744 + 1_409_630_208  # 27,007,991,808
    m = load_model("gemma-3-27b")
    assert m.total_params == expected and m.lm_head_params == 0
    assert _rel(expected, 27e9) < 0.001


def test_active_params_never_exceed_total():
    for name in ("deepseek-v3", "mixtral-8x7b", "qwen3-30b-a3b", "llama-3.1-8b"):
        m = load_model(name)
        assert 0 < m.active_params <= m.total_params
        assert m.is_moe == (m.active_params < m.total_params)


def test_describe_is_one_line_with_the_numbers():
    text = load_model("deepseek-v3").describe()
    assert "\n" not in text and "671.0B" in text and "MLA" in text and "8/256" in text


# ---- validation --------------------------------------------------------------------------

BASE = dict(
    name="t",
    num_layers=4,
    hidden_size=256,
    vocab_size=1000,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=64,
    intermediate_size=512,
    max_position_embeddings=4096,
)


def _model(**changes) -> ModelSpec:
    return ModelSpec(**{**BASE, **changes})


def test_minimal_model_derives_full_attention_layers():
    m = _model()
    assert m.full_attention_layers == 4 and not m.is_moe and not m.is_mla


def test_spec_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        _model().num_layers = 5


@pytest.mark.parametrize(
    "field",
    ["num_layers", "hidden_size", "vocab_size", "num_attention_heads", "num_kv_heads", "head_dim", "intermediate_size", "max_position_embeddings"],
)
@pytest.mark.parametrize("value", [0, -1, 1.5, "8", None, True, float("nan")])
def test_positive_fields_reject_bad_values(field, value):
    with pytest.raises(PlanError, match=field):
        _model(**{field: value})


@pytest.mark.parametrize(
    "field",
    ["sliding_window_tokens", "kv_lora_rank", "q_lora_rank", "num_experts", "num_shared_experts", "first_dense_layers", "linear_conv_kernel"],
)
@pytest.mark.parametrize("value", [-1, 1.5, "8", None, 10**30])
def test_optional_fields_reject_negative_and_wrong_types(field, value):
    # before the fix, negative q_lora_rank / num_shared_experts gave negative parameter counts silently
    with pytest.raises(PlanError, match=field):
        _model(**{field: value})


def test_huge_experts_count_is_a_plan_error_not_overflow():
    # num_experts = 10^400 used to reach `f"{total_params:.3g}"` and raise OverflowError
    with pytest.raises(PlanError, match="num_experts"):
        _model(num_experts=10**400, experts_per_token=1, moe_intermediate_size=8)


def test_implausible_parameter_count():
    # 2^20 experts * 3 * 8192 * 65536 per layer * 64 layers ~ 1e20 > 1e14 limit
    with pytest.raises(PlanError, match="parameters is implausible"):
        _model(num_layers=64, hidden_size=8192, num_attention_heads=64, num_kv_heads=8, head_dim=128,
               num_experts=1 << 20, experts_per_token=8, moe_intermediate_size=65536)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(num_layers=5000), "num_layers"),
        (dict(hidden_size=1 << 40), "hidden_size"),
        (dict(num_kv_heads=3), "num_kv_heads"),  # 3 does not divide 4 heads
        (dict(full_attention_layers=3), "full_attention_layers"),  # 3 != 4 layers
        (dict(full_attention_layers=2, sliding_window_layers=2), "sliding_window_tokens"),
        (dict(full_attention_layers=5, sliding_window_layers=-1, sliding_window_tokens=8), "sliding_window_layers"),
        (dict(linear_attention_layers=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8), "linear_num_key_heads"),
        (dict(num_experts=4), "experts_per_token"),
        (dict(num_experts=4, experts_per_token=5, moe_intermediate_size=8), "experts_per_token"),
        (dict(num_experts=4, experts_per_token=2), "moe_intermediate_size"),
        (dict(num_experts=4, experts_per_token=2, moe_intermediate_size=8, first_dense_layers=9), "first_dense_layers"),
        (dict(kv_lora_rank=32), "qk_rope_head_dim"),
        (dict(linear_state_bytes_per_element=-4), "linear_state_bytes_per_element"),
    ],
)
def test_inconsistent_models_raise_one_line_errors(changes, field):
    with pytest.raises(PlanError) as err:
        _model(**changes)
    message = str(err.value)
    assert field in message and "\n" not in message and "model 't'" in message


def test_sliding_and_linear_layers_count_correctly():
    m = _model(num_layers=6, sliding_window_layers=4, sliding_window_tokens=128, linear_attention_layers=1,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
               linear_conv_kernel=4)
    assert (m.full_attention_layers, m.sliding_window_layers, m.linear_attention_layers) == (1, 4, 1)
    # KV counted for the 5 softmax layers: 5 * 2 * 2 KV heads * 64 * 2 bytes = 2,560
    assert m.kv_bytes_per_token(2) == 2_560
    # linear state: 4 v-heads * 8 * 8 * 4 bytes = 1,024; conv: (4 - 1) * (2*16 + 32 channels) * 2 bytes = 384
    assert m.linear_state_bytes_per_request_per_layer() == 1_024 + 384


def test_tensor_parallel_sizes_divide_heads_and_hidden():
    # 24 heads allow 1, 2, 3, 4, 6, 8, 12, but hidden 5120 = 2^10 * 5 rules out 3, 6 and 12
    assert load_model("qwen3.5-27b").allowed_tensor_parallel_sizes() == [1, 2, 4, 8]
    assert load_model("llama-3.1-70b").allowed_tensor_parallel_sizes() == [1, 2, 4, 8, 16, 32, 64]

