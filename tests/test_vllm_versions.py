"""The release comparison (jaxplan/calibrate/versions.py): a hand-made CSV, and docs/vllm_versions.md's
table against the measured data."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from jaxplan.calibrate._data import data_root_exists
from jaxplan.calibrate.versions import CONFIGURATION, SILICON_CSV, release_pairs

DOC = Path(__file__).resolve().parents[1] / "docs" / "vllm_versions.md"


def _write(root: Path, rows: list[dict]) -> None:
    path = root / SILICON_CSV
    path.parent.mkdir(parents=True)
    columns = ("backend", "mode", "backend_version", *CONFIGURATION, "silicon_ttft_ms", "silicon_tpot_ms")
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "1") for c in columns})


def test_ratios_by_hand(tmp_path):
    """Two configurations under 0.9.0 and 0.10.0 (one run twice under 0.9.0, averaged), a third under one
    release only (no pair), an SGLang row and a row without a release (left out)."""
    base = {"backend": "vllm", "mode": "agg", "model_path": "org/M", "system": "h200_sxm"}
    _write(tmp_path, [
        {**base, "backend_version": "0.9.0", "isl": "1", "silicon_ttft_ms": "100", "silicon_tpot_ms": "10"},
        {**base, "backend_version": "0.9.0", "isl": "1", "silicon_ttft_ms": "300", "silicon_tpot_ms": "30"},  # mean 200 / 20
        {**base, "backend_version": "0.10.0", "isl": "1", "silicon_ttft_ms": "100", "silicon_tpot_ms": "15"},
        {**base, "backend_version": "0.9.0", "isl": "2", "silicon_ttft_ms": "100", "silicon_tpot_ms": "10"},
        {**base, "backend_version": "0.10.0", "isl": "2", "silicon_ttft_ms": "150", "silicon_tpot_ms": "5"},
        {**base, "backend_version": "0.10.0", "isl": "3", "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"},
        {**base, "backend": "sglang", "backend_version": "0.4.0", "isl": "1", "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"},
        {**base, "backend_version": "", "isl": "2", "silicon_ttft_ms": "1", "silicon_tpot_ms": "1"},
    ])
    (pair,) = release_pairs(tmp_path)
    # 0.10.0 sorts after 0.9.0 (numeric parts compare as numbers): ratios 0.5 and 1.5 (TTFT), 0.75 and 0.5 (TPOT).
    assert (pair.model, pair.gpu, pair.earlier, pair.later, pair.configurations) == ("M", "h200_sxm", "0.9.0", "0.10.0", 2)
    assert (pair.ttft_ratio_median, pair.ttft_ratio_low, pair.ttft_ratio_high) == pytest.approx((1.0, 0.5, 1.5))
    assert (pair.tpot_ratio_median, pair.tpot_ratio_low, pair.tpot_ratio_high) == pytest.approx((0.625, 0.5, 0.75))


@pytest.mark.skipif(not data_root_exists(), reason="needs ../shared/data")
def test_doc_table_is_the_measurement():
    rows = [line for line in DOC.read_text().splitlines() if re.match(r"\| [A-Za-z].* \| [0-9]+ \| [0-9.]+ \(", line)]
    expected = [
        f"| {p.model} | {p.gpu} | {p.earlier} | {p.later} | {p.configurations} | {p.ttft_ratio_median:.2f} ({p.ttft_ratio_low:.2f}-{p.ttft_ratio_high:.2f}) "
        f"| {p.tpot_ratio_median:.2f} ({p.tpot_ratio_low:.2f}-{p.tpot_ratio_high:.2f}) |"
        for p in release_pairs()
    ]
    assert rows == expected
    minimax = next(p for p in release_pairs() if p.model == "MiniMax-M2.5" and p.later == "0.19.0")
    assert minimax.tpot_ratio_high < 0.9  # every configuration faster under 0.19.0: the doc's claim
