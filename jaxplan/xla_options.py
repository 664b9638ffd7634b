"""Compiler options for jaxplan's programs, applied only where the backend's XLA knows them.

XLA:CPU's newer fusion emitters (its default) compile the sweep's chunk kernel, a `while_loop`
around many small fused operations, in about twice the time the older emitters take, while the
program they make streams about 8% faster. `LEAN_COMPILE` selects the older emitters: the chunk
kernel uses it for grids small enough that compilation dominates (`funnel.chunk.chunk_kernel`),
with the same results to the bit. The replay's loop keeps the default: it runs faster with it.

`ONE_SHOT_COMPILE` is LLVM's -O0 for the programs that run once a command on small arrays: the
report rows' kernel (`funnel.chunk.evaluate_digits`, which compiles beside the chunk kernel on a
first run) and the finalists' arrays. Their code runs
slower but they run for milliseconds, and most of their compilation is optimising it. They keep
XLA's default emitters: -O0 with the older emitters (which compiles the report rows' kernel in
about 2.3 s instead of 4.7-5.3 s) gave two of 512 gpt-oss-120b report rows a wrong steady state
(0.46 requests in flight per replica where the physics' only root is 0.27) once the attention cost
gained two terms that are zero for that model: deterministically, in a 512-row call only, and
right at -O1, with the default emitters, or with XLA's concurrency-optimised scheduler turned off
(tests/test_stage4_scalar.py, which caught it). `LEAN_ONE_SHOT_COMPILE` (-O0, older emitters)
compiles the sensitivities' Jacobian (with the default emitters in twice the time; its elasticities
are checked against the default emitters' at -O2, to 2.2e-5 on 600 finalists) and the replay's start
and merge (`_start_lanes`, `_finish`: gathers, scatters and sorts of the lanes' tables, with no
arithmetic that the steady-state bug above touched; 0.1-0.2 s each on a first run instead of
0.3-0.5 s, and once per replay shape in the test suite). The replay's programs give the same results
to the bit as at -O2, and the report rows differ in the last float32 bits of some values
(tests/test_xla_options.py).

Compiler options are fields of XLA's DebugOptions, and an XLA that lacks a field refuses the whole
program ("No such compile option"): JAX 0.11.2 on an H200 machine refused `xla_cpu_use_fusion_emitters`.
So `jit_with_options` asks the default backend once which of the options it accepts and compiles
with those alone; results never depend on them, only compile and run times.
"""

from __future__ import annotations

import functools
import threading

import jax
import numpy as np

LEAN_COMPILE = {"xla_cpu_use_fusion_emitters": False}
# The default emitters named, so that an XLA_FLAGS that selects the older ones (the test suite's) does
# not reach these programs: at -O0 the older emitters computed wrong rows (module docstring).
ONE_SHOT_COMPILE = {"xla_cpu_use_fusion_emitters": True, "xla_backend_optimization_level": 0}
# The sensitivities' Jacobian and the replay's start and merge: -O0 with the older emitters, checked
# against the default emitters at -O2 (tests/test_xla_options.py); the default emitters at -O0 would
# double the Jacobian's compilation (15.8 against 28.1 s).
LEAN_ONE_SHOT_COMPILE = {**LEAN_COMPILE, "xla_backend_optimization_level": 0}


@functools.cache
def _option_accepted(backend: str, name: str, value) -> bool:
    """Whether the default backend (`backend`, the cache key) compiles a trivial program with `name=value`."""
    try:
        jax.jit(lambda x: x + 1, compiler_options={name: value}).lower(np.float32(0)).compile()
    except Exception:  # noqa: BLE001 - XLA reports an unknown option as a runtime error of its own type
        return False
    return True


def accepted(options: dict) -> dict:
    """The entries of `options` that the default backend's XLA accepts (each probed once a process)."""
    backend = jax.default_backend()
    return {name: value for name, value in options.items() if _option_accepted(backend, name, value)}


class OptionJit:
    """`jax.jit(fun, compiler_options=accepted(options), **jit_kwargs)`, resolved at the first use,
    once JAX's backend exists (resolving earlier would create it before the command line has chosen
    its CPU device count). Calls and attributes (`lower`, `clear_cache`, ...) go to that function."""

    def __init__(self, fun, options: dict, **jit_kwargs):
        functools.update_wrapper(self, fun)
        self._fun, self._options, self._jit_kwargs = fun, dict(options), jit_kwargs
        self._jitted = None
        self._lock = threading.Lock()  # compile_ahead may resolve it on a worker thread

    def jitted(self):
        with self._lock:
            if self._jitted is None:
                self._jitted = jax.jit(self._fun, compiler_options=accepted(self._options) or None, **self._jit_kwargs)
            return self._jitted

    def __call__(self, *args, **kwargs):
        return self.jitted()(*args, **kwargs)

    def __getattr__(self, name):
        if name in ("_fun", "_options", "_jit_kwargs", "_jitted", "_lock"):  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.jitted(), name)


def jit_with_options(options: dict, **jit_kwargs):
    """Decorator: `jax.jit(**jit_kwargs)` compiled with the entries of `options` the backend accepts."""
    return lambda fun: OptionJit(fun, options, **jit_kwargs)
