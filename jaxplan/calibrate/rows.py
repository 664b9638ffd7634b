"""The one row format for end-to-end serving measurements = the `jaxplan predict` CSV columns.

A row is a dict with every column of `COLUMNS` (None = not given). Input
columns describe one deployment + workload; `measured_*` columns hold what a
benchmark reported; provenance columns say where the row came from.

Units at this boundary follow benchmark conventions (the column names say
them): latencies in ms, throughput in output tokens/s, request rate in
requests/s, token counts in tokens (isl/osl are MEAN tokens per request, so
they may be fractional for variable-length datasets such as ShareGPT).
`serving_arrays` converts rows to numpy arrays in SI units (seconds).

Column meanings:
  model                      bundled jaxplan model name (HF ids and aliases are resolved, and a quantised checkpoint's
                             id of a bundled model, e.g. Qwen/Qwen3-32B-FP8), or a config path
  gpu                        jaxplan GPU name (h100_sxm, h200_sxm, a100_sxm, b200_sxm, l40s, mi300x)
  tensor_parallel_size, pipeline_parallel_size, data_parallel_size   vLLM's flags: DP ranks are replicas; for a
                             MoE model they step together and share the expert layers (vLLM's --data-parallel-size)
  enable_expert_parallel     true | false (default): vLLM's --enable-expert-parallel (EP = DP x TP; MoE models only)
  weight_dtype               bf16 | fp8 | nvfp4 | mxfp4 | int4 (mxfp4, int4: a MoE model's experts; the rest bf16);
                             blank: the checkpoint's stored format (gpt-oss mxfp4, an -FP8 checkpoint fp8), else bf16
  kv_cache_dtype             auto (= model dtype, bf16) | fp8
  isl, osl                   mean input / output tokens per request
  concurrency                closed loop: requests kept in flight (whole deployment)
  request_rate               open loop: requests/s (Poisson unless noted); inf = all at once (burst)
  num_prompts                requests in the run (required for request_rate = inf, unless a lengths_file gives them)
  max_num_seqs, max_num_batched_tokens   engine batching limits when known
  gpu_memory_utilization     vLLM's --gpu-memory-utilization (fraction of HBM for weights + KV cache; blank = 0.9)
  block_size                 vLLM's --block-size, tokens per KV-cache block (blank = 16)
  vllm_version               the vLLM release served (e.g. 0.8.3; blank = --vllm-version, else the newest measured):
                             it decides the engine under PP and the default gpu_memory_utilization (`jaxplan.vllm_release`)
  prefix_hit_rate            fraction of prompt tokens served from prefix cache, [0, 1)
  enable_prefix_caching      true (default) | false: vLLM's prefix cache (--no-enable-prefix-caching turns it off);
                             the replay keeps a preempted request's cached blocks only with it (not for hybrid models)
  isl_distribution, isl_spread, osl_distribution, osl_spread
                             length distributions as in a workload file: fixed (blank) | uniform (mean +- spread x mean)
                             | lognormal (spread = coefficient of variation), spread in [0, 5]
  lengths_file               instead of the distributions: a file with every request's lengths (a vllm bench serve
                             --save-detailed JSON, FILE#K for record K, or a CSV input_tokens,output_tokens), replayed in
                             order and scaled to isl/osl (blank isl/osl = the file's means: the lengths exactly);
                             a relative path is relative to the predict CSV's folder
  gpu_hbm_bytes_override, gpu_hbm_bandwidth_bytes_per_s_override
                             set when the measured GPU differs from the jaxplan GPU spec (e.g. A100 40GB)
  measured_ttft_ms_mean, measured_tpot_ms_mean, measured_output_tok_s
  measured_output_tok_s_derived   true when throughput was computed from TTFT/TPOT, not measured
  measured_ttft_ms_p99, measured_tpot_ms_p99   99th percentiles over the run's requests, when reported
  dataset, backend (vllm | sglang | trtllm), source_id, notes
"""

from __future__ import annotations

