"""Lowered programs and their executables kept on disk, so that a warm command loads its large
kernels instead of tracing, lowering and looking them up.

JAX's persistent compilation cache (compile_cache.py) is keyed by the lowered program, so a warm run
still traces and lowers every kernel before it can look the program up: a third of a warm
`jaxplan sweep` (bench/README.md). For the sweep's and the replay's large programs (`jit` wraps
them), this cache keys a call on what decides its program, without tracing it:

- the function and the compiler options it is jitted with;
- jaxplan's own files (sources and bundled data: `package_fingerprint`), the JAX and jaxlib
  versions, JAX's configuration, the XLA_* and JAXPLAN_* environment variables, the devices and
  the host CPU (`host_cpu`);
- the arguments' tree structure, shapes, dtypes, weak types and placement (values are traced, so
  they do not matter), and the static arguments' values written out in full;

and stores the call's lowered program (`jax.export`, StableHLO) and, once compiled, its executable
(`jax.experimental.serialize_executable`), keyed by that program without its source locations and by
the environment less jaxplan's files (`executable_key`). A later run loads the executable and calls it: no
tracing, no lowering, no compilation-cache lookup. Where no executable loads (none stored, or one XLA
cannot read), it runs the lowered program under a jit of one call (tracing that costs milliseconds),
whose compiled code comes from JAX's compilation cache, which checks the program it is handed. A
static argument that cannot be written out exactly (a closure, a function outside jaxplan, an object
this module does not know) makes that call an ordinary jit call, as does a program `jax.export`
refuses (remembered as an empty entry) or a file that cannot be read: the cache only saves time,
never changes a result. Off unless `enable`d: the CLI does, beside the compilation cache, in
<cache dir>/programs and <cache dir>/executables (each pruned to MAX_BYTES, least recently used
first; JAXPLAN_PROGRAM_CACHE=off turns it off alone); tests that patch jaxplan's internals in
process never see it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import logging
import os
import pickle
import re
import threading
import time
import types
from pathlib import Path

import numpy as np

SUBDIR = "programs"
EXECUTABLES = "executables"  # beside SUBDIR: one compiled executable per distinct lowered module (`executable_key`)
EXECUTABLE_LOAD_EVENT = "/jaxplan/program_cache/executable_load_duration"  # JAX monitoring: seconds to load one
MAX_BYTES = 1 << 30  # each folder pruned to this at each enable, least recently used first (the README's sweep stores 0.7 MB of programs, 11 MB of executables)
ENV = "JAXPLAN_PROGRAM_CACHE"  # "off": only the compilation cache (tracing and lowering every run)
_log = logging.getLogger(__name__)
_dir: Path | None = None
_exe_dir: Path | None = None
_lock = threading.Lock()
_cache_hits = threading.local()  # .count: JAX compilation-cache hits on this thread (`_count_cache_hit`)
_memo: dict[str, object] = {}  # key -> StoredProgram (or _NOT_STORED), for the process
_key_locks: dict[str, threading.Lock] = {}


def enable(compile_cache_dir: Path | None) -> Path | None:
    """Keep programs in `compile_cache_dir`/programs and their executables in
    `compile_cache_dir`/executables (None: off). The programs' directory used, or None."""
    global _dir, _exe_dir
    _dir = _exe_dir = None
    if compile_cache_dir is None or os.environ.get(ENV, "").strip().lower() in ("off", "0", "false", "no"):
        return None
    _dir = _writable(Path(compile_cache_dir) / SUBDIR)
    if _dir is not None:
        _exe_dir = _writable(Path(compile_cache_dir) / EXECUTABLES)
        _listen_for_cache_hits()
    return _dir


@functools.cache
def _listen_for_cache_hits() -> None:
    import jax

    jax.monitoring.register_event_listener(_count_cache_hit)


def _count_cache_hit(event: str, **_) -> None:
    # JAX reports a persistent-cache hit on the thread that compiles. An executable loaded from that
    # cache serialises incompletely (XLA:CPU: running the reloaded copy fails, "Function ... not
    # found"), so only programs compiled here are stored (`StoredProgram.executable`).
    if event == "/jax/compilation_cache/cache_hits":
        _cache_hits.count = getattr(_cache_hits, "count", 0) + 1


