"""Rich tables for the terminal: the funnel, the shortlist, the frontier."""

from __future__ import annotations

import io

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from jaxplan.physics.steady_state import BOUND_NAMES
from jaxplan.plots.labels import replay_tokens_cell, split_label


def _ms(seconds: float) -> str:
    if seconds != seconds:
        return "-"
    return "inf" if seconds == float("inf") else f"{seconds * 1e3:,.0f}" if seconds >= 0.1 else f"{seconds * 1e3:,.1f}"


def funnel_table(result) -> Table:
    table = Table(title=f"Funnel over {result.grid.size:,} candidates ({result.num_devices} device(s), chunks of {result.chunk_size:,})")
    table.add_column("stage")
    table.add_column("admitted", justify="right")
    table.add_column("rejected", justify="right")
    table.add_column("main reasons")
    table.add_column("time", justify="right")
    for s in result.stages:
        reasons = "; ".join(f"{name} ({n:,})" for name, n in list(s.reasons.items())[:2])
        if s.stage == 1:
            when = f"{s.seconds:.2f} s (1-4 fused)"
        else:
            when = "" if s.seconds is None else f"{s.seconds:.2f} s"
        table.add_row(f"{s.stage} {s.name}", f"{s.admitted:,}", f"{s.rejected:,}", reasons, when)
    table.caption = f"compile {result.compile_s:.1f} s, stages 1-4 streamed in {result.run_s:.2f} s ({result.grid.size / max(result.run_s, 1e-9):,.0f} candidates/s)"
    return table


# The shortlist's columns: header (lines broken by hand), justification, cell. When the terminal is too
# narrow for all of them, DROP_ORDER names the first to go; no value is ever cut.
_COLUMNS = (
    ("#", "right", lambda i, r: str(i)),
    ("GPU", "left", lambda i, r: r["gpu"]),
    ("layout", "left", lambda i, r: split_label(r)),
    ("GPUs", "right", lambda i, r: str(r["num_gpus"])),
    ("seqs", "right", lambda i, r: str(r["max_num_seqs"])),
    ("budget", "right", lambda i, r: str(r["max_num_batched_tokens"])),
    ("W/KV", "left", lambda i, r: f"{r['weight_dtype']}/{r['kv_cache_dtype']}"),
    ("out\ntok/s", "right", lambda i, r: f"{r['output_tokens_per_s']:,.0f}"),
    ("tok/s\n/GPU", "right", lambda i, r: f"{r['output_tokens_per_s_per_gpu']:,.0f}"),
    ("TTFT\np99 ms", "right", lambda i, r: _ms(r["ttft_p99_s"])),
    ("TPOT\np99 ms", "right", lambda i, r: _ms(r["tpot_p99_s"])),
    ("$/M\ntok", "right", lambda i, r: f"{r['cost_per_million_output_tokens_usd']:.2f}"),
    ("binds", "left", lambda i, r: BOUND_NAMES[r["bound"]]),
)
def _band(r: dict) -> str:
    """Output tokens/s at p10-p90 of the row's band (`plan_bands`), '-' without one."""
    low, high = r.get("output_tokens_per_s_p10"), r.get("output_tokens_per_s_p90")
    return "-" if low is None or high is None else f"{low:,.0f}-{high:,.0f}"


_BAND_COLUMNS = (("tok/s\np10-p90", "right", lambda i, r: _band(r)),)
_REPLAY_COLUMNS = (
    ("replay\ntok/s", "right", lambda i, r: replay_tokens_cell(r)),
    ("replay\nTTFT p99", "right", lambda i, r: _ms(r["replay_ttft_p99_s"])),
    ("replay\nTPOT p99", "right", lambda i, r: _ms(r["replay_tpot_p99_s"])),
    ("SLO\nmet", "right", lambda i, r: f"{r['replay_slo_attainment']:.0%}"),
)
# Least needed first; stage 4's own metrics go before the replay's, which rank the finalists.
DROP_ORDER = ("binds", "tok/s\np10-p90", "tok/s\n/GPU", "$/M\ntok", "#", "TTFT\np99 ms", "TPOT\np99 ms", "out\ntok/s", "budget", "GPUs")


def rows_table(rows: list[dict], title: str, width: int | None = None) -> Table:
    """The shortlist (stage 4's metrics, and the replay's where `rows` carry them). No cell wraps or is
    cut: where the table is wider than `width` columns (the terminal), columns leave in `DROP_ORDER`
    and the caption names them (the JSON and CSV outputs keep every field)."""
    replayed = bool(rows) and "replay_output_tokens_per_s" in rows[0]
    banded = bool(rows) and "output_tokens_per_s_p10" in rows[0]
    columns = list(_COLUMNS + (_REPLAY_COLUMNS if replayed else ()) + (_BAND_COLUMNS if banded else ()))
    dropped = []
    while True:
        table = Table(title=title)
        for name, justify, _ in columns:
            table.add_column(name, justify=justify, no_wrap=True)
        for i, r in enumerate(rows, start=1):
            table.add_row(*(cell(i, r) for _, _, cell in columns))
        if dropped:
            table.caption = "not shown (too narrow a terminal): " + ", ".join(name.replace("\n", " ") for name in dropped)
        spare = [name for name in DROP_ORDER if name in {c[0] for c in columns}]
        if width is None or not spare or _natural_width(table) <= width:
            return table
        columns = [c for c in columns if c[0] != spare[0]]
        dropped.append(spare[0])


def _natural_width(table: Table) -> int:
    """Columns `table` takes when nothing is cut."""
    console = Console(width=10_000, file=io.StringIO())
    return Measurement.get(console, console.options, table).maximum
