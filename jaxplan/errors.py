"""One error type for bad user input: a one-line message naming field, value and fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class PlanError(ValueError):
    """Bad input or an impossible request; the CLI prints `str(err)` and exits 1."""


def bad_value(field: str, value: object, fix: str, *, where: str | None = None) -> PlanError:
    """`where: field = value: fix` as a PlanError (where = file or section, optional)."""
    prefix = f"{where}: " if where else ""
    return PlanError(f"{prefix}{field} = {value!r}: {fix}")


def unknown_name(kind: str, name: str, known: Iterable[str]) -> PlanError:
    """Unknown name: list the known ones and the closest match."""
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.4)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return PlanError(f"unknown {kind} {name!r}.{hint} Known: {', '.join(known)}")
