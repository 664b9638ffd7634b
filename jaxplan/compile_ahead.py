"""Compile a jitted program on a background thread while the caller does other work.

XLA compiles one program on one core, and a sweep's programs (the chunk kernel, the report rows'
kernel, the replay's loop and its summary) would otherwise compile one after the other. Once the
arguments' shapes are known, `ahead(name, jitted, *args)` lowers and compiles on a worker thread;
the compiled program lands in JAX's in-memory cache (and the persistent one, when on), so the
later ordinary call `jitted(*args)` only looks it up. Call `wait(name)` just before that call: a
call made while the same program is still compiling would compile it a second time.

Arguments may be arrays or `abstract(x)` (shape, dtype and sharding only): pass abstract ones for
anything the caller may donate or delete meanwhile. A compilation that fails here is dropped
silently: the ordinary call compiles again and reports the error where it belongs. Nothing here
changes a result: the program compiled is the one the call would compile.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import numpy as np

ENV = "JAXPLAN_COMPILE_AHEAD"  # "0" turns background compilation off (everything compiles on first call)
WORKERS = 2  # programs compiling at once besides the caller's own: the CLI's machines have few cores

_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
_pending: dict[str, list[Future]] = {}


def enabled() -> bool:
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def abstract(tree):
    """`tree` with every array replaced by a ShapeDtypeStruct of its shape, dtype and (for a JAX
    array placed on purpose) sharding; Python scalars stay as they are (their weak type matters)."""

    def one(x):
        if isinstance(x, jax.Array):
            committed = getattr(x, "_committed", True)
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding if committed else None, weak_type=x.weak_type)
        if isinstance(x, (np.ndarray, np.generic)):
            return jax.ShapeDtypeStruct(np.shape(x), x.dtype)
        return x

    return jax.tree.map(one, tree)


def on_host(tree):
    """`tree`'s arrays as shapes and dtypes the way `jax.device_get` returns them: NumPy arrays, which a
    program gets on the default device and never weakly typed (for a call that will be handed them)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


def ahead(name: str, jitted, *args, **static) -> Future | None:
    """Start compiling `jitted(*args, **static)` on a worker thread; the future's result is the
    `Compiled` (None when turned off). `name` groups the compilations `wait` waits for."""
    global _pool
    if not enabled():
        return None
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="jaxplan-compile")
        future = _pool.submit(_compile, jitted, args, static)
        _pending.setdefault(name, []).append(future)
    return future


def _compile(jitted, args, static):
    stored = getattr(jitted, "compiled", None)  # a program_cache.CachedProgram: its stored program
    program = stored(*args, **static) if stored is not None else None
    return program.compile(args, {}) if program is not None else jitted.lower(*args, **static).compile()


def wait(name: str) -> None:
    """Block until every background compilation started under `name` has finished (failed ones
    included: the caller's own call then compiles and raises)."""
    with _lock:
        futures = _pending.pop(name, [])
    for future in futures:
        try:
            future.result()
        except Exception:  # noqa: BLE001 - see the module docstring: the foreground call reports it
            pass
