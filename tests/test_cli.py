"""The `jaxplan` command line through typer's CliRunner (in process, like a user's shell)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from jaxplan.cli import app
from jaxplan.funnel.reasons import Reason
from jaxplan.specs import known

# --no-replay: stage 7 (the step-by-step replay) has its own tests; these cover the funnel's CLI.
SMALL = ["sweep", "--space", "small", "--no-replay"]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture(scope="module")
def small_sweep(runner, tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "sweep.json"
    result = runner.invoke(app, [*SMALL, "--json", str(path)])
    return result, path


def test_sweep_prints_funnel_top_rows_and_vllm_command(small_sweep):
    result, _ = small_sweep
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "Funnel over 1,536 candidates" in out  # small space: 768 per GPU type x (h100, h200)
    for stage in ("1 structure", "2 memory", "3 capacity", "4 estimate", "5 frontier", "6 shortlist"):
        assert stage in out
    assert "Top " in out and "configurations" in out
    winner = [line for line in out.splitlines() if line.startswith("Winner:")]
    assert len(winner) == 1
    assert "vllm serve meta-llama/Llama-3.1-70B" in winner[0] and "--tensor-parallel-size" in winner[0]
    assert "GPU KV cache size: ~" in out  # the check line under the winner
    assert "Traceback" not in result.output


def strict_json(text: str):
    """JSON as parsers other than Python's read it: no Infinity or NaN."""

    def refuse(constant):
        raise ValueError(f"non-standard JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_json_files_write_null_for_infinity():
    """Found by an audit: a burst workload's request rate and unbounded SLOs were written as `Infinity`,
    which jq and JavaScript reject. Every --json file goes through `json_text`."""
    from jaxplan.cli.common import json_text
    from jaxplan.specs import load_workload

    workload = load_workload("rl-rollout")
    assert workload.request_rate_per_s == float("inf")  # the bundled burst
    parsed = strict_json(json_text({"workload": workload, "values": [1.5, float("nan"), float("-inf")], "nested": {"x": float("inf")}}))
    assert parsed["workload"]["request_rate_per_s"] is None and parsed["workload"]["name"] == "rl-rollout"
    assert parsed["values"] == [1.5, None, None] and parsed["nested"] == {"x": None}


def test_sweep_json_is_complete(small_sweep):
    result, path = small_sweep
    assert result.exit_code == 0
    report = strict_json(path.read_text())
    assert report["grid_size"] == 1536
    assert [s["stage"] for s in report["funnel"]] == [1, 2, 3, 4, 5, 6]
    assert report["shortlist"] and report["winner"]
    # The winner is the first of the shortlist (or of the replay's re-ranking, when one ran).
    assert report["winner"]["digits"] == report["shortlist"][0]["digits"]
    serve = report["winner"]["vllm_serve"]
    assert serve.startswith("vllm serve ") and f"--tensor-parallel-size {report['winner']['tensor_parallel_size']}" in serve
    # What to check in the started server's log: the winner's KV blocks x the space's block size.
    tokens = report["winner"]["kv_blocks_per_replica"] * report["space"]["block_size_tokens"]
    assert f"GPU KV cache size: ~{tokens:,} tokens" in report["winner"]["kv_cache_check"]
    # Funnel counts add up: every candidate is admitted or rejected by exactly one of stages 1-4.
    stages = {s["stage"]: s for s in report["funnel"]}
    assert sum(stages[k]["rejected"] for k in (1, 2, 3, 4)) + stages[4]["admitted"] == report["grid_size"]
    assert report["empty_explanation"] is None


@pytest.mark.parametrize(
    ("option", "value", "closest"),
    [("--model", "llama-3.1-7b", "llama-3.1-70b"), ("--gpus", "h100_sx", "h100_sxm"), ("--workload", "codin", "coding"), ("--space", "smal", "small")],
)
def test_unknown_names_exit_1_with_one_line(runner, option, value, closest):
    result = runner.invoke(app, [*SMALL, option, value])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)  # exited cleanly, not raised
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:") and value in lines[0]
    assert f"Did you mean '{closest}'?" in lines[0]
    assert result.stdout == ""  # nothing was swept


