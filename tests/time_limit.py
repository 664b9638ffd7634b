"""A wall-clock limit for one fuzz case: a hang is a failure, not a stuck test run."""

from __future__ import annotations

import contextlib
import signal


class Hang(BaseException):
    """Raised by the alarm; a BaseException so no `except Exception` / `except OSError` in the code under test eats it."""


@contextlib.contextmanager
def time_limit(seconds: float):
    def _alarm(signum, frame):
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
