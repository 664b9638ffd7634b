"""jaxplan.compile_ahead: a program compiled on a worker thread is the one the later call runs.

Compilations are counted with JAX's monitoring event for a backend compilation (as in
test_recompile.py); each test jits its own function, so nothing else has compiled it before.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxplan import compile_ahead

COMPILE = "/jax/core/compile/backend_compile_duration"
_seen: list[str] = []


def _listener(event: str, duration: float, **kwargs) -> None:
    if event == COMPILE:
        _seen.append(threading.current_thread().name)


jax.monitoring.register_event_duration_secs_listener(_listener)


def _fresh():
    # a new function object per test: its own jit cache entry
    return jax.jit(lambda x, y, *, k: jnp.tanh(x) * y + k, static_argnames="k")


def test_the_call_after_wait_reuses_the_background_compilation():
    f = _fresh()
    x = np.linspace(0, 1, 7, dtype=np.float32)
    compile_ahead.ahead("t1", f, compile_ahead.abstract(jnp.asarray(x)), compile_ahead.abstract(x), k=2)
    compile_ahead.wait("t1")
    before = list(_seen)
    assert any(name.startswith("jaxplan-compile") for name in before), "the compilation ran on a worker thread"
    out = f(jnp.asarray(x), x, k=2)
    assert _seen == before, "the call compiled again"
    np.testing.assert_allclose(np.asarray(out), np.tanh(x) * x + 2, rtol=1e-6)


def test_a_jit_with_compiler_options_reuses_it_too():
    """The replay's start and merge are `xla_options.OptionJit`s, resolved at first use: the
    worker's compilation is still the one the later call runs."""
    from jaxplan.xla_options import LEAN_COMPILE, jit_with_options

    f = jit_with_options(LEAN_COMPILE, static_argnames="k")(lambda x, y, *, k: jnp.tanh(x) * y - k)
    x = np.linspace(0, 1, 5, dtype=np.float32)
    compile_ahead.ahead("t5", f, compile_ahead.abstract(jnp.asarray(x)), compile_ahead.abstract(x), k=3)
    compile_ahead.wait("t5")
    before = list(_seen)
    assert any(name.startswith("jaxplan-compile") for name in before[-1:]), "the compilation ran on a worker thread"
    out = f(jnp.asarray(x), x, k=3)
    assert _seen == before, "the call compiled again"
    np.testing.assert_allclose(np.asarray(out), np.tanh(x) * x - 3, rtol=1e-6)


def test_other_static_arguments_compile_their_own_program():
    f = _fresh()
    x = np.ones(3, np.float32)
    compile_ahead.ahead("t2", f, x, x, k=1)
    compile_ahead.wait("t2")
    before = len(_seen)
    f(x, x, k=5)  # another static value: not what was compiled ahead
    assert len(_seen) > before


def test_a_failing_compilation_is_left_to_the_call():
    f = jax.jit(lambda x: x @ x)  # a 1-D x of length 3 against itself works; a 2 x 3 does not
    bad = np.ones((2, 3), np.float32)
    compile_ahead.ahead("t3", f, bad)
    compile_ahead.wait("t3")  # no exception here
    with pytest.raises(TypeError):
        f(bad)


def test_turned_off_nothing_starts(monkeypatch):
    monkeypatch.setenv(compile_ahead.ENV, "0")
    assert compile_ahead.ahead("t4", _fresh(), np.ones(2, np.float32), np.ones(2, np.float32), k=0) is None
    compile_ahead.wait("t4")  # nothing pending: returns at once


def test_abstract_keeps_shape_dtype_and_placement():
    placed = jax.device_put(np.arange(4, dtype=np.int32), jax.devices()[0])
    loose = jnp.arange(4.0)
    a, b, c, d = compile_ahead.abstract((placed, loose, np.zeros((2, 3), np.bool_), 7))
    assert (a.shape, a.dtype, a.sharding) == ((4,), np.int32, placed.sharding)
    assert b.sharding is None and b.dtype == jnp.float32
    assert (c.shape, c.dtype) == ((2, 3), np.bool_)
    assert d == 7  # Python scalars stay (their weak type is part of the program)


def test_the_sweep_starts_the_report_rows_compilation_once_its_chunk_kernel_is_traced(monkeypatch):
    """Tracing holds the GIL: the report rows' kernel is traced on its worker only after the chunk
    kernel's own trace (`program_cache.prepare`), which then lowers and compiles beside it."""
    from jaxplan.funnel import chunk, run_sweep, sweep
    from jaxplan.specs import load_model, load_space, load_workload, parse_gpu_list

    order = []
    trace, lower = "/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration"
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, _, fun_name=None, **__: order.append((event, "_sweep_chunk")) if event in (trace, lower) and fun_name in ("_sweep_chunk", "jit(_sweep_chunk)") else None
    )
    real_ahead = sweep.evaluate_digits_ahead
    monkeypatch.setattr(sweep, "evaluate_digits_ahead", lambda *a: order.append(("ahead", None)) or real_ahead(*a))
    chunk.sweep_chunk_lean.clear_cache()  # traced again here, whatever ran before in this process
    run_sweep(load_model("llama-3.1-8b"), parse_gpu_list("l40s"), load_workload("chat"), load_space("small"), top_k=4)
    assert ("ahead", None) in order and (trace, "_sweep_chunk") in order and (lower, "_sweep_chunk") in order
    assert order.index((trace, "_sweep_chunk")) < order.index(("ahead", None)) < order.index((lower, "_sweep_chunk"))
