"""Which parameters file a command reads, and where `jaxplan calibrate` writes: a user's fit goes to the
user's config directory (never the bundled file, which only the maintainers' --write-bundled writes), and
is read where --params or $JAXPLAN_PARAMS selects it (--params first); a bad $JAXPLAN_PARAMS is one line."""

from __future__ import annotations

import csv
import hashlib
import os
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jaxplan.errors import PlanError
from jaxplan.physics.params import DEFAULTS, PARAMS_ENV, PARAMS_PATH, efficiency_for, load_efficiency, user_params_path

REPO = Path(__file__).resolve().parent.parent
HEADER = "model,gpu,tensor_parallel_size,isl,osl,concurrency"
MEASURED = f"{HEADER},measured_ttft_ms_mean,measured_tpot_ms_mean\nllama-3.1-8b,h100_sxm,1,1024,256,16,80,11\n"
# Half the bundled HBM fraction: a decode step streams the weights at half the speed, so TPOT rises.
SLOW_HBM = 0.4


def bundled_digest() -> str:
    return hashlib.sha256(PARAMS_PATH.read_bytes()).hexdigest()


def stderr_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


@pytest.fixture
def fake_fit(monkeypatch):
    """`run.calibrate` replaced by a fit that returns DEFAULTS with a marker value for the GPUs of the
    rows (the real optax fit is covered by test_calibrate_*); write_params and the CLI run as shipped."""
    from jaxplan.calibrate import run

    def fake(rows, **kwargs):
        gpus = sorted({r["gpu"] for r in rows})
        return {g: {**DEFAULTS, "gemm_flops_efficiency": 0.123} for g in gpus}, {
            "seconds": 0.0, "fit_backend": run.FIT_BACKEND, "fit_rows": len(rows), "fit_rows_kv_fits": len(rows)}

    monkeypatch.setattr(run, "calibrate", fake)


@pytest.fixture
def measured(tmp_path) -> Path:
    path = tmp_path / "mine.csv"
    path.write_text(MEASURED)
    return path


def invoke(args, env=None):
    from jaxplan.cli import app

    return CliRunner().invoke(app, args, env=env)


def test_the_user_file_is_under_xdg_config_home_else_dot_config(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert user_params_path() == tmp_path / "cfg" / "jaxplan" / "params.toml"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for unset in ("", "relative/dir"):  # the XDG rule: empty or relative is ignored
        monkeypatch.setenv("XDG_CONFIG_HOME", unset)
        assert user_params_path() == tmp_path / "home" / ".config" / "jaxplan" / "params.toml"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert user_params_path() == tmp_path / "home" / ".config" / "jaxplan" / "params.toml"


def test_calibrate_without_o_writes_the_users_file_and_says_how_to_select_it(monkeypatch, tmp_path, fake_fit, measured):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))  # not there yet: calibrate makes it
    before = bundled_digest()
    result = invoke(["calibrate", str(measured), "--no-shared-data", "--no-replay-check"])
    assert result.exit_code == 0, result.output
    target = tmp_path / "cfg" / "jaxplan" / "params.toml"
    assert tomllib.loads(target.read_text())["gpu"]["h100_sxm"]["gemm_flops_efficiency"] == 0.123
    assert bundled_digest() == before
    assert f"wrote {target}" in result.stdout
    assert f"--params {target}" in result.stdout and f"export JAXPLAN_PARAMS={target}" in result.stdout
    # What it says to run works: the marker value is what the library then reads.
    monkeypatch.setenv(PARAMS_ENV, str(target))
    assert efficiency_for(["h100_sxm"])["h100_sxm"]["gemm_flops_efficiency"] == 0.123


@pytest.mark.parametrize("spelling", ["absolute", "relative", "link"])
def test_calibrate_refuses_to_write_over_the_bundled_file(monkeypatch, tmp_path, fake_fit, measured, spelling):
    if spelling == "relative":
        monkeypatch.chdir(PARAMS_PATH.parent)
        target = Path(PARAMS_PATH.name)
    elif spelling == "link":
        target = tmp_path / "link.toml"
        target.symlink_to(PARAMS_PATH)
    else:
        target = PARAMS_PATH
    before = bundled_digest()
    result = invoke(["calibrate", str(measured), "--no-shared-data", "--no-replay-check", "-o", str(target)])
    assert result.exit_code == 1
    lines = stderr_lines(result)
    assert len(lines) == 1 and f"-o {target}" in lines[0] and "ships with jaxplan" in lines[0], lines
    assert "omit -o" in lines[0] and "--params" in lines[0] and PARAMS_ENV in lines[0]
    assert bundled_digest() == before


def test_the_maintainers_write_the_bundled_file_with_write_bundled(monkeypatch, tmp_path, fake_fit, measured):
    from jaxplan.calibrate import run

    assert run.output_path(None, write_bundled=True) == PARAMS_PATH
    assert run.output_path(PARAMS_PATH, write_bundled=True) == PARAMS_PATH
    with pytest.raises(PlanError, match=r"-o = .*elsewhere.toml.*--write-bundled writes the bundled parameter file"):
        run.output_path(tmp_path / "elsewhere.toml", write_bundled=True)
    written = []
    monkeypatch.setattr(run, "write_params", lambda params, path, *a, **k: written.append(path))  # the real file stays as shipped
    result = invoke(["calibrate", str(measured), "--no-shared-data", "--no-replay-check", "--write-bundled"])
    assert result.exit_code == 0, result.output
    assert written == [PARAMS_PATH] and "export JAXPLAN_PARAMS" not in result.stdout
    assert "--write-bundled" not in invoke(["calibrate", "--help"]).stdout  # hidden: docs/calibration.md has it


