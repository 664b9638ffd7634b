"""TOML values as jaxplan writes them (the parameter and bands files), with no writer dependency."""

from __future__ import annotations

import math


def toml_value(value) -> str:
    """One TOML value: a quoted string, true/false, an integer, a float to 6 significant digits (a
    non-finite one as the quoted text "inf", "-inf" or "nan", which TOML readers take as a string), or
    an array of those; anything else as its text."""
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return toml_value(str(value))
