"""A configuration row's own GPU: the bundled spec, with the HBM fields a row may override.

Measured rows can come from a variant of a bundled GPU (A100-SXM4-40GB against jaxplan's 80 GB
`a100_sxm`). `predict` prices the row on that variant, the calibration fits it there, and vLLM's
rules (`engine_rules`) pick their defaults from its HBM: all three read the row's GPU here.
"""

from __future__ import annotations

import dataclasses
import math

from jaxplan.errors import bad_value
from jaxplan.specs import load_gpu
from jaxplan.specs.gpu import SANE_RANGES, GpuSpec

# Row columns that replace a field of the named GPU's spec -> the GpuSpec field.
GPU_OVERRIDES = {
    "gpu_hbm_bytes_override": "hbm_bytes",
    "gpu_hbm_bandwidth_bytes_per_s_override": "hbm_bandwidth_bytes_per_s",
}


def given(row: dict, field: str) -> bool:
    """Whether `row` states `field` (a CSV's blank cell does not)."""
    value = row.get(field)
    return not (value is None or (isinstance(value, str) and value.strip() == ""))


def number(row: dict, field: str, default=None, *, where: str) -> float:
    """`row[field]` as a non-negative float, `default` where the row leaves it blank (None: required);
    a one-line error naming the field, the value and `where` otherwise."""
    value = row.get(field)
    if not given(row, field):
        if default is None:
            raise bad_value(field, value, "is required", where=where)
        return float(default)
    try:
        parsed = float(value)
    except (TypeError, ValueError):
        raise bad_value(field, value, "must be a number", where=where) from None
    if math.isnan(parsed) or parsed < 0:
        raise bad_value(field, value, "must be a non-negative number", where=where)
    return parsed


def gpu_key(row: dict, where: str) -> tuple:
    """(GPU name, override values or None in GPU_OVERRIDES order) of one row."""
    name = str(row.get("gpu") or "").strip()
    if not name:
        raise bad_value("gpu", row.get("gpu"), "is required", where=where)
    return (name, *(number(row, column, where=where) if given(row, column) else None for column in GPU_OVERRIDES))


def row_gpu(key: tuple, where: str) -> GpuSpec:
    """The GpuSpec of a `gpu_key`: the bundled spec with the row's overrides applied (within GpuSpec's
    ranges). Its `name` stays the bundled one, so it takes that GPU's fitted efficiencies."""
    spec = load_gpu(key[0])
    changes = {}
    for (column, field), value in zip(GPU_OVERRIDES.items(), key[1:]):
        if value is None:
            continue
        low, high = SANE_RANGES[field]
        if not low <= value <= high:
            raise bad_value(column, value, f"must lie in [{low:g}, {high:g}] ({'bytes' if field == 'hbm_bytes' else 'bytes/s'})", where=where)
        changes[field] = value
    if not changes:
        return spec
    label = ", ".join(f"{field} {value:.4g}" for field, value in changes.items())
    return dataclasses.replace(spec, display_name=f"{spec.display_name or spec.name} ({label})", **changes)
