"""Calibration parameter files: known fields are range-checked, unknown ones refused, retired ones dropped."""

import pytest

from jaxplan.errors import PlanError
from jaxplan.physics.params import DEFAULTS, RETIRED, validate


def test_a_retired_field_of_an_older_file_is_accepted_and_dropped():
    """closed_loop_sync_fraction was fitted until 2026-12-02; files written before still load."""
    assert "closed_loop_sync_fraction" in RETIRED and not RETIRED & set(DEFAULTS)
    params = validate("h200_sxm", {"closed_loop_sync_fraction": 0.12, "request_overhead_s": 0.05}, "old.toml")
    assert params == {**DEFAULTS, "request_overhead_s": 0.05}


def test_an_unknown_field_is_refused_by_name():
    with pytest.raises(PlanError, match=r"\[h200_sxm\]\.request_overhead_ms.*unknown parameter"):
        validate("h200_sxm", {"request_overhead_ms": 50.0}, "mine.toml")


def test_a_value_out_of_range_is_refused_by_name():
    with pytest.raises(PlanError, match=r"\[h200_sxm\]\.memory_bandwidth_efficiency.*\[0\.05, 1\]"):
        validate("h200_sxm", {"memory_bandwidth_efficiency": 1.5}, "mine.toml")


def test_a_params_file_names_its_sections_and_every_gpu_asked_for(tmp_path):
    """Found by an audit: [gpu.h100] (for h100_sxm), [gpus.h100_sxm] or a workload TOML given as --params
    ran with exit 0 on DEFAULTS, so a user's calibration was quietly not applied. An unknown section, or
    a GPU the file has no table for, is one line naming what the file holds."""
    from jaxplan.physics.params import efficiency_for

    typo = tmp_path / "typo.toml"
    typo.write_text("[gpu.h100]\ngemm_flops_efficiency = 0.2\n")
    with pytest.raises(PlanError, match=r"no \[gpu\.h100_sxm\] table \(it has \[gpu\.h100\]\); is \[gpu\.h100\] meant to be it\?"):
        efficiency_for(["h100_sxm"], str(typo))
    assert efficiency_for(["h100"], str(typo))["h100"]["gemm_flops_efficiency"] == 0.2
    for text, section in (("[gpus.h100_sxm]\ngemm_flops_efficiency = 0.2\n", "gpus"), ('isl_mean_tokens = 100\narrival = "closed"\n', "arrival")):
        path = tmp_path / f"{section}.toml"
        path.write_text(text)
        with pytest.raises(PlanError, match=rf"\[{section}\] is not a section of a calibration file"):
            efficiency_for(["h100_sxm"], str(path))


def test_error_lines_print_brackets_as_text():
    """The CLI printed PlanErrors through rich markup, which ate '[gpu.h100_sxm]' and '[h200_sxm].field'."""
    import typer
    from typer.testing import CliRunner

    from jaxplan.cli.common import clean_errors

    @clean_errors
    def failing():
        raise PlanError("params.toml: [h200_sxm].memory_bandwidth_efficiency = 1.5: must be a number in [0.05, 1]")

    app = typer.Typer()
    app.command()(failing)
    result = CliRunner().invoke(app, [])
    assert result.exit_code == 1 and "[h200_sxm].memory_bandwidth_efficiency" in result.output and "[0.05, 1]" in result.output
