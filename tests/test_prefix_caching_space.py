"""A search space for servers run without vLLM's prefix cache (`enable_prefix_caching = false`): the
replay recomputes a preempted request whole, the serve line says `--no-enable-prefix-caching`, and a
workload that counts on prefix hits is refused."""

import shlex

import pytest

from jaxplan.errors import PlanError
from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list


@pytest.fixture(scope="module")
def results():
    from jaxplan.funnel import run_sweep

    import dataclasses

    space = load_space("small")
    model, gpus = load_model("llama-3.1-8b"), parse_gpu_list("h200_sxm")
    workload = dataclasses.replace(load_workload("chat"), prefix_hit_rate=0.0)  # chat counts 20% prefix hits
    return {caching: run_sweep(model, gpus, workload, space.replace(enable_prefix_caching=caching), top_k=3) for caching in (True, False)}


def test_the_space_decides_the_replay_and_the_serve_line(results):
    from jaxplan.funnel.replay_stage import finalist_inputs
    from jaxplan.report.vllm_command import serve_lines

    for caching, result in results.items():
        configs, _ = finalist_inputs(result, result.shortlist)
        assert configs.prefix_caching is caching
        command = shlex.split(serve_lines(result.model, result.shortlist[0], enable_prefix_caching=result.grid.space.enable_prefix_caching)[0].command)
        assert ("--no-enable-prefix-caching" in command) is not caching


def test_a_prefix_hit_rate_needs_the_cache():
    from jaxplan.funnel import run_sweep

    import dataclasses

    workload = dataclasses.replace(load_workload("chat"), prefix_hit_rate=0.5)
    with pytest.raises(PlanError, match="prefix_hit_rate = 0.5 needs vLLM's prefix cache.*enable_prefix_caching = false"):
        run_sweep(load_model("llama-3.1-8b"), parse_gpu_list("h200_sxm"), workload, load_space("small").replace(enable_prefix_caching=False), top_k=3)
    with pytest.raises(PlanError, match="enable_prefix_caching"):
        load_space("small").replace(enable_prefix_caching="no")


def test_the_command_line_flag_reaches_the_winners_line():
    """`--no-enable-prefix-caching`, vLLM's flag, overrides the space; against a workload counting
    prefix hits it is a one-line error and a non-zero exit."""
    from typer.testing import CliRunner

    from jaxplan.cli import app

    common = ["sweep", "--model", "llama-3.1-8b", "--gpus", "h200_sxm", "--space", "small", "--top", "3", "--no-replay"]
    result = CliRunner().invoke(app, [*common, "--workload", "coding", "--no-enable-prefix-caching"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    winner = next(line for line in result.output.splitlines() if line.startswith("Winner:"))
    assert "--no-enable-prefix-caching" in result.output.split("Winner:")[1].split("\n\n")[0], winner
    default = CliRunner().invoke(app, [*common, "--workload", "coding"], env={"COLUMNS": "250"})
    assert default.exit_code == 0 and "--no-enable-prefix-caching" not in default.output
    refused = CliRunner().invoke(app, [*common, "--workload", "chat", "--no-enable-prefix-caching"], env={"COLUMNS": "250"})
    assert refused.exit_code != 0 and "prefix_hit_rate = 0.2 needs vLLM's prefix cache" in refused.output
    assert "Traceback" not in refused.output
