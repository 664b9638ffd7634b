"""An empty sweep says what lifting the GPU budget would do (`jaxplan.funnel.relax`).

The note is checked against sweeps run independently of it: the budget it names admits the layout
it names, and where it says the budget would not help, a sweep without one is empty for the reason
it gives."""

from __future__ import annotations

import dataclasses

from jaxplan.funnel import run_sweep
from jaxplan.funnel.reasons import FIX_WITHOUT_BUDGET, Reason
from jaxplan.funnel.relax import NO_BUDGET
from jaxplan.layout_kind import kind_label
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

GPUS = parse_gpu_list("h100_sxm,h200_sxm")


def test_a_budget_too_small_names_the_budget_that_admits_the_best_layout():
    """DeepSeek-V3 on one GPU: nothing fits in memory; the note names the layout the sweep finds
    without a budget, and a sweep at the budget it names finds that layout as its winner."""
    model, chat, space = load_model("deepseek-v3"), load_workload("chat"), load_space("small")
    empty = run_sweep(model, GPUS, chat, space.replace(gpu_budget=1))
    assert empty.shortlist == [] and empty.reason_counts[Reason.GPU_BUDGET] > 0
    text = empty.empty_explanation()
    assert text.startswith("no configuration survived: stage 2 (memory)") and "\n" not in text
    assert "Without the GPU budget (1), the best configuration that passes is " in text, text
    needed = int(text.rsplit("raise --budget to ", 1)[1].rstrip(".").replace(",", ""))
    assert needed > 1
    admitted = run_sweep(model, GPUS, chat, space.replace(gpu_budget=needed), top_k=1)
    winner = admitted.winner
    assert winner is not None and winner["num_gpus"] == needed
    assert f"{needed:,} x {winner['gpu']} as {kind_label(winner)}: raise --budget to {needed:,}." in text


def test_a_slo_no_budget_meets_is_said_to_be_the_limit():
    """8,000-token prompts under a 50 ms p99 TTFT: with the budget, most candidates cannot keep up,
    which reads as "raise --budget"; without it none meets the TTFT SLO, and the note says so."""
    model, space = load_model("llama-3.1-70b"), load_space("small")
    impossible = dataclasses.replace(load_workload("coding"), name="fast-ttft", isl_mean_tokens=8000, osl_mean_tokens=500, request_rate_per_s=20.0, ttft_slo_s=0.05)
    empty = run_sweep(model, GPUS, impossible, space)
    assert empty.shortlist == []
    text = empty.empty_explanation()
    unlimited = run_sweep(model, GPUS, impossible, space.replace(gpu_budget=NO_BUDGET), explain_budget=False)
    assert unlimited.shortlist == []
    stage, name, before, _, _ = unlimited.last_sieve()
    counts = unlimited.reason_counts
    # some candidates keep up without the budget, and every one of them misses the TTFT SLO
    assert stage == 4 and counts[Reason.TTFT_SLO] > 0 and counts.get(Reason.TPOT_SLO, 0) == counts.get(Reason.BELOW_TARGET, 0) == 0
    assert (f"Raising --budget would not help: without it, stage 4 (estimate) still removes the last {before:,} candidates; those that get "
            f"furthest fail on {Reason.TTFT_SLO.description} ({counts[Reason.TTFT_SLO]:,}); to relax that: loosen the TTFT SLO or add larger TP.") in text, text
    assert "raise --budget" not in text  # neither the fixes before the note nor the note send the user to the budget
    assert empty.budget_helps is False


def test_where_the_budget_removed_nothing_the_fixes_do_not_name_it():
    """A budget above every layout of the space (the small space's largest is 128 GPUs): the
    candidates that cannot keep up need the space's DP range widened, not the budget raised; the
    line also gives what the candidates that keep up fail on."""
    model, space = load_model("llama-3.1-70b"), load_space("small").replace(gpu_budget=1000)
    impossible = dataclasses.replace(load_workload("coding"), name="fast-ttft", isl_mean_tokens=8000, osl_mean_tokens=500, request_rate_per_s=20.0, ttft_slo_s=0.05)
    empty = run_sweep(model, GPUS, impossible, space)
    counts = empty.reason_counts
    assert empty.shortlist == [] and counts.get(Reason.GPU_BUDGET, 0) == 0 and empty.budget_note == ""
    assert counts[Reason.OVERLOADED] > counts[Reason.TTFT_SLO] > 0
    text = empty.empty_explanation()
    assert (f"mostly because {Reason.OVERLOADED.description} ({counts[Reason.OVERLOADED]:,}); those that get furthest fail on "
            f"{Reason.TTFT_SLO.description} ({counts[Reason.TTFT_SLO]:,}). To relax: {FIX_WITHOUT_BUDGET[Reason.OVERLOADED]}; "
            f"for those: {FIX_WITHOUT_BUDGET[Reason.TTFT_SLO]}.") in text, text
    assert "budget" not in text


def test_no_note_where_the_budget_removed_nothing_or_when_asked_not_to():
    """The budget is no sieve of a space whose layouts all fit it, and explain_budget=False skips the
    second pass: the explanation is the sieve's alone."""
    model, space = load_model("deepseek-v3"), load_space("small")
    chat = load_workload("chat")
    asked_not = run_sweep(model, GPUS, chat, space.replace(gpu_budget=1), explain_budget=False)
    assert asked_not.budget_note == "" and asked_not.empty_explanation().endswith(f"To relax: {Reason.WEIGHTS_DONT_FIT.fix}.")
    fp4 = run_sweep(model, parse_gpu_list("h100_sxm"), chat, space.replace(weight_dtype=("nvfp4",), tensor_parallel_size=(1,), pipeline_parallel_size=(1,),
                                                                          data_parallel_size=(1,)))
    assert fp4.shortlist == [] and fp4.reason_counts.get(Reason.GPU_BUDGET, 0) == 0
    assert fp4.budget_note == "" and fp4.empty_explanation().endswith(f"To relax: {Reason.FP4_UNSUPPORTED.fix}.")
