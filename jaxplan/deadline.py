"""Stopping a long job (a sweep's stream, a replay) once its measured rate projects past a time limit.

A job reports `progress(done, total)` in its own units (candidates, output tokens); the first report
follows compilation, so the rate is measured from it on, for at least REFINE_AFTER_S, and the job is
stopped (one-line TimeLimitExceeded, a PlanError) when its projection exceeds the limit by REFINE_SLACK, or once the limit
has passed. Several jobs can share one limit: give each the same `start`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from jaxplan.errors import PlanError, TimeLimitExceeded

REFINE_AFTER_S = 2.0  # measure at least this long before trusting the measured rate
REFINE_SLACK = 1.25  # stop only when the projection exceeds the limit by 25%


def check_limit(value, option: str = "--max-seconds") -> None:
    """PlanError unless `value` is None (no limit) or a number > 0 (inf: no limit)."""
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value) and value > 0):
        raise PlanError(f"{option} = {value!r}: give a positive number (inf: no limit)")


class Deadline:
    """A `progress(done, total)` wrapper that raises TimeLimitExceeded (a PlanError) when the measured rate projects past
    `max_seconds` (by REFINE_SLACK) from `start` (default: now), or when `max_seconds` has passed.

    what: the job, for the message ("the sweep", "the replay of row 3"); unit: what done/total count;
    fix: what to change besides raising the limit."""

    def __init__(
        self,
        max_seconds: float | None,
        progress: Callable[[int, int], None] | None = None,
        clock=time.perf_counter,
        *,
        start: float | None = None,
        what: str = "the sweep",
        unit: str = "candidates",
        fix: str = "use a smaller --space or fewer --gpus",
        option: str = "--max-seconds",
    ):
        check_limit(max_seconds, option)
        self.max_seconds, self.progress, self.clock = max_seconds, progress, clock
        self.what, self.unit, self.fix, self.option = what, unit, fix, option
        self.start = clock() if start is None else start
        self.first: tuple[float, int] | None = None  # (time, done) at the first report (after compilation)

    def __call__(self, done: int, total: int) -> None:
        if self.progress:
            self.progress(done, total)
        if self.max_seconds is None or done >= total:
            return
        now = self.clock()
        elapsed = now - self.start
        rate = projected = None
        if self.first is None:
            self.first = (now, done)
        else:
            t1, d1 = self.first
            rate = (done - d1) / max(now - t1, 1e-9)
            projected = elapsed + (total - done) / rate if now - t1 >= REFINE_AFTER_S and rate > 0 else None
        if elapsed > self.max_seconds or (projected is not None and projected > REFINE_SLACK * self.max_seconds):
            rate_text = f"; at the measured {rate:,.0f} {self.unit}/s the whole needs about {projected:,.0f} s" if projected else ""
            raise TimeLimitExceeded(
                f"stopped {self.what} after {elapsed:,.1f} s at {done:,} of {total:,} {self.unit}{rate_text}, "
                f"beyond {self.option} = {self.max_seconds:g}; {self.fix}, or raise {self.option}"
            )
