"""Per-request token lengths read from a file: a recorded run's own prompts and outputs.

A workload (or a `predict` row) with `lengths_file` replays these lengths, in the
file's order and repeated when more requests are asked for, instead of sampling a
fixed / uniform / lognormal distribution; stage 4 takes their p99 and spread.
The workload's isl/osl means scale them (each side by mean / the file's mean), so
`jaxplan sensitivity` and `--winner-map` can still move the means; with the file's
own means (what loaders fill in) the lengths are replayed exactly.

Formats, by suffix:
  .json / .jsonl  a `vllm bench serve --save-result --save-detailed` file: `input_lens` and
                  `output_lens` of every request (failed ones, output 0, are left out, as
                  vLLM's own totals do). `FILE#K` names record K (from 0) of an
                  --append-result file with several records.
  .csv            columns `input_tokens` and `output_tokens`, one row per request.
"""

from __future__ import annotations

import csv
import functools
import json
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np

from jaxplan.errors import PlanError, short_repr

MAX_REQUESTS = 10_000_000
CSV_COLUMNS = ("input_tokens", "output_tokens")
_FIX = "give a vllm bench serve --save-detailed JSON or a CSV with columns input_tokens,output_tokens"


class RequestLengths(NamedTuple):
    """One recorded run's requests, in sending order."""

    input_tokens: np.ndarray  # [R] int64 >= 1
    output_tokens: np.ndarray  # [R] int64 >= 1

    def p99_over_mean(self) -> tuple[float, float]:
        """(p99 / mean) of the input and of the output lengths."""
        return tuple(float(np.percentile(x, 99) / np.mean(x)) for x in (self.input_tokens, self.output_tokens))

    def output_cv(self) -> float:
        """Coefficient of variation of the output lengths (population standard deviation / mean)."""
        return float(np.std(self.output_tokens) / np.mean(self.output_tokens))

    def means(self) -> tuple[float, float]:
        return float(np.mean(self.input_tokens)), float(np.mean(self.output_tokens))

    def scaled(self, count: int, isl_mean_tokens: float, osl_mean_tokens: float) -> tuple[np.ndarray, np.ndarray]:
        """`count` requests' (prompt, output) tokens, int32 [count]: the file in order, repeated as
        needed, each side scaled to the given mean (exact when it is the file's own mean)."""
        out = []
        for values, mean in ((self.input_tokens, isl_mean_tokens), (self.output_tokens, osl_mean_tokens)):
            repeated = np.resize(values, count)
            factor = float(mean) / float(np.mean(values))
            exact = math.isclose(factor, 1.0, rel_tol=1e-6)  # the file's own mean, maybe through float32
            scaled = repeated if exact else np.rint(repeated * factor)
            out.append(np.clip(scaled, 1, 2**26).astype(np.int32))
        return out[0], out[1]


def split_record(spec: str) -> tuple[str, int | None]:
    """'runs.json#2' -> ('runs.json', 2); 'runs.json' -> ('runs.json', None)."""
    path, sep, index = str(spec).rpartition("#")
    if not sep or not (index.isascii() and index.isdigit()):
        return str(spec), None
    return path, int(index)


def _user_path(text: str) -> Path:
    try:
        return Path(text).expanduser()
    except RuntimeError:  # '~nosuchuser/...': no home directory to expand to
        return Path(text)


def resolve_against(spec: str, base: Path) -> str:
    """A relative lengths_file (as written in a workload TOML or a predict CSV) made absolute
    against the folder `base` of the file that names it; absolute ones are kept."""
    path, record = split_record(spec.strip())
    resolved = _user_path(path)
    if not resolved.is_absolute():
        resolved = (Path(base) / resolved).absolute()  # absolute: a row written to another folder still finds it
    return str(resolved) + (f"#{record}" if record is not None else "")


def relative_to(spec: str, base: Path) -> str:
    """The inverse for writing: a lengths_file inside the folder `base` as a path relative to it."""
    path, record = split_record(spec.strip())
    try:
        relative = Path(path).resolve().relative_to(Path(base).resolve())
    except (ValueError, OSError, RuntimeError):  # outside `base`, or a name the OS refuses
        return spec
    return relative.as_posix() + (f"#{record}" if record is not None else "")


def read_lengths(spec: str) -> RequestLengths:
    """The lengths in `spec` (a path, or PATH#K for record K of a multi-record JSON file).

    Raises a one-line PlanError naming the file and the fix."""
    if not isinstance(spec, str) or not spec.strip():
        raise PlanError(f"lengths_file = {short_repr(spec)}: {_FIX}")
    path_text, record = split_record(spec.strip())
    path = _user_path(path_text)
    try:
        stat = path.stat()
        resolved = str(path.resolve())
    except (OSError, ValueError, RuntimeError):
        raise PlanError(f"lengths_file = {short_repr(spec)}: no such file; {_FIX}") from None
    if not path.is_file():
        raise PlanError(f"lengths_file = {short_repr(spec)}: not a file; {_FIX}")
    return _read_cached(resolved, record, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)  # the files of one calibration (16 A100 runs); a 10M-request file is 160 MB