def _writable(where: Path) -> Path | None:
    """`where`, made and pruned to MAX_BYTES, or None when it cannot be written."""
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(where, os.W_OK):
        return None
    from jaxplan.compile_cache import prune

    prune(where, MAX_BYTES)
    return where


def disable() -> None:
    global _dir, _exe_dir
    _dir = _exe_dir = None
    with _lock:
        _memo.clear()


class Uncacheable(Exception):
    """A value the key cannot write out exactly."""


@functools.cache
def package_fingerprint() -> str:
    """sha256 over every file of the installed jaxplan package (path and content), compiled caches aside."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# Variables that choose where programs are kept or how much is logged, not what they compute.
_ENV_NOT_KEYED = frozenset({"JAXPLAN_CACHE_DIR", ENV, "JAXPLAN_DEBUG", "JAXPLAN_COMPILE_AHEAD", "JAXPLAN_TEST_XLA_CACHE"})


def _environment(with_package: bool = True) -> str:
    """What every key shares: versions, configuration, environment, devices, and (programs' keys, not
    executables') jaxplan's files."""
    import jax
    import jaxlib

    config = {k: v for k, v in jax.config.values.items() if not any(s in k for s in ("cache", "log", "explain", "traceback"))}
    env = {k: v for k, v in os.environ.items() if k.startswith(("XLA_", "JAXPLAN_", "TF_CPP")) and k not in _ENV_NOT_KEYED}
    devices = [(d.platform, d.device_kind, d.id) for d in jax.devices()]
    package = package_fingerprint() if with_package else ""
    return repr((jax.__version__, jaxlib.__version__, sorted(config.items(), key=lambda kv: kv[0]), sorted(env.items()), devices, host_cpu(), package))


# Source locations in a lowered module's text (`Exported.mlir_module()`): the `#loc..` definitions
# (whole lines) and the inline forms the printer leaves (an alias, unknown, a name with or without an
# alias, a call site of two aliases). A form not listed stays, and then none is taken out.
_LOCATION_LINE = re.compile(r"^#loc\d*\s*=.*\n?", re.MULTILINE)
_INLINE_LOCATION = re.compile(r'\s*loc\((?:#loc\d*|unknown|"(?:[^"\\]|\\.)*"(?:\(#loc\d*\))?|callsite\(#loc\d* at #loc\d*\))\)')


def without_locations(text: str) -> str:
    """A module's text without its source locations (what the program computes, not where in
    jaxplan's files it was written), or the text as it is where it holds a location form that
    `_INLINE_LOCATION` does not know."""
    stripped = _INLINE_LOCATION.sub("", _LOCATION_LINE.sub("", text))
    return text if "loc(" in stripped else stripped


def executable_key(exported, compiler_options: dict | None, donated: tuple[int, ...], placement: tuple[str, ...] = ()) -> str:
    """sha256 of what decides a stored program's executable: its module without source locations
    (JAX's compilation cache ignores them too), compiler options, donated arguments, the devices its
    arguments live on (`placement`: their `traced_value`s; a one-device module does not name its
    device), and the environment less jaxplan's own files. A program's key changes with any file of
    jaxplan, and a program JAX's cache then still holds could not be stored as an executable again
    (an executable loaded from that cache does not serialise whole); keyed by its module, an edit or
    upgrade of jaxplan that leaves a kernel as it was finds the executable compiled before."""
    try:
        text = without_locations(exported.mlir_module())
    except Exception:  # noqa: BLE001 - no text of the module: its bytes, locations and all (a miss after an edit, never a wrong hit)
        text = hashlib.sha256(exported.mlir_module_serialized).hexdigest()
    parts = (text, static_value(compiler_options), tuple(donated), tuple(placement), str(exported.in_shardings_hlo), str(exported.out_shardings_hlo), _environment(with_package=False))
    return hashlib.sha256(repr(parts).encode()).hexdigest()


@functools.cache
def host_cpu() -> str:
    """The host CPU's model and instruction-set flags: XLA:CPU compiles for the CPU it runs on, so a
    stored executable must not be loaded on another (a cache folder shared over a network)."""
    import platform

    try:
        with open("/proc/cpuinfo") as cpuinfo:
            lines = [line.strip() for line in cpuinfo if line.startswith(("model name", "flags", "Features", "CPU part"))]
        described = "\n".join(dict.fromkeys(lines))  # the first core's lines, once
    except OSError:
        described = ""
    return hashlib.sha256(f"{platform.machine()}|{platform.processor()}|{described}".encode()).hexdigest()


def static_value(x) -> str:
    """`x` (a static argument) written out exactly, or Uncacheable."""
    if x is None or isinstance(x, (bool, int, float, str, bytes)):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, np.ndarray):
        return f"ndarray:{x.dtype}:{x.shape}:{hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()}"
    if isinstance(x, np.generic):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return f"{_qualified(type(x))}(" + ",".join(static_value(v) for v in x) + ")"
    if isinstance(x, (tuple, list, frozenset)):
        items = sorted(static_value(v) for v in x) if isinstance(x, frozenset) else [static_value(v) for v in x]
        return f"{type(x).__name__}(" + ",".join(items) + ")"
    if isinstance(x, dict):
        return "dict(" + ",".join(f"{static_value(k)}={static_value(v)}" for k, v in sorted(x.items(), key=lambda kv: repr(kv[0]))) + ")"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return f"{_qualified(type(x))}(" + ",".join(f"{f.name}={static_value(getattr(x, f.name))}" for f in dataclasses.fields(x)) + ")"
    if isinstance(x, functools.partial):
        return f"partial({static_value(x.func)},{static_value(x.args)},{static_value(x.keywords)})"
    if callable(x) and getattr(x, "__closure__", None) is None and hasattr(x, "__code__"):
        return "function:" + _qualified(x)
    from jax.sharding import Mesh

    if isinstance(x, Mesh):
        return f"Mesh({tuple(x.shape.items())},{[d.id for d in x.devices.flat]})"
    raise Uncacheable(type(x).__name__)


def _qualified(obj) -> str:
    """module.qualname of a jaxplan function or class (its code is in the fingerprint); else Uncacheable."""
    module, name = getattr(obj, "__module__", "") or "", getattr(obj, "__qualname__", "")
    if not (module == "jaxplan" or module.startswith("jaxplan.")) or "<" in name:
        raise Uncacheable(f"{module}.{name}")
    return f"{module}.{name}"


def traced_value(x) -> str:
    """A traced argument leaf by what the compiled program depends on: shape, dtype, weak type and
    where its shards live (`_placement`)."""
    import jax

    if isinstance(x, (bool, int, float, complex)):
        return f"py:{type(x).__name__}"
    if isinstance(x, jax.ShapeDtypeStruct):
        return f"{x.shape}:{x.dtype}:{x.weak_type}:{_placement(x.sharding, len(x.shape))}"
    if isinstance(x, jax.Array):
        sharding = x.sharding if getattr(x, "_committed", True) else None
        return f"{x.shape}:{x.dtype}:{x.weak_type}:{_placement(sharding, x.ndim)}"
    if isinstance(x, (np.ndarray, np.generic)):
        return f"{np.shape(x)}:{x.dtype}:False:{_placement(None, np.ndim(x))}"
    raise Uncacheable(type(x).__name__)


def _placement(sharding, ndim: int) -> str:
    """The devices (in order) and XLA's tiling of a sharding; None (an uncommitted array) is the
    default device. Equivalent shardings spelt differently (a one-device mesh, a single device) get
    one key, as jit gives them one program."""
    import jax

    if sharding is None:
        return f"[{jax.devices()[0].id}]:{{replicated}}"
    try:
        return f"{[d.id for d in sharding._device_assignment]}:{sharding._to_xla_hlo_sharding(ndim)}"
    except Exception as why:  # noqa: BLE001 - a sharding type without them: not keyed
        raise Uncacheable(f"sharding {type(sharding).__name__}") from why


class CachedProgram:
    """A jitted function whose calls run their stored lowered program when the cache is on.

    static_argnames: the jit's static arguments, always passed by keyword. Everything else (`lower`,
    `clear_cache`, ...) goes to the jitted function."""

    def __init__(self, jitted, static_argnames=(), donate_argnames=()):
        functools.update_wrapper(self, getattr(jitted, "__wrapped__", jitted))
        self._jitted, self._static, self._donate = jitted, frozenset(static_argnames), frozenset(donate_argnames)
        self._positional = [p.name for p in inspect.signature(self.__wrapped__).parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

    def __getattr__(self, name):
        if name in ("_jitted", "_static", "_donate", "_positional"):
            raise AttributeError(name)
        return getattr(self._jitted, name)

    def __call__(self, *args, **kwargs):
        program = self.compiled(*args, **kwargs)
        if program is not None:
            try:
                return program(args, {k: v for k, v in kwargs.items() if k not in self._static})
            except Exception as why:  # noqa: BLE001 - a stored program its wrapper cannot place or lower
                # (these fail before running, so nothing was donated): jit from now on, in later runs too
                _log.debug("program cache: %s called as jit (%s)", self.__name__, why)
                self._forget(args, kwargs)
        return self._jitted(*args, **kwargs)

    def _forget(self, args, kwargs) -> None:
        """Mark this call's entry as not stored, in memory and on disk."""
        where = _dir
        try:
            key = self.key(args, kwargs)
        except Uncacheable:
            return
        with _lock:
            _memo[key] = _NOT_STORED
        if where is not None:
            _write(where / key, b"")

    def prepare(self, *args, **kwargs) -> None:
        """Trace and lower this call's program now (or load it), without compiling or running it.

        Tracing is Python and holds the GIL, so a worker tracing beside it makes both take about as
        long as the two together: a caller that starts a background compilation (`compile_ahead`)
        prepares its own large program first, which then compiles in XLA (the GIL released) while the
        worker traces. Arguments may be abstract (`compile_ahead.abstract`); nothing is donated."""
        if self.compiled(*args, **kwargs) is None:
            self._jitted.trace(*args, **kwargs)  # jit keeps the trace: the call does not trace again

    def key(self, args, kwargs) -> str:
        """sha256 of what decides the compiled program (the module docstring's list)."""
        import jax

        if self._static & set(self._positional[: len(args)]):
            raise Uncacheable("a static argument passed by position")
        dynamic = {k: v for k, v in kwargs.items() if k not in self._static}
        leaves, tree = jax.tree_util.tree_flatten((args, dynamic))
        options = getattr(self._jitted, "_options", None)
        parts = (
            _qualified(self.__wrapped__),
            static_value(options),
            static_value(dict((k, v) for k, v in kwargs.items() if k in self._static)),
            str(tree),
            [traced_value(leaf) for leaf in leaves],
            _environment(),
        )
        return hashlib.sha256(repr(parts).encode()).hexdigest()

    def compiled(self, *args, **kwargs) -> StoredProgram | None:
        """The `StoredProgram` for these arguments (from memory, from disk, or exported now and
        stored), or None when the cache is off or the call cannot be keyed or exported."""
        where = _dir
        if where is None:
            return None
        try:
            key = self.key(args, kwargs)
        except Uncacheable as why:
            _log.debug("program cache: %s not keyed (%s)", self.__name__, why)
            return None
        with _lock:
            hit = _memo.get(key)
            key_lock = _key_locks.setdefault(key, threading.Lock())
        if hit is not None:
            return hit or None
        with key_lock:  # compile_ahead's worker and the caller: one load or export
            with _lock:
                hit = _memo.get(key)
            if hit is not None:
                return hit or None
            hit = _load(where / key, _mesh_of({k: v for k, v in kwargs.items() if k in self._static}), self.__name__, _exe_dir)
            if hit is None:  # not stored, or unreadable: export (again) and store
                _log.debug("program cache: exporting %s (%s)", self.__name__, key[:12])
                hit = self._export_and_store(where / key, args, kwargs, _exe_dir)
            with _lock:
                _memo[key] = hit or _NOT_STORED
        return hit or None

    def _compiler_options(self) -> dict | None:
        """The compiler options the jit uses (`xla_options.OptionJit`: those the backend accepts)."""
        options = getattr(self._jitted, "_options", None)
        if not options:
            return None
        from jaxplan.xla_options import accepted

        return accepted(options) or None

    def _donated_leaves(self, args, dynamic) -> tuple[int, ...]:
        """Positions among the flattened (args, dynamic kwargs) of the leaves the jit donates."""
        import jax

        names = self._positional[: len(args)]
        counts = [len(jax.tree.leaves(a)) for a in args] + [len(jax.tree.leaves(v)) for v in dynamic.values()]
        owners = names + list(dynamic)
        out, at = [], 0
        for owner, n in zip(owners, counts):
            if owner in self._donate:
                out.extend(range(at, at + n))
            at += n
        return tuple(out)

    def _export_and_store(self, path: Path, args, kwargs, executables: Path | None = None) -> StoredProgram | None:
        """Trace and lower the jitted function once (as jit would) and store the lowered program."""
        import jax
        from jax import export

        dynamic = {k: v for k, v in kwargs.items() if k not in self._static}
        static = {k: v for k, v in kwargs.items() if k in self._static}
        leaves, in_tree = jax.tree.flatten((args, dynamic))
        out_trees = []

        def flat(*flat_leaves):
            call_args, call_dynamic = jax.tree.unflatten(in_tree, flat_leaves)
            out, out_tree = jax.tree.flatten(self.__wrapped__(*call_args, **call_dynamic, **static))
            out_trees.append(out_tree)
            return out

        mesh = _mesh_of(static)
        try:
            with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():  # constraints name its axes
                exported = export.export(jax.jit(flat))(*leaves)
            donated, options = self._donated_leaves(args, dynamic), self._compiler_options()
            compiled_as = executable_key(exported, options, donated, tuple(traced_value(leaf) for leaf in leaves))
            program = StoredProgram(exported, in_tree, out_trees[0], donated, options, mesh, self.__name__, executables and executables / compiled_as)
        except Exception as why:  # noqa: BLE001 - what export cannot take: the caller uses jit
            _log.debug("program cache: %s not exported (%s)", self.__name__, why)
            _write(path, b"")  # an empty entry: later runs go straight to jit instead of exporting again
            return None
        try:
            _write(path, pickle.dumps((exported.serialize(), in_tree, program.out_tree, program.donated, program.compiler_options, compiled_as)))
        except Exception as why:  # noqa: BLE001 - a tree pickle cannot write: the program still runs
            _log.debug("program cache: %s not stored (%s)", self.__name__, why)
        return program


class _NotStored:
    """Memo entry of a call that could not be exported: the caller uses jit without trying again."""

    def __bool__(self):
        return False


_NOT_STORED = _NotStored()


_lapack_skipped = threading.local()  # .active: this thread lowers a stored program that calls no LAPACK kernel


@functools.cache
def _initialize_lapack_on_demand() -> None:
    """Make JAX's lowering of a stored program initialise LAPACK only for a program that calls it.

    JAX initialises its CPU LAPACK kernels whenever it lowers a call of an exported program, whatever
    the program (`jax._src.export._export._ensure_backends_initialized`), and that imports
    scipy.linalg: most of a second of a first run, on the main thread, holding the GIL
    (bench/README.md). jaxplan's kernels
    call no LAPACK routine, so the lowering skips it where the module names none (`uses_lapack`); one
    that does is initialised as before. Where JAX's internals differ, nothing is changed."""
    try:
        from jax._src.export import _export
    except ImportError:
        return
    original = getattr(_export, "_ensure_backends_initialized", None)
    if not callable(original):
        return

    def ensure_backends_initialized(platforms):
        if not getattr(_lapack_skipped, "active", False):
            original(platforms)

    _export._ensure_backends_initialized = ensure_backends_initialized


@functools.cache
def _lapack_targets():
    """A pattern of the custom-call targets of JAX's CPU LAPACK kernels, or None where they cannot be listed."""
    try:
        from jax._src.lib import lapack

        names = sorted(lapack._lapack.registrations())
    except Exception:  # noqa: BLE001 - another jaxlib: every module counts as calling LAPACK
        return None
    return re.compile(b"|".join(re.escape(name.encode()) for name in names)) if names else None


def uses_lapack(exported) -> bool:
    """Whether an exported module calls one of JAX's CPU LAPACK kernels (one of their custom-call
    targets is named in it; True where the targets cannot be listed)."""
    pattern = _lapack_targets()
    return pattern is None or pattern.search(exported.mlir_module_serialized) is not None


@contextlib.contextmanager
def _lowering(skip_lapack: bool):
    """Lower a call of a stored program on this thread, without initialising LAPACK if `skip_lapack`
    (its module calls none: `uses_lapack`)."""
    if skip_lapack:
        _initialize_lapack_on_demand()
    before, _lapack_skipped.active = getattr(_lapack_skipped, "active", False), skip_lapack
    try:
        yield
    finally:
        _lapack_skipped.active = before


class StoredProgram:
    """A lowered program (`jax.export.Exported`) of one jitted call and its compiled executable: loaded
    from `executable` (a file) where one is stored, else compiled from the lowered program under a jit
    of one call (tracing that is a single call, the compilation found in JAX's compilation cache) and
    then stored there."""

    def __init__(self, exported, in_tree, out_tree, donated: tuple[int, ...], compiler_options: dict | None, mesh=None, name: str = "call", executable: Path | None = None):
        import jax

        self.in_tree, self.out_tree, self.donated, self.compiler_options = in_tree, out_tree, tuple(donated), compiler_options
        shardings = {}
        if exported.nr_devices > 1:  # placed as exported, over the call's own mesh (a static argument)
            if mesh is None or mesh.size != exported.nr_devices:
                raise Uncacheable(f"exported for {exported.nr_devices} devices without their mesh")
            shardings = dict(in_shardings=tuple(exported.in_shardings_jax(mesh)), out_shardings=list(exported.out_shardings_jax(mesh)))

        def call(*leaves):
            return exported.call(*leaves)

        call.__name__ = call.__qualname__ = name  # JAX's compile events and profiles name the kernel, not "call"
        self._call = jax.jit(call, donate_argnums=self.donated, compiler_options=compiler_options, **shardings)
        self._executable_path, self._name, self._exported = executable, name, exported
        self._compiled = None  # the jax.stages.Compiled, once loaded or compiled; False: run self._call
        self._compiled_lock = threading.Lock()

    def executable(self, leaves):
        """The compiled program for `leaves` (arrays or ShapeDtypeStructs), or None where only the jit runs it."""
        with self._compiled_lock:
            if self._compiled is None:
                self._compiled = _load_executable(self._executable_path, self._name)
                if self._compiled is None:
                    hits = getattr(_cache_hits, "count", 0)
                    self._compiled = self._lower(leaves).compile()
                    if getattr(_cache_hits, "count", 0) == hits:  # compiled here, not loaded from JAX's cache
                        _store_executable(self._executable_path, self._compiled, self._name)
            return self._compiled or None

    def __call__(self, args, dynamic):
        import jax

        leaves, tree = jax.tree.flatten((args, dynamic))
        if tree != self.in_tree:
            raise Uncacheable(f"called with {tree}, stored for {self.in_tree}")
        compiled = self.executable(leaves)
        if compiled is not None:
            try:
                return jax.tree.unflatten(self.out_tree, compiled(*leaves))
            except Exception as why:  # noqa: BLE001 - arguments it checks before running (their placement): nothing donated yet
                _log.debug("program cache: %s's executable refused its arguments (%s); jit from now on", self._name, why)
                self._compiled = False
                if self._executable_path is not None:
                    with contextlib.suppress(OSError):
                        self._executable_path.unlink()
        with _lowering(self._skips_lapack):
            return jax.tree.unflatten(self.out_tree, self._call(*leaves))

    @functools.cached_property
    def _skips_lapack(self) -> bool:
        """Whether lowering this program may leave LAPACK uninitialised (searched once, and only for a
        program that is lowered: a loaded executable needs neither)."""
        return not uses_lapack(self._exported)

    def _lower(self, leaves):
        with _lowering(self._skips_lapack):
            return self._call.lower(*leaves)

    def compile(self, args, dynamic):
        """Compile ahead (compile_ahead's worker); `out_info` of the result is in the call's tree."""
        import jax

        leaves = jax.tree.leaves((args, dynamic))
        compiled = self.executable(leaves) or self._lower(leaves).compile()
        return types.SimpleNamespace(out_info=jax.tree.unflatten(self.out_tree, jax.tree.leaves(compiled.out_info)))


def _load_executable(path: Path | None, name: str):
    """The `jax.stages.Compiled` stored at `path`, on the devices it was compiled for, or None (none
    stored, or XLA cannot load it)."""
    if path is None:
        return None
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    try:
        import jax
        from jax.experimental import serialize_executable

        started = time.perf_counter()
        device_ids, serialized, in_tree, out_tree = pickle.loads(blob)
        by_id = {d.id: d for d in jax.devices()}
        compiled = serialize_executable.deserialize_and_load(serialized, in_tree, out_tree, execution_devices=[by_id[i] for i in device_ids])
        jax.monitoring.record_event_duration_secs(EXECUTABLE_LOAD_EVENT, time.perf_counter() - started, fun_name=name)
        return compiled
    except Exception as why:  # noqa: BLE001 - a damaged or foreign file: not tried again
        _log.debug("program cache: %s's executable not loaded (%s)", name, why)
        with contextlib.suppress(OSError):
            path.unlink()
        return None


def _store_executable(path: Path | None, compiled, name: str) -> None:
    """Write `compiled` to `path`; a program XLA cannot serialise is simply not stored, nor one of a
    run over several processes (an executable there may span devices this process cannot load)."""
    if path is None:
        return
    try:
        import jax
        from jax.experimental import serialize_executable

        if jax.process_count() > 1:
            return

        device_ids = [d.id for d in compiled.runtime_executable().local_devices()]
        blob = pickle.dumps((device_ids, *serialize_executable.serialize(compiled)))
    except Exception as why:  # noqa: BLE001 - not serialisable (a backend without it): compiled each run
        _log.debug("program cache: %s's executable not stored (%s)", name, why)
        return
    _write(path, blob)


def _write(path: Path, blob: bytes) -> None:
    """Write `path` whole or not at all (readers never see a partial file); disk trouble is ignored."""
    partial = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        partial.write_bytes(blob)
        os.replace(partial, path)
    except OSError as why:
        _log.debug("program cache: %s not written (%s)", path.name, why)
        with contextlib.suppress(OSError):
            partial.unlink()


def _mesh_of(static: dict):
    """The one `Mesh` among the static arguments (a sharded program's devices), or None."""
    from jax.sharding import Mesh

    meshes = [v for v in static.values() if isinstance(v, Mesh)]
    return meshes[0] if len(meshes) == 1 else None


def _load(path: Path, mesh, name: str, executables: Path | None = None) -> StoredProgram | _NotStored | None:
    """The stored program, its executable looked for in `executables` (None: nothing stored or
    unreadable; _NOT_STORED: an earlier run could not export it)."""
    try:
        blob = path.read_bytes()
    except OSError:
        return None
    if not blob:
        return _NOT_STORED
    try:
        from jax import export

        serialized, in_tree, out_tree, donated, compiler_options, compiled_as = pickle.loads(blob)
        return StoredProgram(export.deserialize(serialized), in_tree, out_tree, donated, compiler_options, mesh, name, executables and executables / compiled_as)
    except Exception as why:  # noqa: BLE001 - a damaged or foreign file: export again and overwrite it
        _log.debug("program cache: %s unreadable (%s)", path.name, why)
        return None


def prepare(jitted, *args, **kwargs) -> None:
    """`jitted.prepare(*args, **kwargs)` for a `CachedProgram`, else (a plain jit) its `trace`, which
    the call then reuses; a function that is neither is left to its call."""
    if isinstance(jitted, CachedProgram):
        jitted.prepare(*args, **kwargs)
    elif hasattr(jitted, "trace"):
        jitted.trace(*args, **kwargs)


def jit(fun=None, *, options: dict | None = None, **jit_kwargs):
    """`jax.jit(fun, **jit_kwargs)` (`xla_options.OptionJit` with compiler `options`) as a
    `CachedProgram`; usable as a decorator with or without arguments."""
    if fun is None:
        return functools.partial(jit, options=options, **jit_kwargs)
    import jax

    from jaxplan.xla_options import OptionJit

    jitted = OptionJit(fun, options, **jit_kwargs) if options else jax.jit(fun, **jit_kwargs)
    return CachedProgram(jitted, _argnames(jit_kwargs, "static_argnames"), _argnames(jit_kwargs, "donate_argnames"))


def _argnames(jit_kwargs: dict, option: str) -> tuple[str, ...]:
    """A jit option's argument names as a tuple (jit takes one name as a plain string too)."""
    names = jit_kwargs.get(option, ())
    return (names,) if isinstance(names, str) else tuple(names)
