"""Sizing: the fewest GPUs and the cheapest per token per GPU type, and a batch job's wall time."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from jaxplan.errors import PlanError
from jaxplan.funnel.sweep import run_sweep
from jaxplan.sizing import rollout_seconds, size_deployments
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

MODEL = load_model("qwen3.5-27b")
GPUS = parse_gpu_list("h100_sxm,h200_sxm")
WORKLOAD = dataclasses.replace(load_workload("rl-rollout"), target_output_tokens_per_s=12_000.0)


@pytest.fixture(scope="module")
def sized():
    result = run_sweep(MODEL, GPUS, WORKLOAD, load_space("small"), top_k=1)
    return result, size_deployments(result, rollout_prompts=4096)


def test_smallest_is_the_fewest_gpus_that_meet_the_target(sized):
    _, sizing = sized
    assert [c.gpu for c in sizing.per_gpu] == ["h100_sxm", "h200_sxm"]
    for choice in sizing.per_gpu:
        r = choice.smallest
        assert r["gpu"] == choice.gpu and r["output_tokens_per_s"] >= WORKLOAD.target_output_tokens_per_s
        # Independently: a sweep of that GPU type alone with one GPU less of budget finds nothing,
        # and with exactly that budget finds a deployment of that size.
        gpu = parse_gpu_list(choice.gpu)
        space = load_space("small")
        if r["num_gpus"] > 1:
            assert run_sweep(MODEL, gpu, WORKLOAD, space.replace(gpu_budget=r["num_gpus"] - 1), top_k=1).shortlist == []
        at_budget = run_sweep(MODEL, gpu, WORKLOAD, space.replace(gpu_budget=r["num_gpus"]), top_k=1).shortlist
        assert at_budget and at_budget[0]["num_gpus"] == r["num_gpus"]
        c = choice.cheapest_per_token
        assert c["cost_per_million_output_tokens_usd"] <= r["cost_per_million_output_tokens_usd"] * (1 + 1e-3)
        assert choice.feasible_layouts >= 1


def test_rollout_time_is_inverse_to_throughput(sized):
    _, sizing = sized
    at_target = sizing.rollout_s(12_000.0)
    assert at_target == pytest.approx(4096 * WORKLOAD.osl_mean_tokens / 12_000.0)
    assert sizing.rollout_s(6_000.0) == pytest.approx(2 * at_target)  # half the throughput, twice the time
    assert rollout_seconds(10, 100.0, 0.0) == float("inf")
    payload = sizing.to_json()
    json.dumps(payload)
    assert payload["rollout"]["at_half_target_s"] == pytest.approx(2 * payload["rollout"]["at_target_s"])
    for entry in payload["per_gpu"]:
        r = entry["smallest"]
        assert r["rollout_s"] == pytest.approx(4096 * WORKLOAD.osl_mean_tokens / r["output_tokens_per_s"])
        assert r["rollout_usd"] == pytest.approx(r["rollout_s"] / 3600 * r["hourly_usd"])


def test_sizing_needs_a_target(sized):
    result, _ = sized
    no_target = dataclasses.replace(result, workload=dataclasses.replace(WORKLOAD, target_output_tokens_per_s=0.0))
    with pytest.raises(PlanError, match="target"):
        size_deployments(no_target)


def test_cli_size_and_sweep_with_target(tmp_path):
    from jaxplan.cli import app

    runner = CliRunner()
    path = tmp_path / "size.json"
    args = ["--model", "qwen3.5-27b", "--workload", "rl-rollout", "--space", "small", "--target-throughput", "12000"]
    result = runner.invoke(app, ["size", *args, "--rollout-prompts", "4096", "--json", str(path), "--replay-requests", "100"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())  # rich wraps to the terminal's width
    assert "Sizing for >= 12,000 output tokens/s" in text and "at half this throughput it takes 2x longer" in text
    payload = json.loads(path.read_text())
    assert {e["gpu"] for e in payload["per_gpu"]} == {"h100_sxm", "h200_sxm"}
    # The picks are replayed (the table's replay column, a line saying which meet the workload) and a
    # batch job's wall time goes by the replayed throughput.
    assert "replay tok/s" in text and ("meet the workload" in text or "meets the workload" in text or "replayed: " in text)
    for entry in payload["per_gpu"]:
        r = entry["smallest"]
        assert r["replay_requests"] == 100 and isinstance(r["replay_shortfalls"], list)
        assert r["rollout_s"] == pytest.approx(4096 * WORKLOAD.osl_mean_tokens / r["replay_output_tokens_per_s"])
    unreplayed = runner.invoke(app, ["size", *args, "--no-replay"])
    assert unreplayed.exit_code == 0 and "replay tok/s" not in " ".join(unreplayed.stdout.split())
    sweep = runner.invoke(app, ["sweep", *args, "--no-replay"])
    assert sweep.exit_code == 0, sweep.output
    assert "Sizing for >= 12,000 output tokens/s" in " ".join(sweep.stdout.split())
    bad = runner.invoke(app, ["size", "--workload", "coding", "--space", "small"])
    assert bad.exit_code == 1 and "no throughput target" in bad.output


def test_picks_with_unmeasured_layout_parts_are_named():
    """Lock-step data parallelism and pipeline parallelism, which no measured run here checks (or only
    under vLLM 0.8.3), get a line naming the picks that use them; a plain TP pick gets none."""
    from jaxplan.layout_kind import kind_fields
    from jaxplan.sizing import Choice, Sizing, unmeasured_notes

    def row(tp, pp, kind, dp):
        return {"tensor_parallel_size": tp, "pipeline_parallel_size": pp, **kind_fields(kind, dp, "fp8", True), "digits": [tp, pp, kind, dp]}

    lockstep, piped, plain = row(1, 1, "dp:4", 2), row(2, 2, "tp", 1), row(4, 1, "tp", 1)
    sizing = Sizing(1000.0, 100.0, [Choice("h100_sxm", lockstep, piped, 3), Choice("b200_sxm", plain, plain, 1)], [])
    lock_line, pipe_line = unmeasured_notes(sizing)
    assert lock_line.startswith("h100_sxm 2x(TP1xPP1 DP4-lockstep): vLLM's lock-step data parallelism") and "docs/moe.md" in lock_line
    assert pipe_line.startswith("h100_sxm TP2xPP2") and "vLLM 0.8.3" in pipe_line and "b200_sxm" not in lock_line + pipe_line
    assert unmeasured_notes(Sizing(1000.0, 100.0, [Choice("b200_sxm", plain, plain, 1)], [])) == []


def test_picks_whose_kv_cache_bounds_the_batch_are_named():
    """Stage 4 bounds a pick's batch by its KV cache: vLLM preempts there, which stage 4 does not price; one line names those picks."""
    from jaxplan.physics.steady_state import BOUND_DEMAND, BOUND_KV_CACHE, BOUND_MAX_NUM_SEQS
    from jaxplan.sizing import Choice, Sizing, unmeasured_notes

    def row(tp, bound):
        return {"tensor_parallel_size": tp, "pipeline_parallel_size": 1, "data_parallel_size": 1, "bound": bound, "digits": [tp, bound]}

    starved, seqs, demand = row(1, BOUND_KV_CACHE), row(2, BOUND_MAX_NUM_SEQS), row(4, BOUND_DEMAND)
    (line,) = unmeasured_notes(Sizing(1000.0, 100.0, [Choice("h100_sxm", starved, seqs, 2), Choice("b200_sxm", demand, demand, 1)], []))
    assert line.startswith("h100_sxm TP1xPP1xDP1: the KV cache bounds the batch, so vLLM preempts") and "TP2" not in line and "b200_sxm" not in line
    assert line.endswith("the replay (without --no-replay) counts them; measure before committing.")
    assert unmeasured_notes(Sizing(1000.0, 100.0, [Choice("h100_sxm", seqs, demand, 2)], [])) == []


