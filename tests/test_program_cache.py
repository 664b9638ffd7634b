"""The program cache: what its key writes out, what it refuses, and programs and their executables
stored, reloaded (in this process and in a new one) and made again when damaged, with the same
results as jit."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache

from jaxplan import program_cache
from jaxplan.replay import ops
from jaxplan.replay.config import ReplayConfig


@pytest.fixture
def cache_on(tmp_path):
    """The program cache in `tmp_path`, with JAX's compilation cache off: each program is compiled
    here, so its executable is stored (one loaded from JAX's cache is not, see below)."""
    where = program_cache.enable(tmp_path)
    assert where == tmp_path / program_cache.SUBDIR
    suite_cache = jax.config.jax_compilation_cache_dir
    use_jax_cache(None)
    yield where
    use_jax_cache(suite_cache)
    program_cache.disable()


def use_jax_cache(where) -> None:
    """Point JAX's compilation cache at `where` (None: off), from the next compilation on."""
    jax.config.update("jax_compilation_cache_dir", None if where is None else str(where))
    jax_compilation_cache.reset_cache()


def executables(cache_on):
    return sorted((cache_on.parent / program_cache.EXECUTABLES).iterdir())


def recorded(event: str):
    """A list that grows by the function named in each `event` (a JAX duration event) from now on."""
    seen = []
    jax.monitoring.register_event_duration_secs_listener(lambda name, secs, fun_name=None, **_: seen.append(fun_name) if name == event else None)
    return seen


def lowerings():
    """A list that grows by the name of each function JAX lowers from now on (until the test ends)."""
    return recorded("/jax/core/compile/jaxpr_to_mlir_module_duration")


def fresh_process(cache_on):
    """As a new process: nothing in memory, the same folder."""
    program_cache.disable()
    program_cache.enable(cache_on.parent)


def _scaled_cumsum(x, *, scale: int):
    return ops.cumsum(x) * scale


_scaled_cumsum.__module__ = "jaxplan.replay.ops"  # keyed as jaxplan code (the key names only jaxplan functions)
_scaled_cumsum.__qualname__ = "_test_scaled_cumsum"
program = program_cache.jit(_scaled_cumsum, static_argnames="scale")


def test_static_values_are_written_out_in_full_or_refused():
    policy = ReplayConfig.create(max_num_seqs=[4], max_num_batched_tokens=[64], num_kv_blocks=8, data_parallel_size=[1])
    write = program_cache.static_value
    assert write(0.1) == "float:0.1" and write(1) != write(1.0) != write(True)
    assert write(ops.cumsum) == "function:jaxplan.replay.ops.cumsum"
    assert write(functools.partial(ops.ceil_sum, bs=16)) != write(functools.partial(ops.ceil_sum, bs=32))
    assert write(np.arange(5000)) != write(np.arange(5000) + (np.arange(5000) == 2500))  # no "..." in the middle
    assert "round_robin" in write(policy) and "16" in write(policy)
    for refused in (lambda x: x, np.sum, object(), functools.partial(lambda x: x)):
        with pytest.raises(program_cache.Uncacheable):
            write(refused)
    offset = 3

    def closure(x):
        return x + offset

    closure.__module__, closure.__qualname__ = "jaxplan.replay.ops", "closure"  # its captured value is not in the key
    with pytest.raises(program_cache.Uncacheable):
        write(closure)


def test_key_follows_shapes_dtypes_and_static_values_not_traced_values():
    x = jnp.arange(8.0)
    key = program.key((x,), {"scale": 2})
    assert key == program.key((x + 5,), {"scale": 2})  # values are traced
    assert key != program.key((jnp.arange(9.0),), {"scale": 2})
    assert key != program.key((jnp.arange(8),), {"scale": 2})
    assert key != program.key((x,), {"scale": 3})
    assert key == program.key((jax.ShapeDtypeStruct((8,), jnp.float32),), {"scale": 2})  # as compile_ahead passes it


def test_off_unless_enabled_and_then_plain_jit():
    program_cache.disable()
    assert program.compiled(jnp.arange(4.0), scale=2) is None
    np.testing.assert_array_equal(program(jnp.arange(4.0), scale=2), [0, 2, 6, 12])


def compilations():
    """A list that grows by the name of each function XLA compiles from now on."""
    return recorded("/jax/core/compile/backend_compile_duration")


def test_prepare_exports_without_compiling_and_the_call_does_not_export_again(cache_on, monkeypatch):
    """`prepare` traces and lowers (exports) a call's program and compiles nothing; the call then
    compiles that program without tracing it again, with jit's results."""
    x = jnp.asarray(np.random.default_rng(2).random(48), jnp.float32)
    compiled = compilations()
    program_cache.prepare(program, jax.ShapeDtypeStruct(x.shape, x.dtype), scale=5)
    assert len(list(cache_on.iterdir())) == 1 and compiled == []
    monkeypatch.setattr(program_cache.CachedProgram, "_export_and_store", lambda *_: pytest.fail("exported twice"))
    np.testing.assert_array_equal(program(x, scale=5), jax.jit(_scaled_cumsum, static_argnames="scale")(x, scale=5))
    assert len(compiled) >= 1


def test_prepare_of_a_plain_jit_traces_once_for_its_call():
    program_cache.disable()
    traces = []

    @jax.jit
    def double(x):
        traces.append(1)
        return 2 * x

    program_cache.prepare(double, jax.ShapeDtypeStruct((3,), jnp.float32))
    program_cache.prepare(program, jax.ShapeDtypeStruct((3,), jnp.float32), scale=2)  # cache off: jit's own trace
    np.testing.assert_array_equal(double(jnp.ones(3, jnp.float32)), [2, 2, 2])
    assert traces == [1]
    program_cache.prepare(lambda x: x, 1.0)  # neither: left to its call, nothing raised


def test_stored_program_is_reloaded_and_gives_jit_results(cache_on, monkeypatch):
    x = jnp.asarray(np.random.default_rng(0).random(64), jnp.float32)
    want = jax.jit(_scaled_cumsum, static_argnames="scale")(x, scale=3)
    np.testing.assert_array_equal(program(x, scale=3), want)
    assert len(list(cache_on.iterdir())) == 1
    fresh_process(cache_on)

    def no_exporting(*_):
        raise AssertionError("traced and exported although stored")

    monkeypatch.setattr(program_cache.CachedProgram, "_export_and_store", no_exporting)
    np.testing.assert_array_equal(program(x, scale=3), want)


def test_a_stored_executable_is_called_without_tracing_or_lowering(cache_on):
    """The second run of a program loads its compiled executable: no export, no lowering of the
    one-call wrapper, no compilation-cache lookup; the same numbers to the bit."""
    x = jnp.asarray(np.random.default_rng(1).random(96), jnp.float32)
    first = np.asarray(program(x, scale=7))
    assert len(executables(cache_on)) == 1
    fresh_process(cache_on)
    lowered = lowerings()
    again = np.asarray(program(x, scale=7))
    assert again.tobytes() == first.tobytes()
    assert lowered == []  # nothing lowered: neither the one-call wrapper nor an export


def test_an_executable_from_jaxs_compilation_cache_is_not_stored(cache_on, tmp_path):
    """An executable JAX loaded from its own cache does not serialise whole (XLA:CPU: its reloaded copy
    fails to run), so the program cache stores only what it compiled; such a call still runs."""
    use_jax_cache(tmp_path / "xla")
    x = jnp.arange(24.0)
    program(x, scale=6)  # compiled here: JAX's cache and the executable are written
    (stored,) = executables(cache_on)
    stored.unlink()
    fresh_process(cache_on)
    hits = []
    jax.monitoring.register_event_listener(lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    np.testing.assert_array_equal(program(x, scale=6), np.cumsum(np.arange(24.0)) * 6)
    assert hits and executables(cache_on) == []


def test_a_damaged_executable_is_compiled_again_and_replaced(cache_on):
    x = jnp.arange(20.0)
    program(x, scale=2)
    (stored,) = executables(cache_on)
    stored.write_bytes(b"not an executable")
    fresh_process(cache_on)
    np.testing.assert_array_equal(program(x, scale=2), np.cumsum(np.arange(20.0)) * 2)
    assert stored.read_bytes() != b"not an executable"


def test_damaged_file_is_exported_again_and_replaced(cache_on):
    x = jnp.arange(16.0)
    program(x, scale=2)
    (stored,) = cache_on.iterdir()
    stored.write_bytes(b"not an executable")
    fresh_process(cache_on)
    np.testing.assert_array_equal(program(x, scale=2), np.cumsum(np.arange(16.0)) * 2)
    assert stored.read_bytes() != b"not an executable"


def _scaled_positional(x, scale):
    return ops.cumsum(x) * scale


_scaled_positional.__module__, _scaled_positional.__qualname__ = "jaxplan.replay.ops", "_test_scaled_positional"


def test_a_program_export_refuses_is_marked_and_then_run_by_jit(cache_on, monkeypatch):
    """A call `jax.export` cannot take leaves an empty entry: the next run calls jit straight away,
    without tracing for an export again, and gets the same numbers."""
    from jax import export

    x = jnp.arange(10.0)

    def refuse(*_, **__):
        raise ValueError("not exportable")

    monkeypatch.setattr(export, "export", refuse)
    np.testing.assert_array_equal(program(x, scale=4), np.cumsum(np.arange(10.0)) * 4)
    (marker,) = cache_on.iterdir()
    assert marker.read_bytes() == b""
    fresh_process(cache_on)

    def no_exporting(*_):
        raise AssertionError("exported again")

    monkeypatch.setattr(program_cache.CachedProgram, "_export_and_store", no_exporting)
    np.testing.assert_array_equal(program(x, scale=4), np.cumsum(np.arange(10.0)) * 4)


def test_a_stored_program_that_fails_to_run_falls_back_to_jit_for_good(cache_on, monkeypatch):
    """A stored program its wrapper cannot place or lower (an error before it runs) is answered by
    jit, with the same numbers, and its entry is emptied so later runs do not load it again."""
    x = jnp.arange(12.0)
    program(x, scale=5)  # stored
    (stored,) = cache_on.iterdir()
    fresh_process(cache_on)

    def cannot_place(self, args, dynamic):
        raise ValueError("placement mismatch")

    monkeypatch.setattr(program_cache.StoredProgram, "__call__", cannot_place)
    np.testing.assert_array_equal(program(x, scale=5), np.cumsum(np.arange(12.0)) * 5)
    assert stored.read_bytes() == b""
    assert program.compiled(x, scale=5) is None


def test_donated_arguments_are_donated_by_the_stored_program(cache_on):
    """The stored program donates what the jit donates (the sweep's tables and the replay's state
    would otherwise be copied each call): the donated array is deleted after the call."""
    donating = program_cache.jit(_scaled_positional, static_argnames="scale", donate_argnames="x")
    x = jnp.arange(32.0)
    out = donating(x, scale=2)
    np.testing.assert_array_equal(out, np.cumsum(np.arange(32.0)) * 2)
    assert donating.compiled(jnp.arange(32.0), scale=2).donated == (0,)
    assert x.is_deleted()
    fresh_process(cache_on)  # ... and so does its executable, loaded
    x = jnp.arange(32.0)
    np.testing.assert_array_equal(donating(x, scale=2), np.cumsum(np.arange(32.0)) * 2)
    assert x.is_deleted()


def test_static_argument_by_position_is_not_keyed_and_still_runs(cache_on):
    positional = program_cache.jit(_scaled_positional, static_argnames="scale")
    with pytest.raises(program_cache.Uncacheable):
        positional.key((jnp.arange(3.0), 2), {})
    np.testing.assert_array_equal(positional(jnp.arange(3.0), 2), [0, 2, 6])
    assert list(cache_on.iterdir()) == []


def test_a_new_process_loads_what_the_first_stored(tmp_path):
    """Two real processes with two CPU devices, the arguments on the second (as the command line
    places the sweep): the first traces the program to export it (`flat`, the flattened call) and
    its one-call wrapper (`ceil_sum`) to compile it, the second traces neither (it loads the
    executable, on the device it was compiled for) and prints the same numbers."""
    script = textwrap.dedent(
        f"""
        import jax, jax.numpy as jnp
        from jaxplan import program_cache
        from jaxplan.replay import ops
        traced = []
        jax.monitoring.register_event_duration_secs_listener(
            lambda name, secs, **kw: traced.append(kw.get("fun_name")) if name == "/jax/core/compile/jaxpr_trace_duration" else None)
        program_cache.enable({str(tmp_path)!r})
        program = program_cache.jit(ops.ceil_sum, static_argnames=("bs", "max_k"))
        k, c, g = (jnp.arange(50, dtype=jnp.int32) % 9, jnp.arange(50, dtype=jnp.int32) * 37, jnp.arange(50, dtype=jnp.int32) % 21)
        k, c, g = jax.device_put((k, c, g), jax.devices()[1])
        out = program(k, c, g, bs=16, max_k=8)
        print("flat" in traced, "ceil_sum" in traced, out.sum().item(), list(out.devices())[0].id)
        """
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2"}
    first, second = (subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300) for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr[-2000:] + second.stderr[-2000:]
    assert first.stdout.split()[:2] == ["True", "True"]
    assert second.stdout.split()[:2] == ["False", "False"]
    assert first.stdout.split()[2:] == second.stdout.split()[2:]
    assert second.stdout.split()[3] == "1"
    assert len(list((tmp_path / program_cache.EXECUTABLES).iterdir())) == 1


def test_lowering_a_stored_program_initialises_lapack_only_for_a_program_that_calls_it(tmp_path):
    """JAX initialises its CPU LAPACK kernels (importing scipy.linalg: most of a second of a first run)
    whenever it lowers a call of an exported program. In a fresh process, a stored program without a
    LAPACK call is exported, lowered and compiled without that initialisation and without importing
    scipy; a stored program that inverts a matrix (LAPACK kernels on the CPU), loaded from its
    serialised form, is initialised and computes the inverse."""
    from jax import export

    inverse = export.export(jax.jit(lambda x: [jnp.linalg.inv(x)]))(jax.ShapeDtypeStruct((3, 3), jnp.float32))  # flat outputs, as stored
    doubled = export.export(jax.jit(lambda x: 2.0 * x))(jax.ShapeDtypeStruct((3, 3), jnp.float32))
    assert program_cache.uses_lapack(inverse) and not program_cache.uses_lapack(doubled)
    (tmp_path / "inverse.bin").write_bytes(inverse.serialize())
    script = textwrap.dedent(
        f"""
        import sys
        import jax, jax.numpy as jnp, numpy as np
        from jax import export
        from jax._src.lax import linalg
        from jaxplan import program_cache
        from jaxplan.replay import ops
        initialised, initialise = [], linalg.initialize_lapack
        linalg.initialize_lapack = lambda: (initialised.append(1), initialise())
        program_cache.enable({str(tmp_path / "cache")!r})
        program = program_cache.jit(ops.ceil_sum, static_argnames=("bs", "max_k"))
        k, c, g = (jnp.arange(50, dtype=jnp.int32) % 9, jnp.arange(50, dtype=jnp.int32) * 37, jnp.arange(50, dtype=jnp.int32) % 21)
        total = program(k, c, g, bs=16, max_k=8).sum().item()
        print(len(initialised), "scipy" in sys.modules, total == ops.ceil_sum(k, c, g, bs=16, max_k=8).sum().item())
        exported = export.deserialize(bytearray(open({str(tmp_path / "inverse.bin")!r}, "rb").read()))
        m = np.array([[4.0, 1.0, 0.0], [1.0, 3.0, 1.0], [0.0, 1.0, 2.0]], np.float32)
        tree = jax.tree.structure(((m,), {{}}))
        stored = program_cache.StoredProgram(exported, tree, jax.tree.structure([m]), (), None, name="inverse")
        inverted = np.asarray(stored((m,), {{}})[0])
        print(len(initialised) > 0, np.allclose(inverted @ m, np.eye(3), atol=1e-5))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["0", "False", "True", "True", "True"], run.stdout


def test_an_edit_of_jaxplan_that_leaves_a_program_as_it_was_keeps_its_executable(cache_on, monkeypatch):
    """Programs are keyed by jaxplan's files, their executables by the lowered module without source
    locations: after an upgrade or an edit of jaxplan (another package fingerprint) the program is
    traced and exported again, but its executable, compiled before, is loaded rather than compiled
    (JAX's cache would answer that compilation, and an executable from it cannot be stored, so under
    the program's key it would never be stored again)."""
    x = jnp.arange(40.0)
    want = np.asarray(program(x, scale=9))
    (stored,) = executables(cache_on)
    monkeypatch.setattr(program_cache, "package_fingerprint", lambda: "another jaxplan")
    fresh_process(cache_on)
    compiled = recorded("/jax/core/compile/backend_compile_duration")
    loaded = recorded(program_cache.EXECUTABLE_LOAD_EVENT)
    assert np.asarray(program(x, scale=9)).tobytes() == want.tobytes()
    assert len(list(cache_on.iterdir())) == 2  # the program under its new key beside the old one
    assert executables(cache_on) == [stored] and loaded == ["_scaled_cumsum"]
    assert compiled == []  # not the kernel, not its one-call wrapper: nothing


def test_the_executable_key_ignores_source_locations_only():
    """Two functions alike but for the lines they sit on lower to one executable key; a changed
    constant, donation or compiler option gives another; an unknown location form is kept whole."""
    from jax import export

    def lowered(source_pad: int, constant: float = 2.0):
        namespace = {"jnp": jnp}
        exec(compile("\n" * source_pad + f"def f(x):\n    return jnp.sin(x) * {constant} + 1\n", "/jaxplan/f.py", "exec"), namespace)
        return export.export(jax.jit(namespace["f"]))(jnp.ones(3))

    a, b = lowered(0), lowered(9)
    assert a.mlir_module() != b.mlir_module() and "loc(" not in program_cache.without_locations(a.mlir_module())
    key = program_cache.executable_key(a, None, ())
    assert key == program_cache.executable_key(b, None, ())
    assert key != program_cache.executable_key(lowered(0, 3.0), None, ())
    assert key != program_cache.executable_key(a, None, (0,)) != program_cache.executable_key(a, {"xla_cpu_use_fusion_emitters": False}, ())
    on_device = [program_cache.executable_key(a, None, (), (f"(3,):float32:False:[{i}]:{{replicated}}",)) for i in (0, 1)]
    assert on_device[0] != on_device[1]  # a one-device module does not name its device: its arguments do
    odd = 'func.func @main() loc(fused["a", "b"])'
    assert program_cache.without_locations(odd) == odd
    assert program_cache.without_locations('%0 = add loc(#loc3)\n#loc3 = loc("x")\n%1 = mul loc("y"(#loc3))') == "%0 = add\n%1 = mul"
