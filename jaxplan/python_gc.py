"""Python's cyclic garbage collector, set for a process that traces large JAX programs.

Tracing and lowering allocate millions of short-lived container objects, so the collector's default
thresholds (700, 10, 10) run it thousands of times per command, and each full collection walks every
object the process holds (JAX, NumPy and the loaded tables: hundreds of thousands). Reference counting
still frees everything without cycles at once; the higher thresholds only make the cycle collector
run less often. The command line and the test suite set them; importing jaxplan as a library leaves
the host process's collector alone. Measurements: bench/README.md ("What makes the first run shorter").
"""

from __future__ import annotations

import atexit
import functools
import gc

# (objects allocated before a young collection, young collections per middle one, middle per full one)
THRESHOLDS = (50_000, 20, 100)


def collect_less() -> None:
    """Raise the collector's thresholds to `THRESHOLDS` (never lower one a caller set higher)."""
    gc.set_threshold(*(max(now, ours) for now, ours in zip(gc.get_threshold(), THRESHOLDS)))


@functools.cache
def no_collections_at_exit() -> None:
    """At the interpreter's exit, keep the collector from walking what the process holds.

    After the `atexit` handlers, Python's finalisation runs full collections over every object left
    (JAX's, the tables', the compiled programs' wrappers) only to free memory the OS takes back
    anyway: about 0.2 s of a warm README sweep. `gc.freeze` as an exit handler (they all run before
    the finalisation) puts them out of those collections' reach; reference counting still frees
    what it frees, and nothing changes before the exit (a test process that calls the CLI in
    process collects as before)."""
    atexit.register(gc.freeze)
