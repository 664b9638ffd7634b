"""A persistent XLA compilation cache for the command line.

jaxplan's kernels take seconds to compile and the same shapes come back on every run of a
command, so the CLI keeps compiled programs on disk: a second `jaxplan sweep` on the same
space loads them instead of compiling again. Where: $JAXPLAN_CACHE_DIR, else
$XDG_CACHE_HOME/jaxplan/xla, else ~/.cache/jaxplan/xla. JAXPLAN_CACHE_DIR=off (or empty)
turns it off. A cache that cannot be created is skipped: it only saves time, never changes
a result (JAX keys entries by the program, the JAX version and the compiler flags).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

ENV = "JAXPLAN_CACHE_DIR"
MIN_COMPILE_TIME_S = 0.0  # every program: loading even a small one beats compiling it (~25 ms each, ~80 per sweep)


def cache_dir(environ=os.environ) -> Path | None:
    """Where the cache lives, or None when turned off."""
    chosen = environ.get(ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "none") else Path(chosen).expanduser()
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "jaxplan" / "xla"


def enable(environ=os.environ) -> Path | None:
    """Point JAX's persistent compilation cache at `cache_dir()`; the directory used, or None."""
    where = cache_dir(environ)
    if where is None:
        return None
    try:
        where.mkdir(parents=True, exist_ok=True)
        if not os.access(where, os.W_OK):
            return None
    except OSError:
        return None
    import jax

    jax.config.update("jax_compilation_cache_dir", str(where))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    return where


def prune(where: str | os.PathLike, max_bytes: int) -> None:
    """Delete the files in `where` used longest ago (last read or written, as far as the file system
    keeps access times) until the rest hold at most `max_bytes`."""
    try:
        entries = [(max(st.st_atime, st.st_mtime), st.st_size, entry.path) for entry in os.scandir(where) if entry.is_file() for st in (entry.stat(),)]
    except OSError:
        return
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= max_bytes:
            break
        with contextlib.suppress(OSError):
            os.remove(path)
            total -= size
