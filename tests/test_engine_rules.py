"""vLLM's own rules (`funnel.rules`): one definition for the sweep's stage 1 and `predict`'s rows, and
uneven pipeline stages priced at the largest stage.

Expected reasons are worked out by hand from the models' head counts and layers; the stage sizes are
checked against a plain-Python copy of vLLM's split (vllm/distributed/utils.py get_pp_indices)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan.engine_rules import invalid_reasons
from jaxplan.funnel.reasons import Reason
from jaxplan.funnel.structure import structure
from jaxplan.grid import Candidates
from jaxplan.physics import hardware_table, make_layout, model_shape
from jaxplan.physics.batch import StepBatch
from jaxplan.physics.memory import EMBEDDING_BYTES_PER_PARAM, kv_bytes_per_token_per_gpu, pipeline_stages, weight_bytes_per_gpu
from jaxplan.physics.params import efficiency_for
from jaxplan.physics.shapes import take
from jaxplan.physics.step_time import attention_time_s, gemm_time_s, step_cost
from jaxplan.specs import load_gpu, load_model

F32 = 1e-5
# Llama-3.1-8B's shape with 24 heads of 128 (hidden 3,072) and 4 KV heads: TP = 3 or 6 divides the
# heads and the hidden size but not the KV heads, nor they it. No bundled model has such heads.
GQA_24_4 = dataclasses.replace(load_model("llama-3.1-8b"), name="gqa-24-4", num_attention_heads=24, num_kv_heads=4, hidden_size=3072)

# (model, TP, PP, max_num_seqs, max_num_batched_tokens, expected) -- worked out by hand.
CASES = [
    ("llama-3.1-70b", 3, 1, 256, 8192, Reason.TP_HEADS),  # 64 % 3 = 1
    ("llama-3.1-70b", 16, 1, 256, 8192, Reason.ADMITTED),  # 16 divides 64 heads and 8192; 8 KV heads divide 16
    ("llama-3.1-70b", 1, 3, 256, 8192, Reason.ADMITTED),  # 80 layers in 3 stages of 27, 27, 26: vLLM runs it
    ("llama-3.1-8b", 1, 33, 256, 8192, Reason.PP_LAYERS),  # 33 stages, 32 layers: a stage without one
    ("llama-3.1-8b", 1, 32, 256, 8192, Reason.ADMITTED),
    ("llama-3.1-70b", 2, 1, 256, 128, Reason.BUDGET_BELOW_SEQS),  # 128 tokens < 256 sequences
    ("gqa-24-4", 3, 1, 256, 8192, Reason.KV_HEADS),  # 24 % 3 = 0 and 3072 % 3 = 0; 4 % 3 = 1
    ("gqa-24-4", 6, 1, 256, 8192, Reason.KV_HEADS),  # 6 % 4 = 2
    ("gqa-24-4", 12, 1, 256, 8192, Reason.ADMITTED),  # 12 % 4 = 0: each KV head on 3 ranks
    ("gqa-24-4", 16, 1, 256, 8192, Reason.TP_HEADS),  # 24 % 16 = 8
    ("qwen3.5-27b", 3, 1, 256, 8192, Reason.TP_HEADS),  # 24 heads divide, hidden 5120 % 3 = 2
    ("deepseek-v3", 16, 1, 256, 8192, Reason.ADMITTED),  # MLA: no KV-head rule
    ("deepseek-v3", 1, 2, 256, 8192, Reason.ADMITTED),  # 61 layers: 31 + 30
    ("deepseek-v3", 3, 1, 256, 128, Reason.TP_HEADS),  # TP before the budget
]


def spec(name: str):
    return GQA_24_4 if name == GQA_24_4.name else load_model(name)


def sweep_reason(model, tp, pp, seqs, budget) -> Reason:
    """The sweep's stage 1 on one candidate: bf16 weights on an H100, no budget or node limit, so
    only vLLM's rules can fail."""
    gpus = (load_gpu("h100_sxm"),)
    hw = take(hardware_table(gpus, efficiency_for(["h100_sxm"])), jnp.zeros(1, jnp.int32))
    one = lambda v: jnp.full(1, v, jnp.float32)  # noqa: E731
    c = Candidates(digits=jnp.zeros((1, 9), jnp.int32), valid=jnp.ones(1, bool), gpu_index=jnp.zeros(1, jnp.int32),
                   tensor_parallel_size=one(tp), pipeline_parallel_size=one(pp), data_parallel_size=one(1),
                   max_num_seqs=one(seqs), max_num_batched_tokens=one(budget), weight_bytes_per_param=one(2), kv_bytes_per_element=one(2),
                   expert_weight_format=one(0), lockstep_ranks=one(1), expert_parallel=one(0))
    return Reason(int(structure(model_shape(model), hw, c, jnp.inf, jnp.bool_(True))[0]))


