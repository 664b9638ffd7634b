"""Regenerate the small, deterministic test fixtures in tests/fixtures/ from the full data.

    python -m jaxplan.calibrate.fixtures [out_dir]     (default: <repo>/tests/fixtures)

Fixtures let tests of the fit and of predict run without ../shared. Same data
+ same code -> byte-identical files (seeded subsampling, sorted groups).
"""

from __future__ import annotations

import re
import sys
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

from jaxplan.calibrate import kernels
from jaxplan.calibrate.rows import write_predict_csv
from jaxplan.calibrate.serving import load_serving_rows
from jaxplan.specs.lengths import read_lengths

SEED = 0
ROWS_PER_GROUP = 4  # serving rows kept per (dataset, model, gpu, backend, weight dtype)
KERNEL_GPUS = ("h100_sxm", "b200_sxm")
KERNEL_ROWS = {"gemm": 120, "context_attention": 80, "generation_attention": 80}


def serving_subset(rows: list[dict], per_group: int = ROWS_PER_GROUP, seed: int = SEED) -> list[dict]:
    """Up to `per_group` rows of every (dataset, model, gpu, backend, weight_dtype) group, seeded per
    group, source order kept."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for index, row in enumerate(rows):
        groups[(row["dataset"], row["model"], row["gpu"], row["backend"], row["weight_dtype"])].append(index)
    keep = []
    for key in sorted(groups):
        members = groups[key]
        # Seeded per group: a group added to the data leaves every other group's choice as it was.
        rng = np.random.default_rng([seed, zlib.crc32("|".join(map(str, key)).encode())])
        chosen = members if len(members) <= per_group else rng.choice(members, size=per_group, replace=False).tolist()
        keep.extend(chosen)
    return [rows[i] for i in sorted(keep)]


def write_fixtures(out_dir: str | Path, data_root=None) -> list[Path]:
    """Write serving_rows.csv and kernel CSVs into out_dir; returns the written paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    path = out / "serving_rows.csv"
    rows = serving_subset(load_serving_rows(data_root))
    for row in rows:  # the rows' per-request lengths travel with them: lengths/<source>.csv, named relative to the CSV
        if row["lengths_file"]:
            lengths = read_lengths(row["lengths_file"])
            copy = out / "lengths" / (re.sub(r"[^A-Za-z0-9_.-]+", "_", row["source_id"]) + ".csv")
            copy.parent.mkdir(exist_ok=True)
            copy.write_text("input_tokens,output_tokens\n" + "".join(f"{i},{o}\n" for i, o in zip(lengths.input_tokens, lengths.output_tokens)))
            row["lengths_file"] = str(copy.resolve())
            written.append(copy)
    write_predict_csv(rows, path)
    written.append(path)
    for gpu in KERNEL_GPUS:
        tables = {
            "gemm": kernels.load_gemm(gpu, max_rows=KERNEL_ROWS["gemm"], seed=SEED, data_root=data_root),
            "context_attention": kernels.load_context_attention(gpu, max_rows=KERNEL_ROWS["context_attention"], seed=SEED, data_root=data_root),
            "generation_attention": kernels.load_generation_attention(gpu, max_rows=KERNEL_ROWS["generation_attention"], seed=SEED, data_root=data_root),
            "allreduce": kernels.load_allreduce(gpu, data_root=data_root),
        }
        for name, table in tables.items():
            path = out / f"{name}_{gpu}.csv"
            kernels.write_kernel_csv(table, path)
            written.append(path)
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "tests" / "fixtures"
    for written_path in write_fixtures(target):
        print(f"{written_path}  {written_path.stat().st_size:,} bytes")
