"""Python's cyclic garbage collector, set for a process that traces large JAX programs.

Tracing and lowering allocate millions of short-lived container objects, so the collector's default
thresholds (700, 10, 10) run it thousands of times per command, and each full collection walks every
object the process holds (JAX, NumPy and the loaded tables: hundreds of thousands). Reference counting
still frees everything without cycles at once; the higher thresholds only make the cycle collector
run less often. The command line and the test suite set them; importing jaxplan as a library leaves
the host process's collector alone. Measurements: bench/README.md ("What makes the first run shorter").
"""

from __future__ import annotations

import gc

# (objects allocated before a young collection, young collections per middle one, middle per full one)
THRESHOLDS = (50_000, 20, 100)


def collect_less() -> None:
    """Raise the collector's thresholds to `THRESHOLDS` (never lower one a caller set higher)."""
    gc.set_threshold(*(max(now, ours) for now, ours in zip(gc.get_threshold(), THRESHOLDS)))
