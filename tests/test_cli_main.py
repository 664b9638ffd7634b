"""The installed entry point (`jaxplan.cli.main`): usage errors are one line on stderr, not typer's box."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

MAIN = [sys.executable, "-c", "from jaxplan.cli import main; main()"]
# This checkout's jaxplan, whichever one the interpreter has installed.
ENV = {"JAXPLAN_CACHE_DIR": "off", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


@pytest.mark.parametrize(
    "args, code, says",
    [
        (["sweep", "--model", "llama-3.1-70b", "--gpus", "h200_sxm", "--budget", "0"], 1, "'--budget'"),  # usage errors are bad input: 1, like the rest
        (["sweep", "--bogus"], 1, "--bogus"),
        (["frobnicate"], 1, "frobnicate"),
        (["sweep", "--model", "no-such-model", "--gpus", "h200_sxm", "--no-replay"], 1, "no-such-model"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(args, code, says, tmp_path):
    run = subprocess.run(MAIN + args, capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path)
    assert run.returncode == code, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], run.stderr
    assert "Traceback" not in run.stderr and "╭" not in run.stderr and run.stdout == ""


def test_help_exits_zero(tmp_path):
    run = subprocess.run(MAIN + ["sweep", "--help"], capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path)
    assert run.returncode == 0 and "--model" in run.stdout