@pytest.mark.parametrize(("name", "tp", "pp", "seqs", "budget", "expected"), CASES)
def test_sweep_and_predict_refuse_what_vllm_refuses(name, tp, pp, seqs, budget, expected):
    model = spec(name)
    assert sweep_reason(model, tp, pp, seqs, budget) == expected
    row = dict(model=name, tensor_parallel_size=tp, pipeline_parallel_size=pp, max_num_seqs=seqs, max_num_batched_tokens=budget)
    (said,) = invalid_reasons(model, [row])
    if expected == Reason.ADMITTED:
        assert said is None
    else:
        assert said is not None and said.startswith("invalid: ") and "(vLLM refuses to start)" in said
        words = {Reason.TP_HEADS: "does not divide", Reason.KV_HEADS: "KV heads", Reason.PP_LAYERS: "layers", Reason.BUDGET_BELOW_SEQS: "below max_num_seqs"}
        assert words[expected] in said, said


def test_predict_checks_a_batch_of_rows_like_one_row_at_a_time():
    model = load_model("llama-3.1-70b")
    rows = [dict(model=model.name, tensor_parallel_size=tp, pipeline_parallel_size=pp, max_num_seqs=seqs, max_num_batched_tokens=budget)
            for name, tp, pp, seqs, budget, _ in CASES if name == model.name]
    assert invalid_reasons(model, rows) == [invalid_reasons(model, [row])[0] for row in rows]


def test_the_rules_are_one_program_for_every_row_count_of_a_bucket():
    """`rule_failures` prices every rule in one compiled program, rows padded to 8 and beyond to a power
    of two: 3, 5 and 8 rows compile it once between them (the rules evaluated one operation at a time
    compiled a program per operation), and its verdicts are each rule's own, row by row."""
    import jax

    from jaxplan.engine_rules import engine_arguments, rule_failures
    from jaxplan.funnel.rules import ENGINE_RULES

    model = spec("gqa-24-4")
    shape = model_shape(model)
    rows = [dict(model=model.name, tensor_parallel_size=tp, pipeline_parallel_size=pp, max_num_seqs=seqs, max_num_batched_tokens=budget)
            for tp, pp, seqs, budget in ((3, 1, 256, 8192), (5, 1, 256, 8192), (4, 29, 256, 8192), (2, 1, 512, 256), (1, 1, 256, 8192),
                                         (8, 2, 64, 2048), (6, 1, 128, 128), (2, 4, 256, 8192))]
    compiles = []
    listener = lambda name, *_, **__: compiles.append(name) if name == "/jax/core/compile/backend_compile_duration" else None  # noqa: E731
    rule_failures(shape, engine_arguments(rows[:1]))  # the bucket of 8 rows compiled (or loaded) here
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        verdicts = {n: rule_failures(shape, engine_arguments(rows[:n])) for n in (3, 5, 8)}
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiles == []
    engine = engine_arguments(rows)
    for rule in ENGINE_RULES:
        alone = [bool(rule.fails(shape, *(np.float32(a[k]) for a in engine))) for k in range(len(rows))]
        for n, fails in verdicts.items():
            assert fails[rule.reason].tolist() == alone[:n], rule.reason
    # by hand: TP 3 and 6 divide 24 heads, but neither they nor 4 KV heads divide the other; TP 5 divides
    # neither head count; 29 stages fit 32 layers; a budget of 256 is below 512 sequences, 128 not below 128
    assert verdicts[8][Reason.TP_HEADS].tolist() == [False, True, False, False, False, False, False, False]
    assert verdicts[8][Reason.KV_HEADS].tolist() == [True, True, False, False, False, False, True, False]
    assert not verdicts[8][Reason.PP_LAYERS].any()
    assert verdicts[8][Reason.BUDGET_BELOW_SEQS].tolist() == [False, False, False, True, False, False, False, False]


