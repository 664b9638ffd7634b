"""Rich tables for the terminal: the funnel, the shortlist, the frontier."""

from __future__ import annotations

from rich.table import Table

from jaxplan.physics.steady_state import BOUND_NAMES


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


def layout_label(row: dict) -> str:
    return f"TP{row['tensor_parallel_size']}xPP{row['pipeline_parallel_size']}xDP{row['data_parallel_size']}"


def rows_table(rows: list[dict], title: str) -> Table:
    table = Table(title=title)
    for name, justify in (
        ("#", "right"), ("GPU", "left"), ("layout", "left"), ("GPUs", "right"), ("seqs", "right"), ("budget", "right"),
        ("W/KV", "left"), ("out tok/s", "right"), ("tok/s/GPU", "right"), ("TTFT p99 ms", "right"),
        ("TPOT p99 ms", "right"), ("$/M tok", "right"), ("binds", "left"),
    ):
        table.add_column(name, justify=justify)
    replayed = bool(rows) and "replay_output_tokens_per_s" in rows[0]
    if replayed:
        for name in ("replay tok/s", "replay TTFT p99 ms", "replay TPOT p99 ms", "SLO met"):
            table.add_column(name, justify="right")
    for i, r in enumerate(rows, start=1):
        cells = [
            str(i), r["gpu"], layout_label(r), str(r["num_gpus"]), str(r["max_num_seqs"]), str(r["max_num_batched_tokens"]),
            f"{r['weight_dtype']}/{r['kv_cache_dtype']}", f"{r['output_tokens_per_s']:,.0f}", f"{r['output_tokens_per_s_per_gpu']:,.0f}",
            _ms(r["ttft_p99_s"]), _ms(r["tpot_p99_s"]), f"{r['cost_per_million_output_tokens_usd']:.2f}", BOUND_NAMES[r["bound"]],
        ]
        if replayed:
            cells += [f"{r['replay_output_tokens_per_s']:,.0f}", _ms(r["replay_ttft_p99_s"]), _ms(r["replay_tpot_p99_s"]), f"{r['replay_slo_attainment']:.0%}"]
        table.add_row(*cells)
    return table