import csv
import difflib
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from jaxplan.bands import COLUMNS as BAND_OUTPUT_COLUMNS
from jaxplan.errors import PlanError, bad_value, short_repr
from jaxplan.specs import load_gpu, load_model
from jaxplan.specs.lengths import read_lengths, relative_to, resolve_against
from jaxplan.specs.space import BLOCK_SIZES, DTYPE_BYTES, KV_CACHE_DTYPES, WEIGHT_DTYPES
from jaxplan.vllm_release import parse_release

# vLLM's names for the dtypes a row may give (its --dtype, --quantization and --kv-cache-dtype values):
# FP16 weights cost what BF16 ones do (2 bytes, the same tensor-core rate).
# vLLM's --dtype and --quantization names too: ModelOpt's FP8 ("modelopt") and FP4 ("modelopt_fp4"), AWQ and GPTQ (INT4 weight-only).
WEIGHT_DTYPE_ALIASES = {
    "bfloat16": "bf16", "float16": "bf16", "fp16": "bf16", "half": "bf16", "fp8_e4m3": "fp8", "modelopt": "fp8", "modelopt_fp4": "nvfp4",
    "int4_wo": "int4", "w4a16": "int4", "awq": "int4", "awq_marlin": "int4", "gptq": "int4", "gptq_marlin": "int4",
}  # fmt: skip
KV_CACHE_DTYPE_ALIASES = {"fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "bf16": "auto", "bfloat16": "auto"}
from jaxplan.specs.workload import MAX_LENGTH_SPREAD, SPREAD_RANGE, length_fields

INPUT_COLUMNS = (
    "model",
    "gpu",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_expert_parallel",
    "weight_dtype",
    "kv_cache_dtype",
    "isl",
    "osl",
    "concurrency",
    "request_rate",
    "num_prompts",
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "block_size",
    "vllm_version",
    "prefix_hit_rate",
    "enable_prefix_caching",
    "isl_distribution",
    "isl_spread",
    "osl_distribution",
    "osl_spread",
    "lengths_file",
    "gpu_hbm_bytes_override",
    "gpu_hbm_bandwidth_bytes_per_s_override",
)
MEASURED_COLUMNS = (
    "measured_ttft_ms_mean", "measured_tpot_ms_mean", "measured_output_tok_s", "measured_output_tok_s_derived",
    "measured_ttft_ms_p99", "measured_tpot_ms_p99",
)
PROVENANCE_COLUMNS = ("dataset", "backend", "source_id", "notes")
COLUMNS = INPUT_COLUMNS + MEASURED_COLUMNS + PROVENANCE_COLUMNS
# Columns jaxplan writes after the predict format: `predict`'s output (predict.OUTPUT_COLUMNS, then its
# uncertainty bands, bands.COLUMNS) and
# `calibrate --rows` (residuals.PREDICTION_COLUMNS). A file jaxplan wrote reads back as input (e.g. to
# predict it again with other parameters): these are recognised and their cells dropped, since they
# are what is about to be recomputed.
WRITTEN_COLUMNS = (
    "ttft_ms_mean", "ttft_ms_p99", "tpot_ms_mean", "tpot_ms_p99", "output_tok_s", "request_s", "kv_cache_tokens", "status",
    "fitted", "kv_fits", "held_out_ttft_ms_mean", "held_out_tpot_ms_mean", "replay_ttft_ms_mean", "replay_tpot_ms_mean",
    "replay_output_tok_s", *BAND_OUTPUT_COLUMNS,
)  # fmt: skip
REQUIRED_COLUMNS = ("model", "gpu", "tensor_parallel_size", "isl", "osl")
BACKENDS = ("vllm", "sglang", "trtllm")

DEFAULTS: dict[str, Any] = {
    "pipeline_parallel_size": 1,
    "data_parallel_size": 1,
    "enable_expert_parallel": False,
    "kv_cache_dtype": "auto",
    "prefix_hit_rate": 0.0,
    "enable_prefix_caching": True,
    "measured_output_tok_s_derived": False,
}
STRING_COLUMNS = frozenset({"model", "gpu", "weight_dtype", "kv_cache_dtype", "vllm_version", "isl_distribution", "osl_distribution", "lengths_file", "dataset", "backend", "source_id", "notes"})
INT_COLUMNS = frozenset({"tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "concurrency", "num_prompts", "max_num_seqs", "max_num_batched_tokens", "block_size"})
BOOL_COLUMNS = frozenset({"measured_output_tok_s_derived", "enable_expert_parallel", "enable_prefix_caching"})
# float column -> (low, high, fix); request_rate may also be inf.
FLOAT_RANGES = {
    "isl": (1.0, 1e7, "a mean token count in 1..10,000,000"),
    "osl": (1.0, 1e7, "a mean token count in 1..10,000,000"),
    "request_rate": (1e-6, 1e9, "requests/s > 0, or inf for all-at-once"),
    "prefix_hit_rate": (0.0, 0.999999, "a fraction in [0, 1)"),
    "gpu_memory_utilization": (0.05, 1.0, "a fraction of the GPU's memory in [0.05, 1] (vLLM's default is 0.9)"),
    "isl_spread": (0.0, MAX_LENGTH_SPREAD, SPREAD_RANGE),
    "osl_spread": (0.0, MAX_LENGTH_SPREAD, SPREAD_RANGE),
    "gpu_hbm_bytes_override": (1e9, 1e13, "HBM capacity in BYTES (e.g. 42949672960 for 40 GiB)"),
    "gpu_hbm_bandwidth_bytes_per_s_override": (1e10, 1e14, "HBM bandwidth in bytes/s (e.g. 1.555e12)"),
    "measured_ttft_ms_mean": (1e-3, 1e8, "a positive time in ms"),
    "measured_tpot_ms_mean": (1e-3, 1e6, "a positive time in ms"),
    "measured_ttft_ms_p99": (1e-3, 1e8, "a positive time in ms"),
    "measured_tpot_ms_p99": (1e-3, 1e6, "a positive time in ms"),
    "measured_output_tok_s": (1e-6, 1e9, "a positive output tokens/s"),
}
INT_MAX = 10_000_000


def _canonical_model(value: str) -> str:
    """Bundled name for a bundled name / HF id / alias (a quantised checkpoint's id too: its format
    is the row's weight_dtype); config paths are kept as given."""
    spec = load_model(value)
    if value.endswith((".json", ".toml")) or Path(value).expanduser().exists():
        return value
    return spec.name


def check_row(row: dict, where: str) -> dict:
    """Validate one typed row in place (fills defaults, canonical model/GPU names, COLUMNS order); returns it.

    Raises a one-line PlanError `where: column = value: fix`.
    """
    unknown = set(row) - set(COLUMNS)
    if unknown:
        column = sorted(unknown)[0]
        close = difflib.get_close_matches(column, COLUMNS, n=1)
        raise PlanError(f"{where}: unknown column {short_repr(column)}" + (f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(COLUMNS)}"))
    for column in COLUMNS:
        if row.get(column) is None:
            row[column] = DEFAULTS.get(column)
    if length_fields(row, where)["lengths_file"]:  # the rule workloads and predict rows follow
        _fill_means_from_lengths_file(row)
    for column in REQUIRED_COLUMNS:
        if row[column] is None or row[column] == "":
            raise bad_value(column, row[column], "is required; fill it in", where=where)
    for column in STRING_COLUMNS:
        if row[column] is not None and not isinstance(row[column], str):
            raise bad_value(column, row[column], "must be text", where=where)
        if row[column] and any(ord(ch) < 32 and ch != "\t" or ord(ch) == 127 for ch in row[column]):
            raise bad_value(column, row[column], "contains a control character (NUL, line break, ...); remove it", where=where)
    try:
        if row["weight_dtype"] in (None, ""):  # what vLLM serves the checkpoint in
            row["weight_dtype"] = load_model(row["model"]).served_weight_dtype
        row["model"] = _canonical_model(row["model"])
        row["gpu"] = load_gpu(row["gpu"]).name
    except PlanError as err:
        raise PlanError(f"{where}: {err}") from None
    for column in INT_COLUMNS:
        value = row[column]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= INT_MAX:
            raise bad_value(column, value, f"must be an integer in 1..{INT_MAX:,}", where=where)
        row[column] = int(value)
    for column, (low, high, fix) in FLOAT_RANGES.items():
        value = row[column]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise bad_value(column, value, f"must be {fix}", where=where)
        value = float(value)
        if column == "request_rate" and value == math.inf:
            row[column] = value
            continue
        if not math.isfinite(value) or not low <= value <= high:
            raise bad_value(column, value, f"must be {fix}", where=where)
        row[column] = value
    for column in BOOL_COLUMNS:
        if not isinstance(row[column], (bool, np.bool_)):
            raise bad_value(column, row[column], "must be true or false", where=where)
        row[column] = bool(row[column])
    for column, aliases in (("weight_dtype", WEIGHT_DTYPE_ALIASES), ("kv_cache_dtype", KV_CACHE_DTYPE_ALIASES)):
        if isinstance(row[column], str):  # vLLM's own spellings, any case
            row[column] = aliases.get(row[column].strip().lower(), row[column].strip().lower())
    if row["weight_dtype"] not in WEIGHT_DTYPES:
        raise bad_value("weight_dtype", row["weight_dtype"], f"use one of {', '.join(WEIGHT_DTYPES)} (NVFP4 is nvfp4, OCP MXFP4 mxfp4, INT4 weight-only int4)", where=where)
    if row["kv_cache_dtype"] not in KV_CACHE_DTYPES:
        raise bad_value("kv_cache_dtype", row["kv_cache_dtype"], f"use one of {', '.join(KV_CACHE_DTYPES)} (auto = same as the model's bf16)", where=where)
    if row["backend"] not in (None, "", *BACKENDS):
        raise bad_value("backend", row["backend"], f"use one of {', '.join(BACKENDS)} or leave empty", where=where)
    if row["vllm_version"]:
        parse_release(row["vllm_version"], where=where)
    if row["block_size"] is not None and row["block_size"] not in BLOCK_SIZES:
        raise bad_value("block_size", row["block_size"], f"use one of {', '.join(map(str, BLOCK_SIZES))} (vLLM's --block-size)", where=where)
    if row["prefix_hit_rate"] and not row["enable_prefix_caching"]:
        raise bad_value("prefix_hit_rate", row["prefix_hit_rate"], "needs vLLM's prefix cache: set enable_prefix_caching true, or prefix_hit_rate 0", where=where)
    if row["concurrency"] is None and row["request_rate"] is None:
        raise bad_value("concurrency", None, "give concurrency (closed loop) or request_rate (requests/s, inf = burst)", where=where)
    if row["request_rate"] == math.inf and row["concurrency"] is None and row["num_prompts"] is None and not row["lengths_file"]:
        raise bad_value("num_prompts", None, "request_rate = inf (all requests at once) needs num_prompts (or a lengths_file, whose requests it sends)", where=where)
    ordered = {column: row[column] for column in COLUMNS}
    row.clear()
    row.update(ordered)
    return row


def _fill_means_from_lengths_file(row: dict) -> None:
    """A row with a lengths_file (checked by `length_fields`): blank isl/osl become the file's means."""
    means = read_lengths(row["lengths_file"]).means()  # cached by length_fields' read
    for side, mean in zip(("isl", "osl"), means):
        if row[side] is None or row[side] == "":
            row[side] = mean


def make_row(**fields) -> dict:
    """A validated row from keyword arguments (missing columns get defaults / None)."""
    return check_row(dict(fields), where=f"row {fields.get('source_id') or fields.get('model')!s}")


# --- CSV ------------------------------------------------------------------------------------------


def _format_cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value == math.inf:
            return "inf"
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return repr(value)
    return str(value)


def write_predict_csv(rows, path: str | Path, extra_columns: tuple[str, ...] = (), *, drop_blank: bool = False) -> None:
    """Validate `rows` (list of dicts) and write them with the header `COLUMNS` + `extra_columns`
    (e.g. the prediction columns, floats to 6 significant digits: float32 arithmetic gives no more).

    drop_blank: leave out the optional columns that are blank in every row (a prediction's output keeps
    the columns its input used, not every column the format knows)."""
    checked = [
        {**check_row({k: v for k, v in row.items() if k not in extra_columns}, where=f"{path}: rows[{index}]"), **{c: _significant(row.get(c)) for c in extra_columns}}
        for index, row in enumerate(rows)
    ]
    for row in checked:  # lengths files beside the CSV are written relative to it (read_predict_csv resolves them)
        if row["lengths_file"]:
            row["lengths_file"] = relative_to(row["lengths_file"], Path(path).parent)
    columns = COLUMNS
    if drop_blank:
        used = {c for row in checked for c in COLUMNS if row[c] is not None}
        if "measured_output_tok_s" not in used:
            used.discard("measured_output_tok_s_derived")  # a flag about a column that is not there
        columns = tuple(c for c in COLUMNS if c in used or c in REQUIRED_COLUMNS)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(columns + tuple(extra_columns))
        for row in checked:
            writer.writerow([_format_cell(row[c]) for c in columns + tuple(extra_columns)])


def _significant(value, digits: int = 6):
    """A float to `digits` significant digits (other values unchanged)."""
    if isinstance(value, float) and math.isfinite(value):
        return float(f"{value:.{digits}g}")
    return value


def parse_bool(column: str, text: str, where: str) -> bool:
    """A true/false cell or --metadata value as text (true/1/yes, false/0/no, any case)."""
    if text.strip().lower() in ("true", "1", "yes"):
        return True
    if text.strip().lower() in ("false", "0", "no"):
        return False
    raise bad_value(column, text, "must be true or false", where=where)


def _parse_cell(column: str, text: str, where: str):
    text = text.strip()
    if text == "":
        return None
    if column in STRING_COLUMNS:
        return text
    if column in BOOL_COLUMNS:
        return parse_bool(column, text, where)
    if column in INT_COLUMNS:
        try:
            number = float(text)
        except ValueError:
            raise bad_value(column, text, f"must be an integer in 1..{INT_MAX:,}", where=where) from None
        if not math.isfinite(number) or not number.is_integer():
            raise bad_value(column, text, f"must be an integer in 1..{INT_MAX:,}", where=where)
        return int(number)
    try:
        return math.inf if text.lower() in ("inf", "infinity") else float(text)
    except ValueError:
        raise bad_value(column, text, f"must be {FLOAT_RANGES[column][2]}", where=where) from None


def read_predict_csv(path: str | Path) -> list[dict]:
    """Read and validate a predict CSV; every problem is a one-line PlanError naming file, line, column, value, fix."""
    path = Path(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:  # utf-8-sig: a spreadsheet's BOM
            lines = list(csv.reader(handle))
    except OSError as err:
        raise PlanError(f"{path}: cannot read ({err.strerror}); give an existing CSV file") from None
    except UnicodeDecodeError as err:
        raise PlanError(f"{path}: byte {err.start}: not UTF-8 text ({err.reason}); save the CSV as UTF-8") from None
    except csv.Error as err:
        raise PlanError(f"{path}: not a readable CSV ({err}); check the quoting and the line lengths") from None
    lines = [line for line in lines if any(cell.strip() for cell in line)]
    if not lines:
        raise PlanError(f"{path}: empty file; the first line must name the columns ({', '.join(REQUIRED_COLUMNS)}, concurrency or request_rate, ...)")
    header = [cell.strip() for cell in lines[0]]
    seen = set()
    for column in header:
        if column in seen:
            raise PlanError(f"{path}: line 1: column {short_repr(column)} appears twice; keep one")
        seen.add(column)
        if column not in COLUMNS and column not in WRITTEN_COLUMNS:
            close = difflib.get_close_matches(column, COLUMNS, n=1)
            raise PlanError(f"{path}: line 1: unknown column {short_repr(column)}" + (f"; did you mean {close[0]!r}?" if close else f"; known columns: {', '.join(COLUMNS)}"))
    missing = [c for c in REQUIRED_COLUMNS if c not in seen]
    if missing:
        raise PlanError(f"{path}: line 1: missing required column(s) {', '.join(missing)}; add them to the header")
    if "concurrency" not in seen and "request_rate" not in seen:
        raise PlanError(f"{path}: line 1: needs a concurrency or a request_rate column; add one")
    rows = []
    for number, cells in enumerate(lines[1:], start=2):
        where = f"{path}: line {number}"
        if len(cells) != len(header):
            raise PlanError(f"{where}: has {len(cells)} cells but the header has {len(header)}; check for a stray or missing comma")
        row = {column: _parse_cell(column, cell, where) for column, cell in zip(header, cells) if column not in WRITTEN_COLUMNS}
        if row.get("lengths_file"):  # relative to the CSV's folder, as a workload TOML's is to its own
            row["lengths_file"] = resolve_against(row["lengths_file"], path.parent)
        rows.append(check_row(row, where))
    return rows


# --- arrays for fitting ---------------------------------------------------------------------------


class ServingArrays(NamedTuple):
    """Rows as numpy arrays [R] in SI units; NaN where a value is missing."""

    model: np.ndarray  # str
    gpu: np.ndarray  # str
    tensor_parallel_size: np.ndarray  # int64
    pipeline_parallel_size: np.ndarray  # int64
    data_parallel_size: np.ndarray  # int64
    weight_bytes_per_element: np.ndarray  # float64: 2 (bf16) | 1 (fp8) | 0.5625 (nvfp4)
    kv_bytes_per_element: np.ndarray  # int64: 2 (auto) | 1 (fp8)
    isl_tokens: np.ndarray  # float64: mean input tokens per request
    osl_tokens: np.ndarray  # float64: mean output tokens per request
    concurrency: np.ndarray  # float64 (NaN = open loop)
    request_rate_per_s: np.ndarray  # float64 (NaN = closed loop, inf = burst)
    num_prompts: np.ndarray  # float64 (NaN = unknown)
    ttft_s: np.ndarray  # float64: measured mean time to first token
    tpot_s: np.ndarray  # float64: measured mean time per output token
    output_tokens_per_s: np.ndarray  # float64: measured (or derived) output throughput
    output_tokens_per_s_derived: np.ndarray  # bool


def serving_arrays(rows) -> ServingArrays:
    """Stack rows (validated or not) into `ServingArrays`; ms become seconds."""
    def column(name, scale=1.0):
        return np.array([np.nan if r.get(name) is None else float(r[name]) * scale for r in rows], dtype=np.float64)

    return ServingArrays(
        model=np.array([r["model"] for r in rows], dtype=str),
        gpu=np.array([r["gpu"] for r in rows], dtype=str),
        tensor_parallel_size=np.array([r["tensor_parallel_size"] for r in rows], dtype=np.int64),
        pipeline_parallel_size=np.array([r.get("pipeline_parallel_size") or 1 for r in rows], dtype=np.int64),
        data_parallel_size=np.array([r.get("data_parallel_size") or 1 for r in rows], dtype=np.int64),
        weight_bytes_per_element=np.array([DTYPE_BYTES[r.get("weight_dtype") or "bf16"] for r in rows], dtype=np.float64),
        kv_bytes_per_element=np.array([DTYPE_BYTES[r.get("kv_cache_dtype") or "auto"] for r in rows], dtype=np.int64),
        isl_tokens=column("isl"),
        osl_tokens=column("osl"),
        concurrency=column("concurrency"),
        request_rate_per_s=column("request_rate"),
        num_prompts=column("num_prompts"),
        ttft_s=column("measured_ttft_ms_mean", 1e-3),
        tpot_s=column("measured_tpot_ms_mean", 1e-3),
        output_tokens_per_s=column("measured_output_tok_s"),
        output_tokens_per_s_derived=np.array([bool(r.get("measured_output_tok_s_derived")) for r in rows], dtype=bool),
    )


__all__ = [
    "COLUMNS",
    "INPUT_COLUMNS",
    "WRITTEN_COLUMNS",
    "MEASURED_COLUMNS",
    "PROVENANCE_COLUMNS",
    "REQUIRED_COLUMNS",
    "ServingArrays",
    "check_row",
    "make_row",
    "read_predict_csv",
    "serving_arrays",
    "write_predict_csv",
]