def _read_cached(path_text: str, record: int | None, _mtime_ns: int, _size: int) -> RequestLengths:
    path = Path(path_text)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as err:
        raise PlanError(f"lengths_file {path}: cannot read ({err.strerror}); {_FIX}") from None
    except UnicodeDecodeError as err:
        raise PlanError(f"lengths_file {path}: byte {err.start}: not UTF-8 text; {_FIX}") from None
    if path.suffix.lower() == ".csv":
        if record is not None:
            raise PlanError(f"lengths_file {path}#{record}: '#K' picks a record of a JSON file; name the CSV alone")
        inputs, outputs = _csv_lengths(path, text)
    elif path.suffix.lower() in (".json", ".jsonl"):
        inputs, outputs = _json_lengths(path, text, record)
    else:
        raise PlanError(f"lengths_file {path}: unknown suffix {path.suffix or '(none)'!r}; {_FIX}")
    return _checked(path, inputs, outputs)


def _csv_lengths(path: Path, text: str) -> tuple[list, list]:
    reader = csv.reader(text.splitlines())
    header = [h.strip().lower() for h in next(reader, [])]
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise PlanError(f"lengths_file {path}: header {short_repr(','.join(header))} lacks {missing[0]}; the CSV needs columns {','.join(CSV_COLUMNS)}")
    at = [header.index(c) for c in CSV_COLUMNS]
    inputs, outputs = [], []
    for line, cells in enumerate(reader, start=2):
        if not any(c.strip() for c in cells):
            continue
        try:
            inputs.append(float(cells[at[0]]))
            outputs.append(float(cells[at[1]]))
        except (IndexError, ValueError):
            raise PlanError(f"lengths_file {path}: line {line}: {short_repr(','.join(cells))} is not two token counts; fix the line") from None
    return inputs, outputs


def json_records(text: str) -> list:
    """The records of a vllm bench serve result: one JSON document (an object, or a list of them) or,
    as --append-result writes, one JSON object per line. Raises json.JSONDecodeError."""
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _json_lengths(path: Path, text: str, record: int | None) -> tuple[list, list]:
    try:
        records = json_records(text)
    except json.JSONDecodeError as err:
        raise PlanError(f"lengths_file {path}: not valid JSON (line {err.lineno}: {err.msg}); {_FIX}") from None
    if record is None:
        if len(records) != 1:
            raise PlanError(f"lengths_file {path}: holds {len(records)} records; name one as {path.name}#K (K from 0 to {len(records) - 1})")
        record = 0
    if record >= len(records):
        raise PlanError(f"lengths_file {path}#{record}: the file holds {len(records)} records; use K from 0 to {len(records) - 1}")
    chosen = records[record]
    if not isinstance(chosen, dict) or not isinstance(chosen.get("input_lens"), list) or not isinstance(chosen.get("output_lens"), list):
        raise PlanError(f"lengths_file {path}: no input_lens/output_lens lists; rerun vllm bench serve with --save-detailed, or {_FIX}")
    inputs, outputs = chosen["input_lens"], chosen["output_lens"]
    if len(inputs) != len(outputs):
        raise PlanError(f"lengths_file {path}: {len(inputs)} input_lens but {len(outputs)} output_lens; give the file vllm bench serve wrote")
    kept = [(i, o) for i, o in zip(inputs, outputs) if not (isinstance(o, (int, float)) and not isinstance(o, bool) and o == 0)]  # failed requests
    return [i for i, _ in kept], [o for _, o in kept]


def _checked(path: Path, inputs: list, outputs: list) -> RequestLengths:
    if not inputs:
        raise PlanError(f"lengths_file {path}: no requests; {_FIX}")
    if len(inputs) > MAX_REQUESTS:
        raise PlanError(f"lengths_file {path}: {len(inputs):,} requests; at most {MAX_REQUESTS:,}")
    arrays = []
    for name, values in (("input", inputs), ("output", outputs)):
        # anything but a plain number (text, true, a 400-digit integer) becomes NaN and fails below
        numeric = [not isinstance(v, bool) and isinstance(v, (int, float)) and abs(v) < 1e15 for v in values]
        array = np.asarray([float(v) if ok else np.nan for v, ok in zip(values, numeric)], np.float64)
        bad = ~(np.isfinite(array) & (array >= 1) & (array <= 1e7) & (array == np.floor(array)))
        if bad.any():
            k = int(np.argmax(bad))
            raise PlanError(f"lengths_file {path}: request {k}: {name} tokens = {short_repr(values[k])}: each must be a whole token count in 1..10,000,000")
        arrays.append(array.astype(np.int64))
    return RequestLengths(arrays[0], arrays[1])