def write_params_file(path: Path, hbm: float, gpu: str = "h100_sxm") -> Path:
    path.write_text(f"[gpu.{gpu}]\nmemory_bandwidth_efficiency = {hbm}\n")
    return path


def predicted_tpot(tmp_path: Path, name: str, extra=(), env=None):
    rows = tmp_path / "rows.csv"
    rows.write_text(f"{HEADER}\nllama-3.1-8b,h100_sxm,1,1024,256,1\n")
    out = tmp_path / f"{name}.csv"
    result = invoke(["predict", str(rows), "--method", "analytical", "-o", str(out), *extra], env=env)
    assert result.exit_code == 0, result.output
    with open(out, newline="") as handle:
        return float(next(csv.DictReader(handle))["tpot_ms_mean"]), result


def test_predict_reads_the_file_jaxplan_params_names_and_params_wins(tmp_path):
    slow = write_params_file(tmp_path / "slow.toml", SLOW_HBM)
    bundled_tpot, result = predicted_tpot(tmp_path, "bundled", env={PARAMS_ENV: ""})  # empty: the bundled file
    assert "parameters:" not in result.stderr
    env_tpot, result = predicted_tpot(tmp_path, "env", env={PARAMS_ENV: str(slow)})
    assert stderr_lines(result) == [f"parameters: {slow} (from ${PARAMS_ENV})"]
    option_tpot, result = predicted_tpot(tmp_path, "option", extra=["--params", str(slow)], env={PARAMS_ENV: ""})
    assert stderr_lines(result) == [f"parameters: {slow} (from --params)"]
    # Batch-1 decode streams the weights: less of the HBM peak is a longer step.
    bundled_hbm = load_efficiency()["h100_sxm"]["memory_bandwidth_efficiency"]
    assert SLOW_HBM < bundled_hbm and env_tpot == option_tpot > bundled_tpot * 1.2
    # --params over the variable: the variable names a file with no h100_sxm table, which would be refused.
    wrong = write_params_file(tmp_path / "wrong.toml", SLOW_HBM, gpu="h200_sxm")
    both_tpot, result = predicted_tpot(tmp_path, "both", extra=["--params", str(slow)], env={PARAMS_ENV: str(wrong)})
    assert both_tpot == option_tpot and stderr_lines(result) == [f"parameters: {slow} (from --params)"]


def test_sweep_reads_the_file_jaxplan_params_names(tmp_path):
    """A file without the swept GPU's table is refused by name (a full sweep is covered elsewhere):
    so the sweep read the variable's file, and the line says which setting chose it."""
    wrong = write_params_file(tmp_path / "wrong.toml", SLOW_HBM, gpu="h200_sxm")
    result = invoke(["sweep", "--model", "llama-3.1-8b", "--gpus", "h100_sxm", "--workload", "chat", "--space", "small", "--no-replay"],
                    env={PARAMS_ENV: str(wrong)})
    assert result.exit_code == 1
    lines = stderr_lines(result)
    assert lines[0] == f"parameters: {wrong} (from ${PARAMS_ENV})"
    assert len(lines) == 2 and f"${PARAMS_ENV} = {wrong}: no [gpu.h100_sxm] table (it has [gpu.h200_sxm])" in lines[1], lines


@pytest.mark.parametrize("case", ["missing", "directory", "unreadable", "malformed", "foreign", "out of range"])
def test_a_bad_jaxplan_params_is_one_line_naming_the_variable_the_value_and_the_fix(tmp_path, case):
    value = tmp_path / "p.toml"
    if case == "directory":
        value.mkdir()
    elif case == "unreadable":
        if os.geteuid() == 0:
            pytest.skip("root reads any file")
        value.write_text("[gpu.h100_sxm]\n")
        value.chmod(0)
    elif case == "malformed":
        value.write_text("[gpu.h100_sxm\n")
    elif case == "foreign":  # a model spec, not a calibration file
        value = REPO / "jaxplan" / "configs" / "models" / "llama-3.1-8b.toml"
    elif case == "out of range":
        write_params_file(value, 1.5)
    rows = tmp_path / "rows.csv"
    rows.write_text(f"{HEADER}\nllama-3.1-8b,h100_sxm,1,1024,256,1\n")
    result = invoke(["predict", str(rows), "--method", "analytical", "-o", str(tmp_path / "out.csv")], env={PARAMS_ENV: str(value)})
    assert result.exit_code == 1
    lines = stderr_lines(result)
    assert len(lines) == 1 and lines[0].startswith(f"error: ${PARAMS_ENV}"), lines
    assert str(value) in lines[0] and "unset" in lines[0], lines
    assert not (tmp_path / "out.csv").exists()


def test_the_python_api_reads_jaxplan_params_and_an_explicit_path_wins(monkeypatch, tmp_path):
    slow = write_params_file(tmp_path / "slow.toml", SLOW_HBM)
    other = write_params_file(tmp_path / "other.toml", 0.5)
    bundled = efficiency_for(["h100_sxm"])["h100_sxm"]["memory_bandwidth_efficiency"]
    monkeypatch.setenv(PARAMS_ENV, str(slow))
    assert efficiency_for(["h100_sxm"])["h100_sxm"]["memory_bandwidth_efficiency"] == SLOW_HBM
    assert efficiency_for(["h100_sxm"], str(other))["h100_sxm"]["memory_bandwidth_efficiency"] == 0.5
    monkeypatch.delenv(PARAMS_ENV)
    assert efficiency_for(["h100_sxm"])["h100_sxm"]["memory_bandwidth_efficiency"] == bundled != SLOW_HBM
