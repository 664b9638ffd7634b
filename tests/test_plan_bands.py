"""A sweep's bands and the verdict on the winner's lead (jaxplan.plan_bands), on hand-made rows."""

import dataclasses
import math

import pytest

from jaxplan.plan_bands import band_line, kv_fits, verdict, with_bands
from jaxplan.specs.workload import Arrival, Workload

CLOSED = Workload(name="t", isl_mean_tokens=1000, osl_mean_tokens=500, arrival=Arrival.CLOSED, concurrency=64, num_requests=640)
TABLE = {
    "record": {"fitted_gpus": ["h200_sxm"], "fitted_models": ["llama-3.1-70b"], "prior_gpus": ["h100_sxm"]},
    "classes": {
        "calibrated/seen/kv_fits": {"ttft_ms_mean": [0.8, 1.25], "tpot_ms_mean": [0.9, 1.1], "output_tok_s": [0.9, 1.1]},
        "calibrated/seen/kv_starved": {"ttft_ms_mean": [0.5, 8.0], "tpot_ms_mean": [0.8, 1.3], "output_tok_s": [0.7, 1.2]},
        "kernel_tables/seen/kv_fits": {"ttft_ms_mean": [0.8, 1.6], "tpot_ms_mean": [0.85, 1.2], "output_tok_s": [0.8, 1.2]},
    },
}


def row(gpu="h200_sxm", tokens_per_s=1000.0, hourly_usd=10.0, dp=1, kv_blocks=10_000, **changes) -> dict:
    base = dict(
        gpu=gpu, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=dp, num_gpus=dp, hourly_usd=hourly_usd,
        output_tokens_per_s=tokens_per_s, ttft_mean_s=0.2, ttft_p99_s=0.5, tpot_mean_s=0.02, tpot_p99_s=0.03, kv_blocks_per_replica=kv_blocks,
    )  # fmt: skip
    return {**base, **changes}


def banded(rows, workload=CLOSED):
    return with_bands(rows, "llama-3.1-70b", workload, 16, table=TABLE)


def test_a_closed_loop_fits_when_each_replica_holds_its_clients_contexts():
    # 64 clients x 1,500 tokens = 96,000 tokens: 6,000 blocks of 16 on one replica, 3,000 each on two.
    rows = [row(kv_blocks=6000), row(kv_blocks=5999), row(kv_blocks=3000, dp=2), row(kv_blocks=2999, dp=2)]
    assert kv_fits(rows, CLOSED, 16).tolist() == [True, False, True, False]
    poisson = dataclasses.replace(CLOSED, arrival=Arrival.POISSON, request_rate_per_s=1.0)
    assert kv_fits(rows, poisson, 16).all()  # an open loop counts as fitting, as calibrate's rows do


def test_each_row_gets_its_class_band_on_what_ranked_it():
    fits, starved, replayed, priors_only = banded([
        row(), row(kv_blocks=10), row(replay_output_tokens_per_s=500.0, replay_ttft_mean_s=0.4, replay_tpot_mean_s=0.05), row(gpu="h100_sxm"),
    ])  # fmt: skip
    assert fits["band_class"] == "calibrated/seen/kv_fits" and starved["band_class"] == "calibrated/seen/kv_starved"
    assert fits["output_tokens_per_s_p10"] == pytest.approx(900) and fits["output_tokens_per_s_p90"] == pytest.approx(1100)
    assert fits["ttft_mean_s_p10"] == pytest.approx(0.16) and fits["tpot_mean_s_p90"] == pytest.approx(0.022)
    assert starved["ttft_mean_s_p90"] == pytest.approx(1.6)
    assert replayed["output_tokens_per_s_p10"] == pytest.approx(450) and replayed["ttft_mean_s_p90"] == pytest.approx(0.5)  # the replay's means
    assert priors_only["band_class"] == "kernel_tables/seen/kv_fits" and priors_only["output_tokens_per_s_p10"] == pytest.approx(800)
    assert "docs/uncertainty.md" in band_line(fits) and "900-1,100 output tokens/s" in band_line(fits)


def test_a_class_without_a_band_leaves_the_ends_empty():
    (unknown,) = banded([row(gpu="mi355x")])
    assert unknown["band_class"] == "spec_sheet/seen/kv_fits" and unknown["output_tokens_per_s_p10"] is None and band_line(unknown) is None


