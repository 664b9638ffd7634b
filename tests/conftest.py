"""Shared pytest setup: strict JAX numerics, a bounded number of compiled programs, and an opt-in flag for slow tests."""

from __future__ import annotations

import functools
import gc
import os
import shutil
import subprocess
import sys
import tempfile

import jax
import pytest

from jaxplan import compile_cache
from jaxplan.python_gc import collect_less

# Strict JAX in tests (../shared/style.md, point 8): an implicit broadcast of mismatched ranks is a bug.
jax.config.update("jax_numpy_rank_promotion", "raise")


SHARED_CACHE_ENV = "JAXPLAN_TEST_XLA_CACHE"  # set by the controlling process for its pytest-xdist workers
# The suite's compilation cache is kept between runs (a second run loads what the first compiled; JAX
# keys each entry by the program, the compiler flags and the JAX version, so an entry cannot go stale),
# pruned to this size, least recently used entries first. JAXPLAN_TEST_XLA_CACHE=fresh: a cache of this run only.
TEST_CACHE_MAX_BYTES = 1 << 30

# Compilation is most of the suite's time and the programs run briefly, so the tests compile fast:
# at LLVM's -O0 and with XLA:CPU's older emitters for every program (`xla_options.LEAN_COMPILE`, which
# the command line keeps for its one-shot programs): the same HLO programs, less code generation. Each
# flag takes ~30% off the suite. Float results may differ in their last bits (at -O0 LLVM rounds some
# operations differently). Where a test pins what the shipped emitters do bit for bit, it compiles that
# program with `SHIPPED_EMITTERS`; where it compares streamed answers whose near ties those bits
# decide, it runs them in a process without -O0 (test_funnel_invariance.py).
# -O0 with the older emitters has also mis-evaluated programs outright (xla_options.py; once a chunk
# kernel, which put a candidate inside an SLO that every other compilation put it 4% past, until a
# `jnp.where(present, cost, 0.0)` in the physics was written without the where): a failure in a
# cross-check between compiled programs that -O1 does not reproduce is that.
# JAXPLAN_TEST_XLA_OPT=default tests the shipped compiler settings throughout.
FAST_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
FAST_COMPILE_ENV = "JAXPLAN_TEST_XLA_OPT"
# jit compiler_options that override the flag above; pass `xla_options.accepted(SHIPPED_EMITTERS)`,
# since an XLA without the option refuses it (and then compiles with its only emitters anyway).
SHIPPED_EMITTERS = {"xla_cpu_use_fusion_emitters": True}
# jit compiler_options for a test's own programs that run long rather than compile long (reference
# scans over thousands of candidates): code made at -O0 runs about 5x slower, more than the -O0
# compilation saves (bench/README.md, "The test suite").
RUNS_LONG = {"xla_backend_optimization_level": 2}


@functools.cache
def _xla_knows(flags: tuple[str, ...]) -> bool:
    """Whether a process with `flags` in XLA_FLAGS runs JAX: XLA aborts at an unknown flag, and newer
    XLA drops debug options (an upgraded jaxlib must not turn the whole suite into crashes)."""
    probe = "import jax.numpy as jnp; jnp.zeros(1).block_until_ready()"
    env = dict(os.environ, XLA_FLAGS=" ".join(flags))
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=120).returncode == 0


def _compile_fast(environ, flags: tuple[str, ...] = FAST_COMPILE_FLAGS) -> None:
    """Add each of `flags` to XLA_FLAGS (before the first computation, inherited by pytest-xdist
    workers and subprocesses) unless opted out, that option is set already or this XLA lacks it."""
    if environ.get(FAST_COMPILE_ENV, "fast") != "fast":
        return
    missing = tuple(flag for flag in flags if flag.split("=")[0] not in environ.get("XLA_FLAGS", ""))
    if missing and not _xla_knows(missing):
        missing = tuple(flag for flag in missing if _xla_knows((flag,)))
    for flag in missing:
        environ["XLA_FLAGS"] = f"{environ.get('XLA_FLAGS', '')} {flag}".strip()


def pytest_configure(config: pytest.Config) -> None:
    """One compilation cache for the whole run (`suite_cache_dir`), chosen by the process that starts
    it (with pytest-xdist, the controller): every worker reads and writes the same one, so a program
    one worker compiled, or an earlier run did, is a disk read."""
    collect_less()  # as the command line does: at the defaults the collector took ~4% of a worker's CPU time
    _compile_fast(os.environ)
    # The suite checks the bundled parameters: a file a developer selected for their own work must not change it.
    os.environ.pop("JAXPLAN_PARAMS", None)
    os.environ.pop("JAXPLAN_VLLM_VERSION", None)  # ... and the release it prices, the newest measured
    if not hasattr(config, "workerinput"):
        where, made = suite_cache_dir(os.environ)
        if made:
            config._jaxplan_cache = where
        else:
            compile_cache.prune(where, TEST_CACHE_MAX_BYTES)
        os.environ[SHARED_CACHE_ENV] = where


def suite_cache_dir(environ) -> tuple[str, bool]:
    """(the suite's compilation cache, whether this run made it and removes it at the end):
    $JAXPLAN_TEST_XLA_CACHE, a fresh temporary directory for `fresh`, else
    $XDG_CACHE_HOME/jaxplan/test-xla (~/.cache/jaxplan/test-xla), kept between runs."""
    chosen = environ.get(SHARED_CACHE_ENV, "").strip()
    if chosen.lower() == "fresh":
        return tempfile.mkdtemp(prefix="jaxplan-test-xla-"), True
    if chosen:
        return chosen, False
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jaxplan", "test-xla"), False


def pytest_unconfigure(config: pytest.Config) -> None:
    where = getattr(config, "_jaxplan_cache", None)
    if where:
        os.environ.pop(SHARED_CACHE_ENV, None)
        shutil.rmtree(where, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker per core, at most 4 (each holds up to ~3.5 GB of compiled programs and
    arrays; beyond 4 the shared compilations, not the cores, bound the run)."""
    return max(1, min(os.cpu_count() or 1, 4))


@pytest.fixture(scope="session", autouse=True)
def _session_compile_cache():
    """The suite's persistent compilation cache (`suite_cache_dir`), shared by the xdist workers.

    With `_free_compiled_programs` below, a program another module (or another xdist worker)
    already compiled is loaded from disk instead of compiled again.
    """
    compile_cache.enable({compile_cache.ENV: os.environ[SHARED_CACHE_ENV]})
    yield
    jax.config.update("jax_compilation_cache_dir", None)


def _memory_mappings() -> tuple[int, int]:
    """(mappings this process holds, the kernel's limit); (1, 1) where /proc does not tell, so that
    every module clears."""
    try:
        with open("/proc/self/maps", "rb") as maps, open("/proc/sys/vm/max_map_count") as limit:
            return sum(1 for _ in maps), int(limit.read())
    except OSError:
        return 1, 1


@pytest.fixture(scope="module", autouse=True)
def _free_compiled_programs(_session_compile_cache):
    """Drop every compiled program after a test module once the process holds half its mapping limit.

    XLA:CPU maps each compiled program's code into the process with its own memory mappings. A
    whole-suite process that kept them all reached the kernel's `vm.max_map_count` (65,530 by
    default; 65,477 mappings were counted just before the crash) and died with SIGSEGV inside the
    next compilation. One module adds at most ~12,000; clearing at half the limit keeps the process
    well under it, and the session cache above makes the recompilation a disk read.
    """
    yield
    held, limit = _memory_mappings()
    if held > limit // 2:
        jax.clear_caches()
        gc.collect()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="also run tests marked `slow`")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: opt in with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)