def vllm_stage_layers(num_layers: int, pp: int) -> list[int]:
    """vLLM's split: floor(L / PP) per stage, one more on the L mod PP stages before the last."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def test_the_largest_stage_is_vllms():
    for layers in (1, 2, 7, 32, 61, 62, 80, 94):
        shape = model_shape(load_model("llama-3.1-8b"))._replace(num_layers=layers)
        pp = np.arange(1, layers + 1)
        stages = np.asarray(pipeline_stages(shape, make_layout(pp=pp)))
        largest = np.array([max(vllm_stage_layers(layers, int(p))) for p in pp])
        assert sum(vllm_stage_layers(layers, int(pp[-1]))) == layers
        np.testing.assert_allclose(layers / stages, largest, rtol=1e-6)
        even = layers % pp == 0
        assert np.array_equal(stages[even], pp[even].astype(np.float32)), "PP that divides the layers is PP exactly"


def test_uneven_stages_hold_the_largest_stages_weights_and_kv():
    """DeepSeek-V3, 61 layers: PP = 2 holds 31 layers (not 30.5), PP = 4 holds 16 (15, 15, 16, 15).
    MLA KV: 576 latent + rope elements per layer and token (FP8: 1 byte), not split by TP."""
    m = model_shape(load_model("deepseek-v3"))
    for pp, largest in ((1, 61), (2, 31), (4, 16)):
        assert float(kv_bytes_per_token_per_gpu(m, make_layout(tp=8, pp=pp, kv_bytes=1))) == pytest.approx(576 * largest, rel=F32)
    ends_pp1 = (m.embedding_params + m.lm_head_params) / 8 * EMBEDDING_BYTES_PER_PARAM
    ends_pp2 = max(m.embedding_params, m.lm_head_params) / 8 * EMBEDDING_BYTES_PER_PARAM
    layers_pp1 = float(weight_bytes_per_gpu(m, make_layout(tp=8, pp=1, weight_bytes=1))) - ends_pp1
    layers_pp2 = float(weight_bytes_per_gpu(m, make_layout(tp=8, pp=2, weight_bytes=1))) - ends_pp2
    assert layers_pp2 == pytest.approx(layers_pp1 * 31 / 61, rel=F32)


def test_uneven_stages_pace_the_pipeline_at_the_largest_stage():
    """Llama-3.1-8B, 32 layers at PP = 3: stages of 11, 11, 10; every stage works through the 3
    micro-batches, so the layer terms cost 3 x 11 = 33 layers' worth, 33/32 of the micro-batch
    through the model; the stage-to-stage hops do not grow."""
    m = model_shape(load_model("llama-3.1-8b"))
    hw = take(hardware_table((load_gpu("h100_sxm"),), efficiency_for(["h100_sxm"])), jnp.zeros(1, jnp.int32))
    batch = StepBatch(*(jnp.full(1, v, jnp.float32) for v in (2048.0, 96.0, 96.0 * 3000, 2048.0 * 1024, 1.0, 1024.0)))
    layout = make_layout(tp=2, pp=3)
    micro = StepBatch(*(field / 3 for field in batch))
    cost = step_cost(m, hw, layout, batch)
    tokens, logits = micro.prefill_tokens + micro.decode_tokens, micro.decode_tokens + micro.prefill_seqs
    assert float(cost.gemm_s[0]) == pytest.approx(float(gemm_time_s(m, hw, layout, tokens, logits)[0]) * 33 / 32, rel=F32)
    assert float(cost.attention_s[0]) == pytest.approx(float(attention_time_s(m, hw, layout, micro)[0]) * 33 / 32, rel=F32)
    four = make_layout(tp=2, pp=4)  # 4 stages of 8: no scaling
    micro4 = StepBatch(*(field / 4 for field in batch))
    tokens4, logits4 = micro4.prefill_tokens + micro4.decode_tokens, micro4.decode_tokens + micro4.prefill_seqs
    assert float(step_cost(m, hw, four, batch).gemm_s[0]) == pytest.approx(float(gemm_time_s(m, hw, four, tokens4, logits4)[0]), rel=F32)


@pytest.mark.parametrize(("row", "fragment"), [
    (dict(gpu="a100_sxm", max_num_seqs=4096), "2,048 is vLLM's default on a100_sxm: state max_num_batched_tokens of at least 4,096"),
    (dict(gpu="h200_sxm", max_num_seqs=4096), None),  # the H200's default budget is 8,192
    (dict(gpu="h100_sxm", gpu_hbm_bytes_override=48e9, max_num_seqs=4096), "2,048 is vLLM's default on h100_sxm"),  # under 70 GiB
    (dict(gpu="a100_sxm", max_num_batched_tokens=128), None),  # vLLM lowers its default sequences to the budget
    (dict(gpu="no-such-gpu", max_num_seqs=4096), None),  # the GPU's own error comes from row_batches
])
def test_a_knob_left_out_is_checked_at_vllms_default_for_the_gpu(row, fragment):
    """vLLM fills a left-out --max-num-batched-tokens with its GPU's default and then refuses a budget
    below --max-num-seqs (SchedulerConfig); a left-out --max-num-seqs it lowers to the budget."""
    (said,) = invalid_reasons(load_model("llama-3.1-8b"), [dict(model="llama-3.1-8b", tensor_parallel_size=1, **row)])
    if fragment is None:
        assert said is None
    else:
        assert said is not None and "max_num_batched_tokens 2,048 is below max_num_seqs 4,096 (vLLM refuses to start)" in said and fragment in said, said