def test_poisson_throughput_never_exceeds_what_is_offered():
    poisson = dataclasses.replace(CLOSED, arrival=Arrival.POISSON, request_rate_per_s=2.0)  # 1,000 output tokens/s offered
    (r,) = banded([row(tokens_per_s=1000.0)], poisson)
    assert r["output_tokens_per_s_p10"] == pytest.approx(900) and r["output_tokens_per_s_p90"] == pytest.approx(1000)


def test_under_poisson_traffic_the_throughput_band_is_the_capacity_s_capped_at_the_rate_sent():
    """A finalist that keeps up serves the rate sent; the doubt is whether its capacity (the rate sent /
    stage 4's utilization) covers it: at utilization 0.8 the capacity's p10 (1,250 x 0.9) is above
    the 1,000 tokens/s sent, at 0.95 (1,053 x 0.9 = 947) below, and the verdict says so. A replayed
    finalist that falls behind keeps the band of what its replay served."""
    poisson = dataclasses.replace(CLOSED, arrival=Arrival.POISSON, request_rate_per_s=2.0)  # 1,000 output tokens/s sent
    roomy, tight, behind = banded([row(utilization=0.8), row(utilization=0.95),
                                   row(utilization=0.95, replay_falls_behind=True, replay_output_tokens_per_s=800.0, replay_ttft_mean_s=9.0, replay_tpot_mean_s=0.05)], poisson)  # fmt: skip
    assert roomy["output_tokens_per_s_p10"] == pytest.approx(1000) and roomy["output_tokens_per_s_p90"] == pytest.approx(1000)
    assert tight["output_tokens_per_s_p10"] == pytest.approx(1000 / 0.95 * 0.9) and tight["output_tokens_per_s_p90"] == pytest.approx(1000)
    assert behind["output_tokens_per_s_p10"] == pytest.approx(720) and behind["output_tokens_per_s_p90"] == pytest.approx(880)
    assert verdict([roomy], poisson).notes == () and band_line(roomy).endswith("1,000 output tokens/s at both ends")
    (note,) = verdict([tight], poisson).notes
    assert note.startswith("At its band's low end (p10) the winner's capacity is 947 output tokens/s, below the 1,000 that arrive") and "at 95% of its capacity" in note


def test_a_runner_up_inside_the_bands_is_a_close_call():
    # Tokens per dollar: 100 against 95 (5% ahead); the winner's p10 (90) is below the runner-up's p90 (104.5).
    v = verdict(banded([row(tokens_per_s=1000.0), row(tokens_per_s=950.0)]), CLOSED)
    assert v.close and v.lead == pytest.approx(1000 / 950 - 1) and "Too close to call" in v.notes[0]
    assert "runner-up (1 x h200_sxm as TP1xPP1xDP1)" in v.notes[0]  # spelled as the table and the other lines spell layouts


def test_a_lead_wider_than_the_bands_is_not():
    # 100 against 70 per dollar: the winner's p10 (90) is above the runner-up's p90 (77).
    v = verdict(banded([row(tokens_per_s=1000.0), row(tokens_per_s=700.0)]), CLOSED)
    assert not v.close and v.lead == pytest.approx(1000 / 700 - 1) and v.notes == ()


def test_ranked_by_cost_there_is_no_close_call_but_the_target_is_checked():
    target = dataclasses.replace(CLOSED, target_output_tokens_per_s=950.0)
    v = verdict(banded([row(tokens_per_s=1000.0), row(tokens_per_s=999.0)], target), target)
    assert v.lead is None and not v.close
    assert len(v.notes) == 1 and "below the 950 target" in v.notes[0]  # p10 = 900


def test_an_slo_the_band_s_high_end_misses_is_said():
    slo = dataclasses.replace(CLOSED, tpot_slo_s=0.032, ttft_slo_s=math.inf)
    (v_note,) = verdict(banded([row()], slo), slo).notes  # p99 TPOT 30 ms x 1.1 = 33 ms > 32 ms
    assert "p99 TPOT would be 33 ms" in v_note
    looser = dataclasses.replace(slo, tpot_slo_s=0.034)
    assert verdict(banded([row()], looser), looser).notes == ()
    assert verdict([], CLOSED) is None


def test_a_layout_no_measured_run_checks_is_said():
    """Pipeline stages and lock-step DP ranks each get a line under the winner; a plain TP x DP layout none."""
    (pp,) = verdict(banded([row(pipeline_parallel_size=2)]), CLOSED).notes
    assert "pipeline parallelism" in pp and "0.8.3" in pp
    (lockstep,) = verdict(banded([row(lockstep_ranks=4, dp=4)]), CLOSED).notes
    assert "lock-step data parallelism" in lockstep and "docs/moe.md" in lockstep
    assert len(verdict(banded([row(pipeline_parallel_size=2, lockstep_ranks=2)]), CLOSED).notes) == 2
    assert verdict(banded([row(lockstep_ranks=1, dp=8)]), CLOSED).notes == ()