def test_replayed_picks_are_said_to_meet_the_workload_or_what_they_miss():
    from jaxplan.sizing import Choice, Sizing, replay_notes

    def row(tp, shortfalls):
        return {"tensor_parallel_size": tp, "pipeline_parallel_size": 1, "data_parallel_size": 1, "digits": [tp], "replay_shortfalls": shortfalls}

    ok, short = row(1, []), row(2, ["5,752 output tok/s < target 5,800"])
    met, missed = replay_notes(Sizing(1000.0, 100.0, [Choice("h100_sxm", ok, short, 2)], []))
    assert met == "replayed step by step, h100_sxm TP1xPP1xDP1 meets the workload"
    assert missed.startswith("h100_sxm TP2xPP1xDP1 (cheapest per token), replayed: 5,752 output tok/s < target 5,800; ")
    unreplayed = {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "data_parallel_size": 1, "digits": [1]}
    assert replay_notes(Sizing(1000.0, 100.0, [Choice("h100_sxm", unreplayed, unreplayed, 1)], [])) == []
    # Under Poisson traffic (a finite sustained rate: the queue verdict ran) the line says what "meets" means.
    poisson = {**ok, "replay_sustained_output_tokens_per_s": 950.0}
    (line,) = replay_notes(Sizing(1000.0, 100.0, [Choice("h100_sxm", poisson, poisson, 1)], []))
    assert line.endswith("meets the workload (keeping up with the requests sent; the replay tok/s column counts the run's ramp and drain too)")


def test_picks_replayed_with_the_finalists_are_not_replayed_again(sized, monkeypatch):
    """`replay_picks` takes a pick the sweep's stage 7 replayed from there and replays only the others."""
    from jaxplan.funnel import replay_stage
    from jaxplan.sizing import replay_picks

    result, sizing = sized
    calls = []
    monkeypatch.setattr(replay_stage, "replay_rows", lambda res, rows, **k: calls.append([r["digits"] for r in rows]) or
                        [{**r, "replay_output_tokens_per_s": 1.0, "replay_ttft_p99_s": 0.0, "replay_tpot_p99_s": 0.0, "replay_unfinished": 0} for r in rows])
    first = sizing.per_gpu[0].smallest
    done = {**first, "replay_output_tokens_per_s": 2.0, "replay_ttft_p99_s": 0.0, "replay_tpot_p99_s": 0.0, "replay_unfinished": 0}
    replayed = replay_picks(sizing, result, [done])
    picks = {tuple(r["digits"]) for c in sizing.per_gpu for _, r in c.picks}
    assert len(calls) == 1 and tuple(first["digits"]) not in {tuple(d) for d in calls[0]} and len(calls[0]) == len(picks) - 1
    assert replayed.per_gpu[0].smallest["replay_output_tokens_per_s"] == 2.0
    assert all(r["replay_output_tokens_per_s"] in (1.0, 2.0) and "replay_shortfalls" in r for c in replayed.per_gpu for _, r in c.picks)
