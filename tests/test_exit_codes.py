"""Each exit code of the scheme in `jaxplan.cli.exit_codes`, produced by a real invocation.

0 ran, 1 bad input (a usage error included), 2 nothing survived the funnel, 3 stopped or refused by
--max-seconds, 70 a bug. Each case checks the code and that stderr holds one `error:` line (the
empty-result explanation for 2 from sweep and size, which print it without the prefix).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxplan.cli import app
from jaxplan.cli.exit_codes import EPILOG, ExitCode

MAIN = [sys.executable, "-c", "from jaxplan.cli import main; main()"]
ENV = {"JAXPLAN_CACHE_DIR": "off", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # this checkout's jaxplan
# NVFP4 weights on H100 (no FP4 tensor cores): stage 1 removes every candidate, so the funnel is empty.
EMPTY = ["--gpus", "h100_sxm", "--space", "small", "--weight-dtypes", "nvfp4"]
COMMANDS = ("sweep", "sensitivity", "size", "report", "predict", "simulate", "calibrate", "list")


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    return CliRunner()


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def test_codes_are_distinct_and_each_is_in_every_commands_help(runner):
    assert len(set(ExitCode)) == len(ExitCode.__members__)  # no alias: each code means one thing
    assert [int(c) for c in (ExitCode.OK, ExitCode.BAD_INPUT, ExitCode.NOTHING_SURVIVED, ExitCode.TIME_LIMIT, ExitCode.INTERNAL_ERROR)] == [0, 1, 2, 3, 70]
    for code in (0, 1, 2, 3, 70):
        assert f" {code} " in EPILOG
    for command in (*COMMANDS, None):
        result = runner.invoke(app, [command, "--help"] if command else ["--help"])
        assert result.exit_code == ExitCode.OK, (command, result.output)
        text = " ".join(result.stdout.replace("│", " ").split())  # rich wraps the epilog; compare its words
        assert " ".join(EPILOG.split()) in text, (command, text[-500:])


def test_success_is_0(runner):
    result = runner.invoke(app, ["list"])
    assert result.exit_code == ExitCode.OK and "llama-3.1-8b" in result.stdout, result.output


def test_bad_input_is_1(runner):
    result = runner.invoke(app, ["sweep", "--model", "no-such-model", "--gpus", "h100_sxm", "--no-replay"])
    assert result.exit_code == ExitCode.BAD_INPUT
    assert stderr_lines(result)[0].startswith("error: unknown model 'no-such-model'"), result.stderr


@pytest.mark.parametrize("args", [["sweep", "--bogus"], ["sweep", "--budget", "0"], ["frobnicate"], ["predict"]])
def test_usage_error_is_1_and_one_line(runner, args):
    """Unknown option, an out-of-range value, unknown command, missing argument: bad input like any
    other (1), one line naming the command's --help, not click's box and its exit 2."""
    result = runner.invoke(app, args)
    lines = stderr_lines(result)
    assert result.exit_code == ExitCode.BAD_INPUT, result.output
    assert len(lines) == 1 and lines[0].startswith("error: ") and "--help')" in lines[0], result.stderr
    assert "╭" not in result.output and result.stdout == ""


def test_usage_error_is_1_through_the_entry_point(tmp_path):
    run = subprocess.run([*MAIN, "sweep", "--bogus"], capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path)
    assert run.returncode == ExitCode.BAD_INPUT, run.stderr
    assert run.stderr.startswith("error: No such option: --bogus") and run.stderr.count("\n") == 1 and run.stdout == ""


def test_no_arguments_is_the_help_and_0(runner):
    result = runner.invoke(app, [])
    assert result.exit_code == ExitCode.OK and "sweep" in result.stdout and result.stderr == "", result.output


@pytest.mark.parametrize("command", [["sweep", "--no-replay"], ["size", "--target-throughput", "1000"], ["report", "--no-replay"], ["sensitivity"]])
def test_nothing_survived_is_2(runner, tmp_path, command):
    """An empty funnel is a valid answer to a valid question: 2 from every command that sweeps, with
    the one-line explanation (stage 1, the FP4 sieve)."""
    if command[0] == "report":
        command = [*command, "-o", str(tmp_path / "r.html")]
    result = runner.invoke(app, [*command, *EMPTY])
    assert result.exit_code == ExitCode.NOTHING_SURVIVED, result.output
    explanation = [line.removeprefix("error: ") for line in stderr_lines(result) if "no configuration survived" in line]
    assert len(explanation) == 1 and "stage 1 (structure)" in explanation[0], result.stderr
    assert not (tmp_path / "r.html").exists()


def test_refused_up_front_by_max_seconds_is_3(runner, monkeypatch):
    """The estimate exceeds --max-seconds: refused before anything is built, exit 3."""
    from jaxplan.funnel import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "build_context", lambda *a, **k: pytest.fail("the sweep started"))
    result = runner.invoke(app, ["sweep", "--no-replay", "--space", "huge", "--max-seconds", "1"])
    lines = stderr_lines(result)
    assert result.exit_code == ExitCode.TIME_LIMIT, result.output
    assert len(lines) == 1 and lines[0].startswith("error: refusing the sweep") and "--max-seconds = 1" in lines[0]


def test_stopped_by_max_seconds_is_3(runner, tmp_path, monkeypatch):
    """A replay whose measured pace passes --max-seconds is stopped: exit 3; with room it finishes (0)."""
    from jaxplan.replay import driver

    monkeypatch.setattr(driver, "PROGRESS_FIRST_ITERATIONS", 1)  # the first report comes before the end
    csv = tmp_path / "rows.csv"
    csv.write_text("model,gpu,tensor_parallel_size,isl,osl,concurrency,num_prompts\nllama-3.1-8b,h100_sxm,1,100,200,1,50\n")
    result = runner.invoke(app, ["simulate", str(csv), "--max-seconds", "0.001"])
    lines = stderr_lines(result)
    assert result.exit_code == ExitCode.TIME_LIMIT, result.output
    assert len(lines) == 1 and lines[0].startswith("error: stopped the replay"), result.stderr


def test_internal_error_is_70(runner, monkeypatch):
    """An exception that is not bad input is a bug: one line asking for a report, exit 70."""
    import jaxplan.specs

    def broken(kind):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(jaxplan.specs, "known", broken)
    monkeypatch.delenv("JAXPLAN_DEBUG", raising=False)
    result = runner.invoke(app, ["list"])
    lines = stderr_lines(result)
    assert result.exit_code == ExitCode.INTERNAL_ERROR, result.output
    assert len(lines) == 1 and lines[0].startswith("internal error") and "ZeroDivisionError: planted" in lines[0]


def test_the_library_tells_a_time_limit_from_bad_input():
    """Deadline raises TimeLimitExceeded (a PlanError, so callers catching PlanError still do), and a
    bad --max-seconds value is plain bad input."""
    from jaxplan.cli.exit_codes import exit_code_for
    from jaxplan.deadline import Deadline, check_limit
    from jaxplan.errors import NothingSurvived, PlanError, TimeLimitExceeded

    clock = iter([0.0, 0.0, 10.0]).__next__  # start, first report, second report
    deadline = Deadline(1.0, clock=clock)
    deadline(1, 100)
    with pytest.raises(TimeLimitExceeded, match="beyond --max-seconds = 1") as stopped:
        deadline(2, 100)
    assert isinstance(stopped.value, PlanError) and exit_code_for(stopped.value) == ExitCode.TIME_LIMIT
    with pytest.raises(PlanError) as bad:
        check_limit(-1.0)
    assert exit_code_for(bad.value) == ExitCode.BAD_INPUT
    assert exit_code_for(NothingSurvived("no configuration survived")) == ExitCode.NOTHING_SURVIVED
