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
