"""Load specs by name (bundled TOML under jaxplan/configs/), by alias, or from a path.

Every failure is a PlanError naming the file, the field, the value and a fix.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import typing
from pathlib import Path

import tomllib

from jaxplan.errors import PlanError, bad_value, short_repr, unknown_name
from jaxplan.specs import checkpoints
from jaxplan.specs.gpu import GpuSpec
from jaxplan.specs.hf_config import HF_ID, model_from_hf_file
from jaxplan.specs.lengths import read_lengths, resolve_against
from jaxplan.specs.model import ModelSpec
from jaxplan.specs.space import SearchSpace
from jaxplan.specs.workload import Workload

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
MAX_RANGE_VALUES = 100_000  # values one {min, max, step} table may expand to


def read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as err:
        raise PlanError(f"{path}: malformed TOML ({err}); fix the syntax at that line") from None
    except UnicodeDecodeError as err:
        raise PlanError(f"{path}: not UTF-8 text (byte {err.start}); save the TOML file as UTF-8") from None
    except (ValueError, RecursionError) as err:  # an integer over 4300 digits, nesting past the recursion limit
        raise PlanError(f"{path}: unreadable TOML ({type(err).__name__}: {err})") from None
    except OSError as err:
        raise PlanError(f"{path}: cannot read ({err.strerror})") from None


def _coerce(value, annotation, field: str, where: str):
    """Check/convert one TOML value to the dataclass field's type."""
    origin = typing.get_origin(annotation)
    if origin is tuple:
        if isinstance(value, dict) and set(value) <= {"min", "max", "step"} and {"min", "max"} <= set(value):
            lo, hi, step = value["min"], value["max"], value.get("step", 1)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi, step)) or step < 1 or hi < lo:
                raise bad_value(field, value, "a range needs integers min <= max and step >= 1", where=where)
            if (hi - lo) // step >= MAX_RANGE_VALUES:  # each value is validated: a typo in step must not stall the load
                raise bad_value(field, value, f"a range may hold at most {MAX_RANGE_VALUES:,} values; raise step", where=where)
            return tuple(range(lo, hi + 1, step))
        if not isinstance(value, list):
            raise bad_value(field, value, "must be a list (or a {min, max} range table)", where=where)
        (inner, _) = typing.get_args(annotation)
        return tuple(_coerce(v, inner, field, where) for v in value)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        try:
            return annotation(value)
        except ValueError:
            raise unknown_name(f"{field} in {where}", str(value), [m.value for m in annotation]) from None
    if annotation is bool:
        if not isinstance(value, bool):
            raise bad_value(field, value, "must be true or false", where=where)
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and (not math.isfinite(value) or value != int(value))):
            raise bad_value(field, value, "must be an integer", where=where)
        return int(value)
    if annotation is float:
        if isinstance(value, str) and value.lower() in ("inf", "infinity"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad_value(field, value, "must be a number", where=where)
        if isinstance(value, int) and abs(value) > 1e300:  # float() of a 400-digit TOML int overflows
            raise bad_value(field, value, "is too large for a number of this kind; check the units", where=where)
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise bad_value(field, value, "must be a string", where=where)
        return value
    return value


def build(cls, data: dict, *, name: str, where: str):
    """Instantiate a frozen spec dataclass from a TOML table, checking names and types."""
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - fields
    if unknown:
        field = sorted(unknown)[0]
        raise unknown_name(f"field in {where}", field, sorted(fields - {"name"}))
    kwargs = {key: _coerce(value, hints[key], key, where) for key, value in data.items()}
    kwargs["name"] = name
    try:
        return cls(**kwargs)
    except TypeError as err:
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        raise PlanError(f"{where}: missing required field(s) {', '.join(missing) or '?'} ({err})") from None


def _bundled(kind: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted((CONFIG_DIR / kind).glob("*.toml"))}


@functools.cache
def _model_aliases() -> dict[str, str]:
    """Lower-cased name, HF id and aliases -> bundled model name."""
    table = {}
    for name, path in _bundled("models").items():
        data = read_toml(path)
        for key in (name, data.get("hf_id", ""), *data.get("aliases", [])):
            if key:
                table[key.lower()] = name
    return table


def known(kind: str) -> list[str]:
    return list(_bundled(kind))


def _user_path(name: str) -> Path:
    try:
        return Path(name).expanduser()
    except RuntimeError:  # '~nosuchuser/...': no home directory to expand to
        return Path(name)


def _is(check, path: Path) -> bool:
    """path.exists() / is_file() / is_dir(), False where the OS refuses the name (too long, ...)."""
    try:
        return check(path)
    except (OSError, ValueError):
        return False


def _load_named(kind: str, cls, name: str, label: str):
    path = _user_path(name)
    if name.endswith(".toml") or (path.suffix and _is(Path.exists, path)):
        if not _is(Path.is_file, path):
            raise PlanError(f"{label} file {short_repr(name)} does not exist; give a bundled name ({', '.join(known(kind))}) or an existing .toml path")
        data = read_toml(path)
        if kind == "workloads":
            data = _with_lengths_file(data, path.parent, str(path))
        return build(cls, data, name=path.stem, where=str(path))
    bundled = _bundled(kind)
    if name not in bundled:
        raise unknown_name(label, name, bundled, releases=kind == "models")
    return build(cls, read_toml(bundled[name]), name=name, where=f"{bundled[name].name}")


def _with_lengths_file(data: dict, base: Path, where: str) -> dict:
    """A workload table's `lengths_file` made relative to the TOML file's folder, and its isl/osl
    means and request count (a burst's size) taken from that file when the table leaves them out."""
    spec = data.get("lengths_file")
    if not isinstance(spec, str) or not spec.strip():
        return data
    data = {**data, "lengths_file": resolve_against(spec, base)}
    if not {"isl_mean_tokens", "osl_mean_tokens", "num_requests"} <= set(data):
        try:
            lengths = read_lengths(data["lengths_file"])
        except PlanError as err:
            raise PlanError(f"{where}: {err}") from None
        isl, osl = lengths.means()
        data.setdefault("isl_mean_tokens", isl)
        data.setdefault("osl_mean_tokens", osl)
        data.setdefault("num_requests", len(lengths.input_tokens))
    return data


@functools.cache
def load_model(name: str) -> ModelSpec:
    """A bundled name ('llama-3.1-70b'), an HF id ('meta-llama/Llama-3.1-70B'), or a config.json / .toml path."""
    if not name.strip():  # '' is the current directory as a path: say what is missing instead
        raise unknown_name("model", name, _bundled("models"), releases=True)
    path = _user_path(name)
    if name.endswith(".json") or _is(Path.is_dir, path):
        target = path / "config.json" if _is(Path.is_dir, path) else path
        if not _is(Path.is_file, target):
            raise PlanError(f"model config {short_repr(str(target))} does not exist; pass a Hugging Face config.json path or a bundled name ({', '.join(known('models'))})")
        return model_from_hf_file(target)
    resolved = _model_aliases().get(name.lower(), name)
    if resolved not in _bundled("models") and HF_ID.fullmatch(name) and not name.endswith(".toml"):
        named = _named_checkpoint(name.strip())
        if named is not None:
            return named
        # jaxplan does not download: an unbundled Hugging Face id needs its config.json on disk
        raise PlanError(
            f"{unknown_name('model', name, _bundled('models'), releases=True)}. jaxplan reads models offline: for {name}, save "
            f"https://huggingface.co/{name}/resolve/main/config.json and pass its path (--model path/to/config.json)"
        )
    return _load_named("models", ModelSpec, resolved, "model")


def _named_checkpoint(hf_id: str) -> ModelSpec | None:
    """The bundled model another checkpoint's id names (`checkpoints.resolve`: a quantised or chat
    release), served as that checkpoint, in its stored format; None if the id is not one."""
    found = checkpoints.resolve(hf_id, _model_aliases())
    if found is None:
        return None
    name, fmt = found
    base = _load_named("models", ModelSpec, name, "model")
    fmt = fmt or base.checkpoint_weight_format
    what = f"its {fmt} checkpoint" if fmt != base.checkpoint_weight_format else "a release of it"
    source = f"{base.source}; {hf_id}: {what}, recognised by name (the shape is {base.hf_id}'s)"
    return dataclasses.replace(base, hf_id=hf_id, aliases=(), checkpoint_weight_format=fmt, named_checkpoint=True, source=source)


def _gpu_key(name: str) -> str:
    """A GPU name as looked up: lower case, spaces and hyphens as underscores."""
    return "_".join(name.strip().lower().replace("-", " ").replace("_", " ").split())


@functools.cache
def _gpu_aliases() -> dict[str, str]:
    """GPU name or alias (as `_gpu_key` writes it) -> bundled GPU name."""
    table = {}
    for name, path in _bundled("gpus").items():
        for key in (name, *read_toml(path).get("aliases", [])):
            table[_gpu_key(key)] = name
    return table


@functools.cache
def load_gpu(name: str) -> GpuSpec:
    if name.endswith(".toml"):
        return _load_named("gpus", GpuSpec, name, "GPU")
    return _load_named("gpus", GpuSpec, _gpu_aliases().get(_gpu_key(name), name.lower().replace("-", "_")), "GPU")


@functools.cache
def load_workload(name: str) -> Workload:
    workload = _load_named("workloads", Workload, name, "workload")
    workload.check_target_is_offered()
    return workload


@functools.cache
def load_space(name: str) -> SearchSpace:
    return _load_named("spaces", SearchSpace, name, "search space")


def parse_gpu_list(text: str) -> tuple[GpuSpec, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise bad_value("--gpus", text, f"name at least one GPU type from {', '.join(known('gpus'))}")
    gpus = tuple(load_gpu(n) for n in names)
    if len({gpu.name for gpu in gpus}) != len(gpus):  # 'h100_sxm,H100-SXM' names one type twice
        raise bad_value("--gpus", text, "lists a GPU type twice")
    return gpus

