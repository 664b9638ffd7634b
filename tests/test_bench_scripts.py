"""Every benchmark in bench/ still imports against the current jaxplan.

The benchmarks reach into jaxplan's internals (the replay loop, the chunk kernel, the fit), which the
suite does not run them against: they take minutes. Importing each (its `main` is not called) catches
a name it imports that moved or went away, the commonest way one stops working unnoticed. What each
measures is reproduced with the command in bench/README.md; the plain-Python baseline's agreement
check runs in tests/test_stage4_scalar.py.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("bench_*.py"))


def import_script(name: str):
    """bench/`name`.py imported, then forgotten, with the process environment put back: some scripts
    set XLA_FLAGS, the sweep's device count and the caches on import, for their own process, which
    the suite's later subprocesses would otherwise inherit."""
    environ, path = dict(os.environ), list(sys.path)
    sys.path.insert(0, str(BENCH))
    try:
        return importlib.import_module(name)  # a script that ran its benchmark on import would fail here on pytest's arguments
    finally:
        sys.modules.pop(name, None)
        os.environ.clear()
        os.environ.update(environ)
        sys.path[:] = path


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports(name):
    assert callable(import_script(name).main), f"bench/{name}.py has no main()"


def test_importing_leaves_the_environment_as_it_was(monkeypatch):
    """bench_replay_iteration sets $JAXPLAN_SWEEP_DEVICES on import where it is unset: left behind, it
    kept a later test's subprocess sweep on one device of four."""
    monkeypatch.delenv("JAXPLAN_SWEEP_DEVICES", raising=False)
    before = dict(os.environ)
    import_script("bench_replay_iteration")
    assert dict(os.environ) == before
