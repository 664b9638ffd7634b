"""Strict JSON for results: dataclasses as dicts, enums as their values, every non-finite float as null."""

from __future__ import annotations

import dataclasses
import json
import math


def json_default(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if hasattr(value, "value"):
        return value.value
    return str(value)


def finite(value):
    """JSON has no inf: write null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def plain(value):
    """`value` as JSON-ready Python: dicts, lists, str, int, bool, None and finite floats only."""
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float):
        return finite(value)
    if value is None or isinstance(value, (str, int, bool)):
        return value
    converted = json_default(value)
    return plain(converted) if converted is not value else str(value)


def json_text(payload) -> str:
    """`payload` as strict JSON (indent 2): dataclasses and enums as `json_default` writes them, and
    every non-finite float (an unbounded SLO, a burst's request rate) as null, never `Infinity`,
    which JSON parsers other than Python's reject."""
    return json.dumps(plain(payload), indent=2, allow_nan=False)
