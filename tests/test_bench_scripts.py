"""Every benchmark in bench/ still imports against the current jaxplan.

The benchmarks reach into jaxplan's internals (the replay loop, the chunk kernel, the fit), which the
suite does not run them against: they take minutes. Importing each (its `main` is not called) catches
a name it imports that moved or went away, the commonest way one stops working unnoticed. What each
measures is reproduced with the command in bench/README.md; the plain-Python baseline's agreement
check runs in tests/test_stage4_scalar.py.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(p.stem for p in BENCH.glob("bench_*.py"))


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports(name, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    try:
        module = importlib.import_module(name)  # a script that ran its benchmark on import would fail here on pytest's arguments
        assert callable(module.main), f"bench/{name}.py has no main()"
    finally:
        sys.modules.pop(name, None)
