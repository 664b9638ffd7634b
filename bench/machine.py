"""Machine facts every benchmark prints: cores, memory, load average at start and end.

Benchmarks here share their cores with whatever else runs, so every figure is printed next to
the load average at the time; `facts()` at the start, `load()` again at the end.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import sys


def memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    """'1-min / 5-min / 15-min' load average."""
    try:
        return " / ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def facts() -> str:
    mem = memory_gib()
    parts = [
        f"cpu: {cpu_model()}",
        f"{os.cpu_count()} cores",
        f"{mem:.1f} GiB" if mem else "memory n/a",
        f"Python {platform.python_version()}",
    ]
    with contextlib.suppress(Exception):  # a venv without JAX still prints the rest
        import jax

        parts.append(f"JAX {jax.__version__} ({jax.device_count()} x {jax.devices()[0].platform})")
    return ", ".join(parts)


def print_start() -> None:
    print(f"machine: {facts()}", flush=True)
    print(f"load average (1/5/15 min) at start: {load()}", flush=True)


def print_end() -> None:
    print(f"load average (1/5/15 min) at end: {load()}", flush=True)


def median(values):
    return statistics.median(values)


def add_repo_root() -> None:
    """Make `tests/` (the plain-Python reference) and `bench/` importable from any working directory."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for path in (root, os.path.join(root, "tests"), os.path.join(root, "bench")):
        if path not in sys.path:
            sys.path.insert(0, path)
