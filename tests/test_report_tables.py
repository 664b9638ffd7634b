"""The terminal's shortlist table: no value is ever cut; a narrow terminal loses whole columns, named in the caption."""

from __future__ import annotations

import io

from rich.console import Console

from jaxplan.cli.common import out
from jaxplan.plots.labels import split_label
from jaxplan.report.tables import DROP_ORDER, rows_table

# The widest realistic row: every cell at the length a large deployment gives it.
ROW = dict(
    gpu="b200_sxm", tensor_parallel_size=8, pipeline_parallel_size=2, data_parallel_size=16, num_gpus=256,
    max_num_seqs=1024, max_num_batched_tokens=16384, weight_dtype="bf16", kv_cache_dtype="auto",
    output_tokens_per_s=1234567.0, output_tokens_per_s_per_gpu=12345.0, ttft_p99_s=12.3456, tpot_p99_s=1.2345,
    cost_per_million_output_tokens_usd=123.45, bound=2, replay_output_tokens_per_s=7654321.0,
    replay_ttft_p99_s=65.4321, replay_tpot_p99_s=5.4321, replay_slo_attainment=0.5,
)
# The README example's winner: a typical row.
TYPICAL = dict(
    ROW, gpu="h100_sxm", tensor_parallel_size=1, pipeline_parallel_size=4, data_parallel_size=3, num_gpus=12,
    max_num_seqs=96, max_num_batched_tokens=512, weight_dtype="fp8", kv_cache_dtype="fp8", output_tokens_per_s=2400.0,
    output_tokens_per_s_per_gpu=200.0, ttft_p99_s=4.316, tpot_p99_s=0.0661, cost_per_million_output_tokens_usd=4.15,
    bound=0, replay_output_tokens_per_s=2311.0, replay_ttft_p99_s=2.204, replay_tpot_p99_s=0.0677, replay_slo_attainment=1.0,
)
STAGE4_ONLY = {k: v for k, v in ROW.items() if not k.startswith("replay_")}
REPLAY_CELLS = ("7,654,321", "65,432", "5,432", "50%")
KEY_CELLS = ("b200_sxm", split_label(ROW), "1024", "bf16/auto")


def _render(width: int, row: dict) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(rows_table([row, row], "Top", width=width))
    return console.export_text()


def test_piped_output_shows_every_column_whole():
    assert out.is_terminal or out.width == 160
    text = _render(160, TYPICAL)
    assert max(len(line) for line in text.splitlines()) <= 160
    for cell in ("h100_sxm", "TP1xPP4xDP3", "12", "96", "512", "fp8/fp8", "2,400", "200", "4,316", "66.1", "4.15",
                 "max_num_seqs", "2,311", "2,204", "67.7", "100%"):
        assert cell in text, cell
    assert "…" not in text and "not shown" not in text


def test_the_widest_row_loses_only_its_bound_at_160_columns():
    text = _render(160, ROW)
    assert max(len(line) for line in text.splitlines()) <= 160
    for cell in KEY_CELLS + REPLAY_CELLS + ("256", "16384", "1,234,567", "12,345", "12,346", "123.45"):
        assert cell in text, cell
    assert "…" not in text
    assert text.strip().splitlines()[-1].strip() == "not shown (too narrow a terminal): binds"


def test_a_narrow_terminal_drops_whole_columns_and_says_which():
    for width in (150, 120, 100):
        text = _render(width, ROW)
        assert max(len(line) for line in text.splitlines()) <= width, width
        assert "…" not in text
        for cell in KEY_CELLS + REPLAY_CELLS:  # what the finalists are and how the replay ranks them stay
            assert cell in text, (width, cell)
        assert "not shown" in text
    text = _render(120, ROW)
    assert "binds" in text.split("not shown")[1] and "token budget" not in text


def test_without_the_replay_stage_4_metrics_are_kept_longest():
    text = _render(110, STAGE4_ONLY)
    assert max(len(line) for line in text.splitlines()) <= 110
    for cell in KEY_CELLS + ("1,234,567", "12,346", "1,234"):
        assert cell in text, cell


def test_drop_order_names_only_real_columns():
    table = rows_table([{**ROW, "output_tokens_per_s_p10": 1_000.0, "output_tokens_per_s_p90": 1_500.0}], "Top")
    headers = {str(c.header) for c in table.columns}
    assert set(DROP_ORDER) <= headers


def test_a_banded_row_shows_its_throughput_band_and_an_unbanded_one_has_no_column():
    banded = _render(400, {**ROW, "output_tokens_per_s_p10": 1_000.0, "output_tokens_per_s_p90": 1_500.0})
    assert "1,000-1,500" in banded and "p10-p90" in banded
    assert "p10-p90" not in _render(400, ROW)


def test_a_finalist_that_falls_behind_its_traffic_says_so_beside_its_replayed_throughput():
    text = _render(160, dict(TYPICAL, replay_falls_behind=True))
    assert "2,311 behind" in text and "…" not in text
    assert "behind" not in _render(160, dict(TYPICAL, replay_falls_behind=False))
