"""Fuzz the command line: mutated CSV and JSON inputs and mutated argument lists, through typer's CliRunner.

Every case must end with exit code 0 (it ran), 1 (bad input, a usage error included: one stderr line
`error: ...` naming the file or the option), 2 (an empty sweep whose one-line explanation names the
sieve) or 3 (stopped by --max-seconds, one line). Exit code 70 (internal error), a traceback, an
exception escaping the command, a hang, or a NaN/inf in a written CSV fails the test with the case
that caused it.

Families (seeded `random.Random`, reproducible; the `slow` tests try 10x as many, opt in with --run-slow):
  predict CSV, analytical     mutated cells, headers and bytes of 5 base files        N_PREDICT   =   800
  measurement CSV, calibrate  mutated cells/headers/bytes of a measured-rows file      N_MEASURED  =   300
  vllm bench serve JSON       mutated keys/values/bytes of 3 --save-result files        N_JSON      =   600
  argument lists              one or two options of each command set to junk           N_ARGS      =   600
  predict/simulate replay     extreme-but-valid rows (--requests 10), real replays      N_REPLAY    =     7
  calibrate, real fit         valid JSON/CSV files through the real optax fit           N_REAL_FIT  =     1
The calibrate families run the command with the fit replaced by a stub that builds the fit's row
batches (every field the fit reads is validated there) and predicts each usable row, because the
real fit compiles once per (GPUs, models, row bucket), which mutated files vary (see docs/reliability.md);
N_REAL_FIT files go through the real fit.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import random
import tomllib
from pathlib import Path
from unittest import mock

import pytest
import typer.main
from typer.testing import CliRunner

from jaxplan.calibrate.rows import COLUMNS
from jaxplan.cli import app
from jaxplan.prediction import OUTPUT_COLUMNS
from time_limit import Hang, time_limit

REPO = Path(__file__).resolve().parents[1]
HANG_SECONDS = 240.0  # a first call compiles (~15 s on 2 busy cores); 16x that is a hang
N_PREDICT, N_MEASURED, N_JSON, N_ARGS, N_REPLAY, N_REAL_FIT = 800, 300, 600, 600, 7, 1
SLOW = 10

runner = CliRunner()
_COMMAND = []


def _command(app_):
    """typer rebuilds the click command from the app on every invoke (~30 ms); build it once."""
    if not _COMMAND:
        _COMMAND.append(typer.main.get_command(app_))
    return _COMMAND[0]


# Names a one-line error may use for "the field": CSV columns, JSON keys, options, or the file itself.
OPTIONS = (
    "--model", "--gpus", "--workload", "--space", "--budget", "--target-throughput", "--rate", "--top", "--price",
    "--chunk-size", "--params", "--replay-requests", "--seed", "--json", "--requests", "--method", "--output", "-o",
    "--measurements", "--report", "--steps", "--max-seconds", "--max-memory-gib", "--held-out-folds", "INPUT_CSV",
    "--gpu", "--tensor-parallel-size", "--kv-cache-dtype", "--rows",
)
JSON_KEYS = (
    "model", "model_id", "gpu", "tensor_parallel_size", "tp", "num_prompts", "request_rate", "max_concurrency", "completed",
    "total_input_tokens", "total_output_tokens", "mean_ttft_ms", "mean_tpot_ms", "output_throughput", "burstiness", "failed",
)


def invoke(args: list[str], label: str):
    """Run the CLI; fail on a hang, an escaped exception, a traceback or exit code 70 (a bug)."""
    try:
        with time_limit(HANG_SECONDS), mock.patch("typer.testing._get_command", _command):
            result = runner.invoke(app, args)
    except Hang:
        pytest.fail(f"{label}: hang (> {HANG_SECONDS} s): {args}")
    output = result.stdout + result.stderr
    assert "Traceback" not in output, f"{label}: traceback\n{output[-2000:]}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        pytest.fail(f"{label}: {type(result.exception).__name__} escaped the command: {result.exception!s:.300}; args {args}")
    assert result.exit_code in (0, 1, 2, 3), f"{label}: exit code {result.exit_code}: {result.stderr.strip()[:600]}; args {args}"
    if result.exit_code == 1:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, f"{label}: {len(lines)} stderr lines for bad input: {result.stderr[:600]!r}"
        assert lines[0].startswith("error: "), f"{label}: {lines[0][:300]!r}"
        assert len(lines[0]) < 3000, f"{label}: {len(lines[0])}-char error line"
        if lines[0].endswith("--help')"):  # a usage error (click's parser): it names the option or argument
            named = any(o in lines[0] for o in OPTIONS) or any(s in lines[0] for s in ("input_csv", "'files'", "No such option", "Got unexpected extra argument", "No such command"))
            assert named, f"{label}: usage error names no option: {lines[0][:600]!r}"
    elif result.exit_code == 2:
        err = result.stderr
        empty = [line for line in err.splitlines() if line.removeprefix("error: ").startswith("no configuration survived")]
        assert len(empty) == 1, f"{label}: exit 2 without a one-line empty-result explanation: {err[-600:]!r}"
        assert "stage " in empty[0] and "To relax:" in empty[0], f"{label}: {empty[0]!r}"
    elif result.exit_code == 3:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "--max-seconds" in lines[0], f"{label}: {result.stderr[:600]!r}"
    return result


def error_line(result) -> str:
    return result.stderr.strip()


def names_a_field(message: str, path: Path | None, fields) -> bool:
    where = path is None or str(path) in message or path.name in message
    lower = message.lower()
    return where and (any(f.lower() in lower for f in fields) or any(s in message for s in ("line ", "rows = ", "byte ", "empty file", "CSV", "JSON")))


def check_output_csv(path: Path, rows_in: int, label: str) -> None:
    """The written CSV: one row per input row, every prediction finite or empty, no NaN anywhere."""
    with open(path, newline="") as handle:
        table = list(csv.DictReader(handle))
    assert len(table) == rows_in, f"{label}: {len(table)} output rows for {rows_in} input rows"
    for i, row in enumerate(table):
        assert row["status"], f"{label}: row {i} has no status"
        for column in OUTPUT_COLUMNS[:-1]:
            cell = row[column]
            if cell:
                assert math.isfinite(float(cell)), f"{label}: row {i} {column} = {cell}"
        if row["status"] == "ok":
            assert all(row[c] for c in ("ttft_ms_mean", "output_tok_s")), f"{label}: row {i} ok without predictions"  # TPOT: empty when OSL = 1
        for column, cell in row.items():
            assert cell.strip().lower() not in ("nan", "-inf", "-infinity"), f"{label}: row {i} {column} = {cell}"
            if cell.strip().lower() in ("inf", "infinity"):
                assert column == "request_rate", f"{label}: row {i} {column} = {cell}"


# ---- CSV mutation ---------------------------------------------------------------------------------

PREDICT_BASES = {
    "dense": [
        ["model", "gpu", "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size", "weight_dtype", "kv_cache_dtype", "isl", "osl", "concurrency", "request_rate", "num_prompts", "max_num_seqs", "max_num_batched_tokens", "prefix_hit_rate"],
        ["llama-3.1-8b", "h100_sxm", "1", "1", "2", "bf16", "auto", "1000", "200", "16", "", "", "256", "8192", "0.1"],
        ["llama-3.1-8b", "a100_sxm", "2", "1", "1", "fp8", "fp8", "4000", "500", "", "2.5", "", "", "", ""],
        ["llama-3.1-8b", "h200_sxm", "1", "2", "1", "bf16", "auto", "2000", "300", "", "inf", "500", "128", "4096", "0"],
    ],
    "moe": [
        ["model", "gpu", "tensor_parallel_size", "isl", "osl", "request_rate", "num_prompts", "kv_cache_dtype"],
        ["qwen3-30b-a3b", "h100_sxm", "2", "3000", "400", "4", "", "fp8"],
        ["qwen3-30b-a3b", "mi300x", "1", "512", "2048", "inf", "64", "auto"],
    ],
    "minimal": [
        ["model", "gpu", "tensor_parallel_size", "isl", "osl", "concurrency"],
        ["meta-llama/Llama-3.1-8B", "l40s", "1", "128", "128", "1"],
    ],
    "variant": [
        ["model", "gpu", "tensor_parallel_size", "isl", "osl", "concurrency", "gpu_hbm_bytes_override", "gpu_hbm_bandwidth_bytes_per_s_override", "isl_distribution", "isl_spread", "osl_distribution", "osl_spread"],
        ["llama-3.1-8b", "a100_sxm", "1", "1000", "200", "8", "42949672960", "1.555e12", "lognormal", "1.1", "uniform", "0.5"],
    ],
    "lengths": [  # files beside the CSV (write_lengths_files): a CSV of lengths and a --save-detailed bench result
        ["model", "gpu", "tensor_parallel_size", "isl", "osl", "request_rate", "num_prompts", "lengths_file"],
        ["llama-3.1-8b", "h100_sxm", "1", "", "", "inf", "", "lengths.csv"],
        ["llama-3.1-8b", "h100_sxm", "1", "300", "", "2", "40", "bench.json"],
    ],
}
MEASURED_BASE = [
    ["model", "gpu", "tensor_parallel_size", "isl", "osl", "concurrency", "request_rate", "num_prompts", "measured_ttft_ms_mean", "measured_tpot_ms_mean", "measured_output_tok_s", "backend", "dataset"],
    ["llama-3.1-8b", "h100_sxm", "1", "1000", "200", "16", "", "", "100", "10", "1500", "vllm", "mine"],
    ["llama-3.1-8b", "h100_sxm", "2", "4000", "300", "", "3", "300", "250.5", "12.25", "", "vllm", "mine"],
]

JUNK = [
    "", " ", "nan", "NaN", "inf", "-inf", "Infinity", "-1", "0", "0.0", "-0", "1e30", "1e308", "1e309", "1e-30", "1.5", "2.5e3",
    "abc", "true", "false", "None", "null", "[1]", "{}", "0x10", "1_000", "１２", "1,000", "9" * 400, "x" * 5000, "\u00e9t\u00e9", "\t",
    "h100_sxm", "llama-3.1-8b", "../../etc/passwd", "config.json", "-", "--", "=1+1", "'", "\\",
]
PLAUSIBLE = {
    "model": ["llama-3.1-8b", "meta-llama/Llama-3.1-8B", "Llama-3.1-8B", "llama-3.1-7b", "llama", "gpt-5", "qwen3-30b-a3b", "/nonexistent/config.json", "x.toml", "deepseek"],
    "gpu": ["h100_sxm", "H100_SXM", "h100", "h100_sx", "a100_sxm", "b200_sxm", "l40s", "mi300x", "tpu-v5", "h100_sxm,h200_sxm"],
    "tensor_parallel_size": ["1", "2", "3", "4", "5", "7", "8", "16", "64", "1024", "10000000", "10000001", "1.0", "2.0"],
    "pipeline_parallel_size": ["1", "2", "3", "5", "31", "32", "33", "10000000"],
    "data_parallel_size": ["1", "3", "1000", "10000000"],
    "weight_dtype": ["bf16", "fp8", "fp16", "int4", "BF16", "auto"],
    "kv_cache_dtype": ["auto", "fp8", "bf16", "fp8_e5m2", "int8", "FP8"],
    "isl": ["1", "1.5", "0.5", "100000", "131072", "200000", "10000000", "10000001"],
    "osl": ["1", "2", "0.999", "50000", "131072", "10000000"],
    "concurrency": ["1", "2", "100000", "10000000", "10000001", "0"],
    "request_rate": ["1e-6", "1e-7", "0.001", "1000", "1e9", "1e10", "inf", "INF"],
    "num_prompts": ["1", "2", "10000000", "10000001"],
    "max_num_seqs": ["1", "2", "100000", "10000000"],
    "max_num_batched_tokens": ["1", "2", "16", "100000", "10000000"],
    "prefix_hit_rate": ["0", "0.5", "0.999999", "0.9999999", "1", "1.0"],
    "gpu_hbm_bytes_override": ["1e9", "42949672960", "1e13", "1e14", "40"],
    "gpu_hbm_bandwidth_bytes_per_s_override": ["1e10", "1.555e12", "1e14", "1e15"],
    "measured_ttft_ms_mean": ["1e-3", "0.0005", "1e8", "1e9", "100"],
    "measured_tpot_ms_mean": ["1e-3", "1e6", "1e7", "10"],
    "measured_output_tok_s": ["1e-6", "1e9", "1e10"],
    "measured_output_tok_s_derived": ["true", "false", "yes", "no", "1", "0", "maybe"],
    "backend": ["vllm", "sglang", "trtllm", "tgi", ""],
    "lengths_file": ["lengths.csv", "bench.json", "bench.json#0", "bench.json#1", "bench.json#\u00b2", "missing.csv", "lengths.txt", "../lengths.csv", "/", "in0.csv"],
}


def write_lengths_files(folder: Path) -> None:
    """The files the "lengths" base names, relative to the CSVs in `folder`."""
    (folder / "lengths.csv").write_text("input_tokens,output_tokens\n" + "".join(f"{10 + 37 * k % 900},{1 + 13 * k % 300}\n" for k in range(60)))
    (folder / "bench.json").write_text(json.dumps({"input_lens": [120, 800, 33, 2000], "output_lens": [40, 0, 250, 90]}))


def mutate_table(table: list[list[str]], rng: random.Random) -> list[list[str]]:
    """One structured mutation of a CSV table (header + rows)."""
    table = [list(r) for r in table]
    header = table[0]
    kind = rng.choice(["cell", "cell", "cell", "cell", "cell", "plausible", "plausible", "plausible", "drop_column", "dup_column", "rename_column", "add_column", "drop_cell", "add_cell", "drop_row", "dup_row", "swap_columns", "header_only", "blank_row"])
    r = rng.randrange(1, len(table)) if len(table) > 1 else 0
    c = rng.randrange(len(header))
    c = min(c, len(table[r]) - 1) if kind in ("cell", "plausible", "drop_cell", "add_cell") else c  # rows may be short
    if c < 0:
        return table
    if kind == "cell":
        table[r][c] = rng.choice(JUNK)
    elif kind == "plausible":
        column = header[c] if c < len(header) else ""
        table[r][c] = rng.choice(PLAUSIBLE.get(column, JUNK))
    elif kind == "drop_column":
        for row in table:
            if c < len(row):
                del row[c]
    elif kind == "dup_column":
        for row in table:
            row.append(row[c] if c < len(row) else "")
    elif kind == "rename_column":
        header[c] = rng.choice([header[c][:-1], header[c].upper(), header[c] + " ", header[c].replace("_", "-"), "tp", "model_id", "", "measured_ttft_ms", "gpu_type"])
    elif kind == "add_column":
        header.append(rng.choice(["extra", "comment", "seed", "max_model_len", "", "measured_ttft_ms_p99"]))
        for row in table[1:]:
            row.append(rng.choice(JUNK))
    elif kind == "drop_cell":
        del table[r][c]
    elif kind == "add_cell":
        table[r].insert(c, rng.choice(JUNK))
    elif kind == "drop_row" and len(table) > 2:
        del table[r]
    elif kind == "dup_row":
        table.insert(r, list(table[r]))
    elif kind == "swap_columns":
        d = rng.randrange(len(header))
        header[c], header[d] = header[d], header[c]
    elif kind == "header_only":
        table = table[:1]
    elif kind == "blank_row":
        table.insert(r, [""] * len(header))
    return table


def csv_bytes(table: list[list[str]]) -> bytes:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(table)
    return buffer.getvalue().encode()


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    kind = rng.choice(["truncate", "flip", "bad_utf8", "bom", "nul", "crlf", "quote", "delete_line", "empty", "binary", "latin1", "huge_line"])
    if kind == "truncate":
        return data[: rng.randrange(len(data) + 1)]
    if kind == "flip":
        out = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    if kind == "bad_utf8":
        i = rng.randrange(len(data) + 1)
        return data[:i] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"]) + data[i:]
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "nul":
        i = rng.randrange(len(data) + 1)
        return data[:i] + b"\x00" + data[i:]
    if kind == "crlf":
        return data.replace(b"\n", b"\r\n")
    if kind == "quote":
        i = rng.randrange(len(data) + 1)
        return data[:i] + b'"' + data[i:]
    if kind == "delete_line":
        lines = data.split(b"\n")
        del lines[rng.randrange(len(lines))]
        return b"\n".join(lines)
    if kind == "empty":
        return rng.choice([b"", b"\n", b"   \n\n", b","])
    if kind == "binary":
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    if kind == "latin1":
        return data.decode().replace("llama", "ll\u00e0ma").encode("latin-1", errors="replace")
    return data + b"x" * 200_000 + b"\n"


def mutated_csv(base: list[list[str]], rng: random.Random) -> bytes:
    if rng.random() < 0.2:
        return mutate_bytes(csv_bytes(base), rng)
    table = base
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        table = mutate_table(table, rng)
    return csv_bytes(table)


def data_rows(data: bytes) -> int:
    """Rows the CSV reader sees (non-blank lines after the header); -1 if it cannot parse."""
    try:
        lines = [line for line in csv.reader(io.StringIO(data.decode())) if any(cell.strip() for cell in line)]
    except (UnicodeDecodeError, csv.Error):
        return -1
    return max(len(lines) - 1, 0)


# ---- predict, analytical --------------------------------------------------------------------------


def run_predict_cases(tmp_path: Path, n: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    write_lengths_files(tmp_path)
    counts = {0: 0, 1: 0, 2: 0}
    for case in range(n):
        name = rng.choice(sorted(PREDICT_BASES))
        data = mutated_csv(PREDICT_BASES[name], rng)
        path, out = tmp_path / f"in{case}.csv", tmp_path / f"out{case}.csv"
        path.write_bytes(data)
        label = f"predict seed {seed} case {case} ({name}): {data[:300]!r}"
        result = invoke(["predict", str(path), "-o", str(out), "--method", "analytical"], label)
        counts[result.exit_code] += 1
        if result.exit_code == 0:
            check_output_csv(out, data_rows(data), label)
        else:
            assert result.exit_code == 1, f"{label}: exit {result.exit_code}"
            assert names_a_field(error_line(result), path, COLUMNS), f"{label}: {error_line(result)[:400]!r}"
    return counts


def test_fuzz_predict_csv_analytical(tmp_path):
    counts = run_predict_cases(tmp_path, N_PREDICT, seed=1)
    # The mutations must exercise both outcomes, or the fuzz tests nothing.
    assert counts[0] > N_PREDICT // 10 and counts[1] > N_PREDICT // 3, counts


@pytest.mark.slow
def test_fuzz_predict_csv_analytical_long(tmp_path):
    run_predict_cases(tmp_path, N_PREDICT * SLOW, seed=2)


# ---- predict / simulate, replay (each valid row is a real replay: few cases) -----------------------

REPLAY_ROWS = [  # extreme but valid: every one must give a finite prediction or a clear status
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": "1", "isl": "1", "osl": "1", "concurrency": "1"},
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": "1", "isl": "1.5", "osl": "2.5", "request_rate": "1e-6"},
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": "1", "isl": "100", "osl": "10", "request_rate": "1e9"},
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": "1", "isl": "100", "osl": "10", "request_rate": "inf", "num_prompts": "1"},
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": "1", "isl": "100000", "osl": "10", "concurrency": "4", "max_num_batched_tokens": "16", "max_num_seqs": "1"},
    {"model": "llama-3.1-8b", "gpu": "l40s", "tensor_parallel_size": "1", "isl": "200", "osl": "20", "concurrency": "8", "prefix_hit_rate": "0.999999", "data_parallel_size": "3"},
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": "1", "isl": "", "osl": "", "request_rate": "inf", "lengths_file": "bench.json"},
    {"model": "llama-3.1-70b", "gpu": "l40s", "tensor_parallel_size": "1", "isl": "200", "osl": "20", "concurrency": "8"},
    {"model": "llama-3.1-8b", "gpu": "h100_sxm", "tensor_parallel_size": "1", "isl": "50", "osl": "5", "concurrency": "10000000"},
]


def run_replay_cases(tmp_path: Path, rows: list[dict]) -> None:
    write_lengths_files(tmp_path)
    for case, row in enumerate(rows):
        path, out = tmp_path / f"replay{case}.csv", tmp_path / f"replay_out{case}.csv"
        path.write_bytes(csv_bytes([list(row), list(row.values())]))
        # --max-seconds: a replay of 10^7 clients fits some machines' memory and then runs for minutes
        command = ["predict" if case % 2 == 0 else "simulate", str(path), "-o", str(out), "--requests", "10", "--max-seconds", "60"]
        label = f"replay case {case}: {row}"
        result = invoke(command, label)
        assert result.exit_code in (0, 1), f"{label}: exit {result.exit_code}"
        if result.exit_code == 0:
            check_output_csv(out, 1, label)
        else:
            assert names_a_field(error_line(result), None, [*COLUMNS, "--requests", "--max-seconds"]), f"{label}: {error_line(result)!r}"


def test_fuzz_replay_rows(tmp_path):
    run_replay_cases(tmp_path, REPLAY_ROWS[:N_REPLAY])


@pytest.mark.slow
def test_fuzz_replay_rows_long(tmp_path):
    rng = random.Random(3)
    rows = list(REPLAY_ROWS)
    for _ in range(40):
        row = dict(rng.choice(REPLAY_ROWS))
        column = rng.choice([c for c in PLAUSIBLE if c in row or c in ("data_parallel_size", "max_num_seqs", "prefix_hit_rate")])
        row[column] = rng.choice(PLAUSIBLE[column])
        rows.append(row)
    run_replay_cases(tmp_path, rows)


# ---- calibrate: measurement CSVs and vllm bench serve JSON ----------------------------------------


@pytest.fixture
def stub_fit(monkeypatch):
    install_stub_fit(monkeypatch)


def install_stub_fit(monkeypatch):
    """Replace the optax fit by what it reads: the fit's row batches (validating every field it
    uses) and a prediction of every usable row; return the bundled parameters."""
    from jaxplan.calibrate import run
    from jaxplan.calibrate.fit import fit_data
    from jaxplan.physics.params import load_efficiency
    from jaxplan.prediction import predict_rows
    from jaxplan.specs import known

    def fake(rows, *, data_root=None, steps=None, log=print, folds=1, held_out_predictions=None, moe_rows=None):
        usable = run.measured_rows([r for r in rows if r.get("backend") == run.FIT_BACKEND])
        gpus = sorted({r["gpu"] for r in usable})
        if usable:
            data = fit_data(usable, gpus)
            for ttft, tpot in zip(data.ttft_s, data.tpot_s):
                assert all(math.isfinite(x) and x > 0 for x in [*ttft, *tpot])
            for row in predict_rows(usable, source="measurements"):
                for column in OUTPUT_COLUMNS[:-1]:
                    assert row[column] is None or math.isfinite(row[column]), (column, row)
        bundled = load_efficiency()
        return {g: dict(bundled.get(g, {})) for g in known("gpus")}, {"fit_backend": run.FIT_BACKEND, "fit_rows": len(usable), "fit_rows_kv_fits": len(usable)}

    monkeypatch.setattr(run, "calibrate", fake)


def run_calibrate(path: Path, out: Path, label: str, extra_fields=()):
    result = invoke(["calibrate", "--measurements", str(path), "--no-shared-data", "--steps", "5", "-o", str(out)], label)
    if result.exit_code == 0:
        written = tomllib.loads(out.read_text())
        for gpu, values in written["gpu"].items():
            assert all(math.isfinite(v) for v in values.values()), f"{label}: non-finite parameter for {gpu}: {values}"
    else:
        assert result.exit_code == 1, f"{label}: exit {result.exit_code}"
        assert names_a_field(error_line(result), path, [*COLUMNS, *JSON_KEYS, *extra_fields]), f"{label}: {error_line(result)[:400]!r}"
    return result


def run_measured_cases(tmp_path: Path, n: int, seed: int) -> dict[int, int]:
    rng = random.Random(seed)
    counts = {0: 0, 1: 0}
    for case in range(n):
        data = mutated_csv(MEASURED_BASE, rng)
        path = tmp_path / f"measured{case}.csv"
        path.write_bytes(data)
        result = run_calibrate(path, tmp_path / f"params{case}.toml", f"measured CSV seed {seed} case {case}: {data[:300]!r}")
        counts[result.exit_code] += 1
    return counts


def test_fuzz_calibrate_measurement_csv(tmp_path, stub_fit):
    counts = run_measured_cases(tmp_path, N_MEASURED, seed=4)
    assert counts[0] > N_MEASURED // 10 and counts[1] > N_MEASURED // 3, counts


@pytest.mark.slow
def test_fuzz_calibrate_measurement_csv_long(tmp_path, stub_fit):
    run_measured_cases(tmp_path, N_MEASURED * SLOW, seed=5)


JSON_BASES = [
    {  # closed loop, engine config passed as --metadata (strings)
        "model_id": "meta-llama/Llama-3.1-8B", "gpu": "h100_sxm", "tensor_parallel_size": "1", "num_prompts": 200, "request_rate": "inf",
        "max_concurrency": 16, "completed": 200, "failed": 0, "total_input_tokens": 200000, "total_output_tokens": 40000,
        "mean_ttft_ms": 120.0, "mean_tpot_ms": 10.0, "output_throughput": 1500.0, "burstiness": 1.0,
    },
    {  # open loop, gamma arrivals, a few failures
        "model_id": "llama-3.1-8b", "gpu": "a100_sxm", "tp": 2, "pp": "1", "num_prompts": 1000, "request_rate": 4.0, "max_concurrency": None,
        "completed": 990, "failed": 10, "total_input_tokens": 990000, "total_output_tokens": 99000, "mean_ttft_ms": 80.5,
        "mean_tpot_ms": 15.2, "output_throughput": 400.0, "burstiness": 0.5, "weight_dtype": "fp8", "kv_cache_dtype": "fp8",
    },
]
JSON_JUNK = [None, "", "abc", "inf", "-inf", "nan", float("nan"), float("inf"), -1, 0, 0.0, 1e30, 10**30, 1.5, True, False, [], [1], {}, {"a": 1}, "1e400", "x" * 5000, -0.0, 2**63, "１"]


def mutate_record(record: dict, rng: random.Random) -> dict:
    record = dict(record)
    kind = rng.choice(["junk", "junk", "junk", "drop", "rename", "add", "plausible", "plausible"])
    key = rng.choice(sorted(record))
    if kind == "junk":
        record[key] = rng.choice(JSON_JUNK)
    elif kind == "drop":
        del record[key]
    elif kind == "rename":
        record[key.upper()] = record.pop(key)
    elif kind == "add":
        record[rng.choice(["max_num_seqs", "max_num_batched_tokens", "prefix_hit_rate", "dp", "data_parallel_size", "pp_size"])] = rng.choice(JSON_JUNK + ["4", 4, "0.5"])
    else:
        plausible = {
            "model_id": ["llama-3.1-70b", "Qwen/Qwen3-32B", "gpt-5", "/nonexistent/config.json", "x.toml", "deepseek-ai/DeepSeek-V3"],
            "gpu": ["h200_sxm", "H100", "h100", "tpu", "b200_sxm", "l40s"],
            "completed": [1, 10**7, 10**9], "total_input_tokens": [1, 10**12], "total_output_tokens": [1, 10**12, 0],
            "num_prompts": [1, 10**8], "request_rate": [1e-9, 1e12, "INF"], "max_concurrency": [1, 10**8, 0],
            "mean_ttft_ms": [1e-9, 1e12], "mean_tpot_ms": [1e-9, 1e12], "output_throughput": [1e-12, 1e15],
            "tensor_parallel_size": ["3", "8", "1.5", "0", "1e3", "64"], "tp": [3, 8, 64, "2"],
        }
        key = rng.choice(sorted(set(plausible) & set(record) or record))
        record[key] = rng.choice(plausible.get(key, JSON_JUNK))
    return record


def json_bytes(value) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def mutated_json(rng: random.Random) -> bytes:
    roll = rng.random()
    base = rng.choice(JSON_BASES)
    if roll < 0.15:
        return mutate_bytes(json_bytes(base), rng)
    if roll < 0.25:
        return rng.choice([b"[]", b"{}", b"null", b"42", b'"text"', b"[1, 2]", b"[{}]", b'{"a": {"b": [' * 50 + b"]}" * 50, json_bytes([base, 3])])
    record = base
    for _ in range(rng.choice([1, 1, 2, 3])):
        record = mutate_record(record, rng)
    if roll < 0.35:  # --append-result: one object per line
        return json_bytes(record) + b"\n" + json_bytes(mutate_record(base, rng)) + b"\n"
    return json_bytes(record)


def run_json_cases(tmp_path: Path, n: int, seed: int) -> dict[int, int]:
    rng = random.Random(seed)
    counts = {0: 0, 1: 0}
    for case in range(n):
        data = mutated_json(rng)
        path = tmp_path / f"bench{case}.json"
        path.write_bytes(data)
        result = run_calibrate(path, tmp_path / f"params{case}.toml", f"bench JSON seed {seed} case {case}: {data[:300]!r}", JSON_KEYS)
        counts[result.exit_code] += 1
    return counts


def test_fuzz_calibrate_vllm_bench_json(tmp_path, stub_fit):
    counts = run_json_cases(tmp_path, N_JSON, seed=6)
    assert counts[0] > N_JSON // 10 and counts[1] > N_JSON // 3, counts


@pytest.mark.slow
def test_fuzz_calibrate_vllm_bench_json_long(tmp_path, stub_fit):
    run_json_cases(tmp_path, N_JSON * SLOW, seed=7)


def test_calibrate_real_fit_on_valid_inputs(tmp_path):
    """The real optax fit on the base files: finite parameters written, exit 0."""
    for case, base in enumerate(JSON_BASES[:N_REAL_FIT]):
        path = tmp_path / f"real{case}.json"
        path.write_bytes(json_bytes(base))
        result = run_calibrate(path, tmp_path / f"real{case}.toml", f"real fit {case}")
        assert result.exit_code == 0, result.stderr


# ---- argument lists ----------------------------------------------------------------------------------

VALUES = ["-1", "0", "nan", "NaN", "inf", "-inf", "1e30", "1" + "0" * 30, "", " ", "abc", "1.5", "0x10", "-0", "1e-30", "99999999999999999999", "true", "x" * 3000, "\u00e9", ","]
NAMES = {
    "--model": ["llama", "llama-3.1-7b", "gpt-5", "meta-llama/Llama-3.1-8B", "/nonexistent/config.json", "/tmp", "x.toml", str(REPO / "README.md")],
    "--gpu": ["h100_sxm", "h100", "H100_SXM", "z100", "h100_sxm,h200_sxm"],
    "--kv-cache-dtype": ["auto", "fp8", "fp8_e4m3", "FP8", "bf16"],
    "--gpus": ["h100", "h100_sxm,", ",", "h100_sxm,h100_sxm", "H100_SXM", "h100_sxm;h200_sxm", "tpu", "h100_sxm, h200_sxm"],
    "--workload": ["chat", "coding", "reasoning", "rl-rollout", "codin", "/nonexistent.toml", str(REPO / "README.md")],
    "--space": ["smal", "tiny", "/nonexistent.toml", str(REPO / "README.md")],
    "--price": ["h100_sxm=0", "h100_sxm=-1", "h100_sxm=nan", "h100_sxm=inf", "h100_sxm", "=2", "h200_sxm=2", "h100_sxm=2,h100_sxm=3", "h100_sxm=1e30", "h100_sxm=1e-30"],
    "--method": ["analytical", "replay", "ANALYTICAL", "exact", ""],
    "--params": ["/nonexistent.toml", str(REPO / "README.md"), str(REPO / "jaxplan/configs/models/llama-3.1-8b.toml"), "/tmp"],
}


def command_bases(tmp: Path) -> dict[str, list[str]]:
    csv_path = tmp / "rows.csv"
    csv_path.write_bytes(csv_bytes(PREDICT_BASES["minimal"]))
    bench = tmp / "bench.json"
    bench.write_bytes(json_bytes(JSON_BASES[0]))
    return {
        "sweep": ["sweep", "--model", "llama-3.1-8b", "--gpus", "h100_sxm", "--workload", "chat", "--space", "small", "--no-replay"],
        "sensitivity": ["sensitivity", "--model", "llama-3.1-8b", "--gpus", "h100_sxm", "--workload", "chat", "--space", "small", "--top", "2"],
        "predict": ["predict", str(csv_path), "-o", str(tmp / "out.csv"), "--method", "analytical"],
        "simulate": ["simulate", str(csv_path), "--requests", "10"],
        "calibrate": ["calibrate", "--measurements", str(bench), "--no-shared-data", "--steps", "5", "-o", str(tmp / "params.toml")],
        "list": ["list"],
    }


OPTIONS_OF = {
    "sweep": ["--model", "--gpus", "--workload", "--space", "--budget", "--target-throughput", "--rate", "--top", "--price", "--chunk-size", "--params", "--replay-requests", "--seed", "--json"],
    "sensitivity": ["--model", "--gpus", "--workload", "--space", "--budget", "--target-throughput", "--rate", "--top", "--price", "--json", "--max-seconds", "--max-memory-gib"],
    "predict": ["--method", "--requests", "--params", "-o", "--max-seconds", "--gpu"],
    "simulate": ["--requests", "--seed", "--params", "-o", "--max-seconds"],
    "calibrate": ["--steps", "--measurements", "--report", "--held-out-folds", "--gpu", "--tensor-parallel-size", "--kv-cache-dtype", "--rows"],  # never -o: the base run writes its own file (without -o, the user's config directory)
    "list": [],
}
# A sweep or sensitivity run that gets past validation compiles per (model, GPU count, space): keep
# those fixed (the pools above only offer other values that fail, or that load the same spec).
SAME_SHAPE = {"--model": NAMES["--model"],
              "--gpus": ["h100", "h100_sxm,", ",", "H100_SXM", "h100_sxm;h200_sxm", "tpu"], "--space": NAMES["--space"]}


def set_option(args: list[str], option: str, value: str) -> list[str]:
    args = list(args)
    if option in args:
        args[args.index(option) + 1] = value
    else:
        args += [option, value]
    return args


# In the default run, keep the expensive paths out: the stage-7 replay after a sweep, the replay
# method of predict, the shared data of calibrate, and sensitivity runs that pass validation (each
# compiles its own kernels); --run-slow lifts these limits.
PROTECTED = {"--no-replay", "--no-shared-data", "analytical"}
FAILING = ["-1", "nan", "NaN", "-inf", "", " ", "abc", "0x10", "99999999999999999999", "x" * 3000, "\u00e9", ","]


def fails_validation(option: str, value: str) -> bool:
    if option in ("--json", "--report", "-o"):
        return value == "" or "missing" in value or value.endswith("tmp")
    if option in NAMES:
        valid = ("meta-llama/Llama-3.1-8B", "H100_SXM", "chat", "coding", "reasoning", "rl-rollout", "analytical", "replay", "ANALYTICAL",
                 "h100_sxm=2,h100_sxm=3", "h100_sxm=1e30", "h100_sxm=1e-30", "h100_sxm, h200_sxm", "h100_sxm,")
        return value not in valid
    return value in FAILING


def mutated_args(bases: dict[str, list[str]], rng: random.Random, tmp: Path, light: bool = True) -> tuple[str, list[str]]:
    command = rng.choice(sorted(bases))
    args = bases[command]
    roll = rng.random()
    if roll < 0.06:
        return command, args + [rng.choice(["--foo", "--budget", "-x", "extra", "--help", "--json"] + ([] if light else ["--no-replay", "--replay"]))]
    if roll < 0.1 and len(args) > 2:
        i = rng.randrange(1, len(args))
        if light and args[i] in PROTECTED:
            i = len(args) - 1 if args[-1] not in PROTECTED else 1
        return command, args[:i] + args[i + 1 :]
    for _ in range(rng.choice([1, 1, 2])):
        if not OPTIONS_OF[command]:
            break
        option = rng.choice(OPTIONS_OF[command])
        pool = (SAME_SHAPE if command in ("sweep", "sensitivity") else NAMES).get(option, NAMES.get(option, []))
        if option in ("--json", "--report", "--rows", "-o"):
            pool = [str(tmp), str(tmp / "missing" / "x.json"), "", str(tmp / "ok.json")]
        choices = pool + VALUES if rng.random() < 0.5 or not pool else pool
        if light and option == "--method":
            choices = [v for v in choices if v.lower() != "replay"]
        if light and command == "sensitivity":
            choices = [v for v in choices if fails_validation(option, v)] or FAILING
        args = set_option(args, option, rng.choice(choices))
    return command, args


def run_args_cases(tmp_path: Path, n: int, seed: int, light: bool = True) -> dict[str, dict[int, int]]:
    """Mutated argument lists, run with the working directory in tmp_path (a junk -o value is a file name)."""
    rng = random.Random(seed)
    bases = command_bases(tmp_path)
    counts: dict[str, dict[int, int]] = {}
    work = tmp_path / "cwd"
    work.mkdir()
    for case in range(n):
        command, args = mutated_args(bases, rng, tmp_path, light)
        with contextlib.chdir(work):
            result = invoke(args, f"args seed {seed} case {case}")
        counts.setdefault(command, {0: 0, 1: 0, 2: 0, 3: 0})[result.exit_code] += 1
        if result.exit_code == 1 and not error_line(result).endswith("--help')"):  # usage errors: checked in invoke
            message = error_line(result)
            given = [a for a in args[1:] if len(a) > 2 and a in message]  # the message quotes the value given
            assert given or any(o in message for o in OPTIONS) or any(f.lower() in message.lower() for f in ("model", "gpu", "workload", "space", "price", "rate", "budget", "calibration file", str(tmp_path), "README.md", "/tmp", ".toml", "seed", "column")), f"case {case} {args}: {message[:400]!r}"
    return counts


def test_fuzz_cli_arguments(tmp_path, stub_fit):
    counts = run_args_cases(tmp_path, N_ARGS, seed=8)
    assert set(counts) == set(OPTIONS_OF), counts
    total = {code: sum(c[code] for c in counts.values()) for code in (0, 1, 2, 3)}
    assert total[1] > N_ARGS // 10 and total[0] > 10, counts


@pytest.mark.slow
def test_fuzz_cli_arguments_long(tmp_path, stub_fit):
    run_args_cases(tmp_path, N_ARGS * SLOW, seed=9, light=False)


# ---- contradictory constraints ------------------------------------------------------------------------


def test_ttft_slo_below_one_prefill_step_is_explained(tmp_path):
    """A TTFT SLO no configuration can meet (1 us): exit 2 and one line naming the TTFT SLO."""
    workload = tmp_path / "tight.toml"
    workload.write_text('name = "tight"\nisl_mean_tokens = 4000\nosl_mean_tokens = 200\narrival = "poisson"\nrequest_rate_per_s = 1.0\nttft_slo_s = 1e-6\n')
    result = invoke(["sweep", "--model", "llama-3.1-8b", "--gpus", "h100_sxm", "--workload", str(workload), "--space", "small", "--no-replay"], "ttft slo")
    assert result.exit_code in (1, 2), result.stderr
    assert "TTFT" in result.stderr and "SLO" in result.stderr, result.stderr


def test_gpu_budget_below_one_replica_is_explained():
    """--budget 1 for a model that needs several GPUs per replica: exit 2, one line that names the
    budget as what to relax."""
    result = invoke(["sweep", "--model", "llama-3.1-70b", "--gpus", "h100_sxm", "--workload", "chat", "--space", "small", "--budget", "1", "--no-replay"], "budget")
    assert result.exit_code in (1, 2), result.stderr
    assert "budget" in result.stderr, result.stderr


# ---- huge input: refused up front with the estimates -------------------------------------------------------


# Every command that runs a sweep takes the same limits.
SWEEPING = {"sweep": ["sweep", "--no-replay"], "size": ["size"], "sensitivity": ["sensitivity"], "report": ["report", "-o", "unused.html", "--no-replay"]}


@pytest.mark.parametrize("command", sorted(SWEEPING))
def test_huge_grid_refused_by_time_limit_before_any_allocation(monkeypatch, command):
    """--max-seconds below the estimate: exit 3, one line with the candidates, seconds, GiB and the fix;
    nothing is built (build_context would allocate the tables)."""
    from jaxplan.funnel import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "build_context", lambda *a, **k: pytest.fail("the sweep started"))
    result = invoke([*SWEEPING[command], "--space", "huge", "--gpus", "h100_sxm,h200_sxm,a100_sxm,b200_sxm", "--max-seconds", "10"], f"{command}, huge, 10 s")
    assert result.exit_code == 3
    line = error_line(result)
    assert "refusing the sweep" in line and "127,401,984 candidates" in line and " s and " in line and "GiB" in line
    assert "--max-seconds = 10" in line and "fewer --gpus" in line


@pytest.mark.parametrize("command", sorted(SWEEPING))
def test_huge_grid_refused_by_memory_limit(monkeypatch, command):
    from jaxplan.funnel import sweep as sweep_module

    monkeypatch.setattr(sweep_module, "build_context", lambda *a, **k: pytest.fail("the sweep started"))
    result = invoke([*SWEEPING[command], "--space", "huge", "--max-memory-gib", "0.5"], f"{command}, huge, 0.5 GiB")
    assert result.exit_code == 1
    line = error_line(result)
    assert "refusing the sweep" in line and "above the memory limit of 0.5 GiB" in line and "--max-memory-gib" in line


def test_layout_table_beyond_available_memory_refused_by_default(tmp_path, monkeypatch):
    """No --max-memory-gib: the machine's available memory is the limit. 10^5 TP x 10^3 PP x 10^3 DP
    values make a 10^11-entry layout table (terabytes): refused, naming the layout table."""
    from jaxplan.funnel import sweep as sweep_module
    from jaxplan.system import available_memory_bytes

    monkeypatch.setattr(sweep_module, "build_context", lambda *a, **k: pytest.fail("the sweep started"))
    space = tmp_path / "layouts.toml"
    space.write_text(
        "tensor_parallel_size = { min = 1, max = 100000 }\npipeline_parallel_size = { min = 1, max = 1000 }\n"
        "data_parallel_size = { min = 1, max = 1000 }\nmax_num_seqs = [64]\nmax_num_batched_tokens = [8192]\n"
        'weight_dtype = ["bf16"]\nkv_cache_dtype = ["auto"]\ngpu_budget = 1000000\n'
    )
    assert available_memory_bytes() is not None
    result = invoke(["sweep", "--space", str(space), "--gpus", "h100_sxm", "--no-replay"], "layout table")
    assert result.exit_code == 1
    assert "refusing the sweep" in error_line(result) and "layouts" in error_line(result)


def test_estimates_and_deadline():
    """Memory grows with the chunk and the layouts; the deadline stops a sweep whose measured rate
    projects past the limit, and lets one through that fits."""
    from jaxplan.errors import PlanError
    from jaxplan.deadline import Deadline
    from jaxplan.funnel.budget import check_limits, estimate_sweep
    from jaxplan.grid import Grid

    grid = Grid(parse_gpus("h100_sxm,h200_sxm"), load_space("default"))
    small, big = estimate_sweep(grid, 1 << 14, 1), estimate_sweep(grid, 1 << 20, 1)
    assert big.memory_bytes > small.memory_bytes and big.seconds == small.seconds == estimate_sweep(grid, 1 << 16, 2).seconds
    assert check_limits(grid, 1 << 16).candidates == grid.size  # no limits: no refusal
    with pytest.raises(PlanError, match="--max-memory-gib"):
        check_limits(grid, 1 << 16, max_memory_bytes=1e6)

    def run(limit, seconds_per_chunk, chunks=100):
        clock = iter([0.0] + [10.0 + seconds_per_chunk * i for i in range(chunks + 1)])
        deadline = Deadline(limit, clock=lambda: next(clock))
        for i in range(1, chunks + 1):
            deadline(i * 1000, chunks * 1000)

    run(60.0, 0.4)  # 10 s compile + 100 x 0.4 s = 50 s: fits
    with pytest.raises(PlanError, match="stopped the sweep after .* beyond --max-seconds = 60"):
        run(60.0, 1.0)  # projects to ~110 s: stopped early, not at 60 s
    with pytest.raises(PlanError, match="--max-seconds = -1"):
        check_limits(grid, 1 << 16, max_seconds=-1)


def parse_gpus(text):
    from jaxplan.specs import parse_gpu_list

    return parse_gpu_list(text)


def load_space(name):
    from jaxplan.specs import load_space as load

    return load(name)


def test_an_output_path_too_long_names_its_option_in_one_short_line(tmp_path):
    """Found by the --run-slow fuzz: a 3,000-character -o gave the OS error with the whole name (3,040
    characters). Every output option is now checked before any work, and an OS error's path is cut."""
    long = str(tmp_path / ("x" * 3000))
    csv_in = tmp_path / "in.csv"
    csv_in.write_text("model,gpu,tensor_parallel_size,isl,osl,concurrency\nllama-3.1-8b,h100_sxm,1,1000,200,16\n")
    for args, option in (
        (["predict", str(csv_in), "--method", "analytical", "-o", long], "-o"),
        (["simulate", str(csv_in), "-o", long], "-o"),
        (["calibrate", "--measurements", str(csv_in), "--no-shared-data", "--report", long], "--report"),
        (["report", "-o", long], "-o"),
        (["sweep", "--json", long], "--json"),
    ):
        result = invoke(args, f"long {option}")
        line = error_line(result)
        assert result.exit_code == 1 and f"{option} = " in line and "longer than the" in line and len(line) < 300, (args[0], line)
    from jaxplan.cli.common import _os_error_text

    text = _os_error_text(OSError(36, "File name too long", "y" * 5000))
    assert text.startswith("File name too long: 'yyy") and len(text) < 200


def test_calibrate_rows_without_a_dataset_take_their_files_name(tmp_path, stub_fit):
    """Found by the --run-slow fuzz: one row naming a dataset and one leaving it blank made the
    provenance's sorted() compare None with a string (exit code 3)."""
    path = tmp_path / "mine.csv"
    path.write_text(
        "model,gpu,tensor_parallel_size,isl,osl,concurrency,request_rate,num_prompts,measured_ttft_ms_mean,measured_tpot_ms_mean,dataset\n"
        "llama-3.1-8b,h100_sxm,1,1000,200,16,,,100,10,lab\n"
        "llama-3.1-8b,h100_sxm,2,4000,300,,3,300,250.5,12.25,\n"
    )
    out = tmp_path / "p.toml"
    result = invoke(["calibrate", "--measurements", str(path), "--no-shared-data", "--steps", "5", "-o", str(out)], "blank dataset")
    assert result.exit_code == 0, error_line(result)
    assert 'datasets = ["lab", "mine.csv"]' in out.read_text()