def test_the_note_names_the_best_finalist_without_the_unchecked_part():
    """Under a pipeline-parallel winner the note names the best finalist without pipeline stages that
    meets the workload (replayed: no shortfall), its cost against the winner's and its p99s; finalists
    that miss an SLO in the replay are passed over; where all of them miss, it says so; where every
    finalist uses it, nothing is added."""
    slo = dataclasses.replace(CLOSED, ttft_slo_s=1.0, tpot_slo_s=0.05)
    replayed = dict(replay_output_tokens_per_s=1000.0, replay_ttft_mean_s=0.2, replay_tpot_mean_s=0.02, replay_unfinished=0)
    cost = "cost_per_million_output_tokens_usd"
    winner = row(pipeline_parallel_size=2, **replayed, replay_ttft_p99_s=0.5, replay_tpot_p99_s=0.03, **{cost: 2.5})
    pp_too = row(pipeline_parallel_size=4, **replayed, replay_ttft_p99_s=0.4, replay_tpot_p99_s=0.03, **{cost: 2.6})
    misses = row(tensor_parallel_size=2, **replayed, replay_ttft_p99_s=1.5, replay_tpot_p99_s=0.03, **{cost: 2.7})  # TTFT SLO
    meets = row(tensor_parallel_size=4, dp=2, **replayed, replay_ttft_p99_s=0.6, replay_tpot_p99_s=0.0412, **{cost: 2.8})
    def pp_note(rows, workload=slo):
        (note,) = [n for n in verdict(banded(rows, workload), workload).notes if "pipeline parallelism" in n]
        return note

    note = pp_note([winner, pp_too, misses, meets])
    assert note.endswith(" The best finalist without it: 2 x h200_sxm as TP4xPP1xDP2, $2.80 per million output tokens against "
                         "the winner's $2.50, replayed p99 TTFT 600 ms, TPOT 41.2 ms.")
    assert pp_note([winner, pp_too, misses]).endswith(" None of the 1 finalists without it meets the workload.")
    assert pp_note([winner, pp_too]).endswith("(docs/accuracy.md).")
    # stage 4 only (no replay): a finalist is one because it passed; the cost per hour where no cost per token is given
    assert pp_note([row(pipeline_parallel_size=2), row(hourly_usd=12.0)], CLOSED).endswith(" The best finalist without it: 1 x h200_sxm as TP1xPP1xDP1, $12.00 an hour against the winner's $10.00, "
                         "p99 TTFT 500 ms, TPOT 30.0 ms.")


def test_a_winner_whose_replay_preempts_says_so():
    """From 1% of the replayed requests preempted on, the verdict says so: stage 4 chose the knobs that decide the cost."""
    replayed = dict(replay_output_tokens_per_s=900.0, replay_ttft_mean_s=0.3, replay_tpot_mean_s=0.03, replay_requests=2000)
    notes = lambda preemptions: [n for n in verdict(banded([row(**replayed, replay_preemptions=preemptions)]), CLOSED).notes if "preempted" in n]  # noqa: E731
    (note,) = notes(4554)
    assert note.startswith("The winner's replay preempted 4,554 times (2.3 a request): ") and "--max-num-batched-tokens" in note
    assert notes(19) == [] and notes(20) != []  # 1% of 2,000
    assert [n for n in verdict(banded([row()]), CLOSED).notes if "preempted" in n] == []  # not replayed


def test_a_winner_stage_4_bounds_by_its_kv_cache_says_vllm_preempts_when_not_replayed():
    from jaxplan.physics.steady_state import BOUND_DEMAND, BOUND_KV_CACHE

    notes = lambda **changes: [n for n in verdict(banded([row(**changes)]), CLOSED).notes if "preempt" in n]  # noqa: E731
    (note,) = notes(bound=BOUND_KV_CACHE)
    assert note.startswith("The winner: the KV cache bounds the batch, so vLLM preempts") and "without --no-replay" in note
    assert notes(bound=BOUND_DEMAND) == [] and notes() == []
    # Replayed, the replay's own count decides: none preempted, no line.
    assert notes(bound=BOUND_KV_CACHE, replay_output_tokens_per_s=900.0, replay_ttft_mean_s=0.3, replay_tpot_mean_s=0.03, replay_requests=2000, replay_preemptions=0) == []
