"""The CLI's persistent compilation cache: where it lives, how to turn it off, that JAX writes to it,
and the least-recently-used pruning it shares with the suite's cache and the program cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jaxplan.compile_cache import ENV, cache_dir, enable, prune


def test_cache_dir_follows_the_environment(tmp_path):
    assert cache_dir({ENV: str(tmp_path / "c")}) == tmp_path / "c"
    assert cache_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "jaxplan" / "xla"
    assert cache_dir({}) == Path.home() / ".cache" / "jaxplan" / "xla"
    for off in ("off", "", "0", "None"):
        assert cache_dir({ENV: off}) is None
        assert enable({ENV: off}) is None


def test_an_unusable_directory_is_skipped(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert enable({ENV: str(blocker / "xla")}) is None


def test_compiled_programs_land_in_the_cache(tmp_path):
    """In a fresh process (the cache is process-wide configuration): enable it, compile, find the entry."""
    where = tmp_path / "xla"
    code = (
        "import jax, jax.numpy as jnp\n"
        "from jaxplan.compile_cache import enable\n"
        f"assert str(enable({{'{ENV}': {str(where)!r}}})) == {str(where)!r}\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)\n"
        "print(float(jax.jit(lambda x: jnp.sin(x) * 3.0 + x.sum())(jnp.arange(5.0))[0]))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert any(where.iterdir()), "JAX wrote nothing to the cache directory"


def test_pruning_deletes_the_oldest_entries_until_the_rest_fit(tmp_path):
    for age, name in enumerate(["newest", "middle", "oldest"]):
        path = tmp_path / name
        path.write_bytes(b"x" * 100)
        os.utime(path, (1e9 - age * 1000, 1e9 - age * 1000))
    prune(str(tmp_path), 250)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle", "newest"]
    prune(str(tmp_path), 200)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["middle", "newest"]
    prune(str(tmp_path), 99)
    assert list(tmp_path.iterdir()) == []
    prune(str(tmp_path / "absent"), 0)  # no directory yet: nothing to do


def test_pruning_keeps_an_old_entry_that_was_read_lately(tmp_path):
    old, new = tmp_path / "written-long-ago-read-today", tmp_path / "written-yesterday"
    for path in (old, new):
        path.write_bytes(b"x" * 100)
    os.utime(old, (2e9, 1e9))  # (access, modification)
    os.utime(new, (1.5e9, 1.5e9))
    prune(str(tmp_path), 150)
    assert [p.name for p in tmp_path.iterdir()] == [old.name]