def test_empty_result_exits_2_and_explains(runner):
    result = runner.invoke(app, ["sweep", "--model", "deepseek-v3", "--space", "small", "--budget", "1", "--workload", "chat", "--no-replay"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    explanation = [line for line in result.stderr.splitlines() if line.startswith("no configuration survived")]
    assert len(explanation) == 1, result.stderr
    assert "stage 2 (memory)" in explanation[0]
    assert Reason.WEIGHTS_DONT_FIT.fix in explanation[0]
    assert "Winner:" not in result.stdout


def test_nvfp4_on_hopper_empties_the_funnel_at_stage_1_and_says_so(runner):
    """--weight-dtypes replaces the space's weight_dtype: NVFP4 alone on H100 (no FP4 tensor cores)
    leaves nothing, and the explanation names the FP4 sieve and what to relax (exit code 2)."""
    result = runner.invoke(app, ["sweep", "--gpus", "h100_sxm", "--space", "small", "--weight-dtypes", "nvfp4", "--no-replay"])
    assert result.exit_code == 2, result.output
    explanation = [line for line in result.stderr.splitlines() if line.startswith("no configuration survived")]
    assert len(explanation) == 1 and "stage 1 (structure)" in explanation[0]
    assert Reason.FP4_UNSUPPORTED.fix in explanation[0]


@pytest.mark.parametrize(("option", "value", "fragment"), [
    ("--weight-dtypes", "fp16,fp8", "'fp16' is not one of them"),
    ("--weight-dtypes", "fp8,fp8", "at most once"),
    ("--kv-cache-dtypes", " , ", "at least one"),
])
def test_bad_dtype_lists_exit_1_with_one_line(runner, option, value, fragment):
    result = runner.invoke(app, [*SMALL, option, value])
    assert result.exit_code == 1 and result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and option in lines[0] and fragment in lines[0], result.stderr


def test_list_names_every_bundled_spec(runner):
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    for kind, prefix in (("models", "model"), ("gpus", "gpu"), ("workloads", "workload"), ("spaces", "space")):
        for name in known(kind):
            assert any(line.startswith(prefix) and name in line for line in result.stdout.splitlines()), name
    assert "small: 768 candidates per GPU type" in result.stdout


def test_json_in_a_missing_directory_fails_before_the_sweep(runner, tmp_path):
    res = runner.invoke(app, ["sweep", "--space", "small", "--gpus", "h100_sxm", "--no-replay", "--json", str(tmp_path / "no" / "x.json")])
    assert res.exit_code == 1
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "--json" in lines[0] and "does not exist" in lines[0]


def test_simulate_routes_least_loaded_on_request(runner, tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text(
        "model,gpu,tensor_parallel_size,pipeline_parallel_size,data_parallel_size,weight_dtype,kv_cache_dtype,isl,osl,request_rate,num_prompts\n"
        "llama-3.1-8b,h100_sxm,1,1,2,bf16,auto,512,64,40,200\n"
    )
    results = {}
    for routing in ("round_robin", "least_loaded"):
        out = tmp_path / f"{routing}.csv"
        res = runner.invoke(app, ["simulate", str(csv), "-o", str(out), "--routing", routing])
        assert res.exit_code == 0, res.output
        results[routing] = out.read_text()
    assert results["round_robin"] != results["least_loaded"]  # the option reaches the replay
    res = runner.invoke(app, ["simulate", str(csv), "--routing", "random"])
    assert res.exit_code != 0


def test_max_seconds_stops_a_long_replay_with_one_line(runner, tmp_path, monkeypatch):
    """predict, simulate and sweep's stage 7 stop a replay past --max-seconds: exit 3 and one line
    naming the job, the limit and the fix. The same predict with room finishes."""
    from jaxplan.funnel import budget
    from jaxplan.replay import driver

    monkeypatch.setattr(driver, "PROGRESS_FIRST_ITERATIONS", 1)  # the first report comes before the end
    csv = tmp_path / "rows.csv"
    csv.write_text("model,gpu,tensor_parallel_size,isl,osl,concurrency,num_prompts\nllama-3.1-8b,h100_sxm,1,100,200,1,50\n")
    for command in (["predict", str(csv), "-o", str(tmp_path / "out.csv")], ["simulate", str(csv)]):
        res = runner.invoke(app, [*command, "--max-seconds", "0.001"])
        lines = [line for line in res.output.splitlines() if line.strip()]
        assert res.exit_code == 3 and len(lines) == 1, res.output
        assert lines[0].startswith(f"error: stopped the replay of {csv} row 1 (50 requests) after "), lines[0]
        assert "output tokens, beyond --max-seconds = 0.001; replay fewer requests" in lines[0] and lines[0].endswith("or raise --max-seconds")
    res = runner.invoke(app, ["predict", str(csv), "-o", str(tmp_path / "out.csv"), "--max-seconds", "600"])
    assert res.exit_code == 0, res.output
    monkeypatch.setattr(budget, "COMPILE_S", 0.0)  # the sweep's up-front estimate would refuse 1 s
    res = runner.invoke(app, [*SMALL[:-1], "--top", "2", "--replay-requests", "20000", "--max-seconds", "1"])  # SMALL's funnel: compiled already
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 3 and lines[-1].startswith("error: stopped stage 7 (the replay of 2 finalists x 20,000 requests) after "), res.output
    assert "use fewer --replay-requests, a smaller --top or --no-replay, or raise --max-seconds" in lines[-1]
    res = runner.invoke(app, ["report", "-o", str(tmp_path / "r.html"), "--space", "small", "--top", "2", "--replay-requests", "20000", "--max-seconds", "1"])
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert res.exit_code == 3 and lines[-1].startswith("error: stopped stage 7 (the replay of 2 finalists x 20,000 requests) after "), res.output
    assert not (tmp_path / "r.html").exists()


def test_predict_measured_vllm_bench_runs(runner, tmp_path):
    """`jaxplan predict runs.json`: a `vllm bench serve --save-result` file's run predicted next to its
    measured columns, its missing engine settings named on the command line (vLLM's argument names),
    and those options refused for a CSV, which states them in its columns."""
    import csv

    record = {
        "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B-Instruct", "num_prompts": 64, "request_rate": "inf", "max_concurrency": 8,
        "completed": 64, "failed": 0, "total_input_tokens": 64 * 1000, "total_output_tokens": 64 * 200,
        "output_throughput": 900.0, "mean_ttft_ms": 60.0, "mean_tpot_ms": 8.5,
    }  # fmt: skip
    path, out_path = tmp_path / "run.json", tmp_path / "out.csv"
    path.write_text(json.dumps(record))
    result = runner.invoke(app, ["predict", str(path), "-o", str(out_path), "--method", "analytical"])
    assert result.exit_code == 1 and "gpu missing" in result.output and "--gpu" in result.output
    args = ["predict", str(path), "-o", str(out_path), "--method", "analytical", "--gpu", "h100_sxm", "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (row,) = list(csv.DictReader(out_path.open()))
    assert (row["model"], row["gpu"], row["tensor_parallel_size"], row["kv_cache_dtype"], row["concurrency"]) == ("llama-3.1-8b", "h100_sxm", "2", "fp8", "8")
    assert float(row["measured_ttft_ms_mean"]) == 60.0 and float(row["measured_tpot_ms_mean"]) == 8.5
    assert 0 < float(row["tpot_ms_mean"]) < 100 and row["status"].startswith("ok")
    moe = tmp_path / "moe.json"  # a MoE run's expert parallelism, named on the command line
    moe.write_text(json.dumps(dict(record, model_id="MiniMaxAI/MiniMax-M2.5")))
    result = runner.invoke(app, ["predict", str(moe), "-o", str(out_path), "--method", "analytical", "--gpu", "h200_sxm", "--tensor-parallel-size", "4", "--enable-expert-parallel"])
    assert result.exit_code == 0, result.output
    (row,) = list(csv.DictReader(out_path.open()))
    assert (row["model"], row["weight_dtype"], row["enable_expert_parallel"]) == ("minimax-m2.5", "fp8", "true")
    result = runner.invoke(app, [*args, "--enable-expert-parallel"])  # a dense model's run: the option is named in the refusal
    assert result.exit_code == 1 and "llama-3.1-8b is dense" in result.output and "--enable-expert-parallel" in result.output, result.output
    rows_csv = tmp_path / "rows.csv"
    rows_csv.write_text("model,gpu,tensor_parallel_size,isl,osl,concurrency\nllama-3.1-8b,h100_sxm,1,1000,200,8\n")
    result = runner.invoke(app, ["predict", str(rows_csv), "-o", str(out_path), "--gpu", "h100_sxm"])
    assert result.exit_code == 1 and "--gpu" in result.output and ".json" in result.output


def test_a_zero_throughput_target_is_refused_before_the_sweep(runner):
    """Found by an audit: --target-throughput 0 (the option allowed it) swept, printed the winner, then
    failed in the sizing with exit 1 and no JSON; `size` called the workload's own target missing."""
    for args in (SMALL, ["size", "--space", "small"]):
        command = args[0]
        result = runner.invoke(app, [*args, "--target-throughput", "0"])
        assert result.exit_code == 1, (command, result.output)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "--target-throughput = 0" in lines[0] and "must be > 0" in lines[0], lines
        assert result.stdout == ""  # nothing was swept


def test_sensitivity_and_its_winner_map_take_params(runner, tmp_path):
    """Found by an audit: `sensitivity` had no --params (the README said it takes the sweep's options),
    and `report --winner-map` mapped with the bundled parameters whatever --params said."""
    mine = tmp_path / "mine.toml"
    mine.write_text("[gpu.h100]\ngemm_flops_efficiency = 0.2\n")  # no table for the GPU swept: refused, so it was read
    for extra in ([], ["--winner-map", "isl=1000,2000"]):
        result = runner.invoke(app, ["sensitivity", "--space", "small", "--params", str(mine), *extra])
        assert result.exit_code == 1 and "no [gpu.h100_sxm] table" in result.stderr, (extra, result.output)
