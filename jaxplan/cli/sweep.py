"""`jaxplan sweep`: the whole funnel over the grid, then the replay of the finalists."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.cli.common import (
    BudgetOption,
    KvDtypesOption,
    GpusOption,
    MaxMemoryGibOption,
    ModelOption,
    ParamsOption,
    PrefixCachingOption,
    PriceOption,
    RateOption,
    Routing,
    RoutingOption,
    SpaceOption,
    TargetOption,
    VllmVersionOption,
    WorkloadOption,
    app,
    check_writable,
    clean_errors,
    err,
    load_cli_inputs,
    out,
    plan_with_progress,
    write_plots,
    WeightDtypesOption,
    LayoutKindsOption,
)
from jaxplan.cli.exit_codes import ExitCode
from jaxplan.report.vllm_command import HEAD_ADDRESS


@app.command()
@clean_errors
def sweep(
    model: ModelOption = "llama-3.1-70b",
    gpus: GpusOption = "h100_sxm,h200_sxm",
    workload: WorkloadOption = "coding",
    space: SpaceOption = "default",
    budget: BudgetOption = None,
    weight_dtypes: WeightDtypesOption = None,
    kv_cache_dtypes: KvDtypesOption = None,
    layout_kinds: LayoutKindsOption = None,
    target_throughput: TargetOption = None,
    rate: RateOption = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Finalists to keep (one per GPU/TP/PP/DP layout).")] = 20,
    price: PriceOption = None,
    prefix_caching: PrefixCachingOption = None,
    chunk_size: Annotated[Optional[int], typer.Option(min=1024, max=1 << 24, help="Candidates per streamed chunk [default: 65,536 on a CPU, 4,194,304 on a GPU].")] = None,
    params: ParamsOption = None,
    vllm_version: VllmVersionOption = None,
    replay: Annotated[bool, typer.Option(help="Stage 7: replay the finalists step by step and re-rank them.")] = True,
    replay_requests: Annotated[int, typer.Option(min=10, max=1_000_000, help="Requests per replay (sampled from the workload, seeded).")] = 2000,
    seed: Annotated[int, typer.Option(min=0, help="Seed of the replay's request sample.")] = 0,
    json_path: Annotated[Optional[Path], typer.Option("--json", dir_okay=False, help="Write everything machine-readable here.")] = None,
    routing: RoutingOption = Routing.ROUND_ROBIN,
    max_seconds: Annotated[Optional[float], typer.Option(min=0.001, help="Refuse (or stop) a sweep, its replay included, estimated to take longer (default: no limit).")] = None,
    max_memory_gib: MaxMemoryGibOption = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", file_okay=False, help="Write figures here (PNG + SVG): funnel, frontier, splits, replay timelines.")] = None,
) -> None:
    """Search the whole grid: funnel counts, the top configurations and a ready `vllm serve` command."""
    from jaxplan.report.tables import funnel_table, rows_table

    check_writable(json_path, "--json")
    inputs = load_cli_inputs(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes, kv_cache_dtypes, layout_kinds,
                             prefix_caching)
    if plot:
        from jaxplan.plots.save import plot_dir

        plot_dir(plot)  # a bad --plot fails now, not after the sweep
    plan = plan_with_progress(
        inputs, on_funnel=lambda result: out.print(funnel_table(result)), top=top, chunk_size=chunk_size, params=params, replay=replay,
        replay_requests=replay_requests, seed=seed, routing=routing.value, size=target_throughput is not None,
        max_seconds=max_seconds, max_memory_gib=max_memory_gib,
    )
    if plan.replayed:
        agreement = plan.replay_rank_correlation
        out.print(
            f"7 replay: {len(plan.finalists)} finalists x {plan.finalists[0].replay.requests:,} requests in {plan.replay_s:.1f} s; "
            f"re-ranked by replayed metrics (Spearman rank correlation with stage 4: {agreement:.2f})"
            if agreement is not None else "re-ranked by replayed metrics (rank correlation with stage 4: n/a, under 3 finalists or tied scores)",
            highlight=False,
        )
    elif not replay:
        out.print("7 replay: skipped (--no-replay); ranking is stage 4's.", style="dim")
    if plan.winner:
        title = "re-ranked by the replay" if plan.replayed else "ranked by stage 4"
        out.print(rows_table([f.to_row() for f in plan.finalists], f"Top {len(plan.finalists)} configurations (one per GPU/TP/PP/DP layout), {title}", width=out.width))
        print_winner(plan.winner, plan.verdict)
    else:
        err.print(f"[bold red]{plan.empty_explanation}[/]", highlight=False, soft_wrap=True)  # one line, even when piped
    if plan.sizing is not None:  # sizing: per GPU type, the fewest GPUs and the cheapest per token
        from jaxplan.sizing import sizing_table

        out.print(sizing_table(plan.sizing))
    if json_path:
        json_path.write_text(plan.to_json())
        out.print(f"wrote {json_path}")
    if plot:
        from jaxplan.plots.figures import count_sweep, plan_figures

        write_plots(lambda step: plan_figures(plan, step=step), count_sweep(plan.finalists if plan.replayed else None), plot)
    if not plan.winner:
        raise typer.Exit(code=ExitCode.NOTHING_SURVIVED)


def replay_warning(shortfalls: list[str]) -> str:
    """The line under the winner when, replayed step by step, no finalist meets the workload."""
    return (
        f"Warning: replayed step by step, no finalist meets the workload; the winner misses it by {'; '.join(shortfalls)}. "
        "Stage 4's steady state promised it: give more GPUs (--budget; jaxplan size finds how many), loosen the SLOs "
        "or lower the target."
    )


MAX_PRINTED_LINES = 8  # serve lines printed; every line is in --json (winner.vllm_serve_*)


def print_winner(winner, verdict=None) -> None:
    """The winner's `vllm serve` line(s) (the head node's or first server's, then one per other node or
    server, labelled), how they fit together (a router over independent servers, lock-step ranks),
    the KV cache to check in its log, its p10-p90 band, why it beats the other layout kinds (a MoE
    model), the replay's warning when it misses the workload, and `verdict`'s notes
    (`plan_bands.Verdict`: a runner-up within the bands, an SLO or target the band's far end misses)."""
    from jaxplan.plan_bands import band_line

    lines = winner.serve_commands
    labels = winner.line_labels if len(winner.line_labels) == len(lines) else ()
    if len(lines) == 1:
        out.print("[bold]Winner:[/] " + winner.serve_command, highlight=False, soft_wrap=True)
    elif all(label.startswith("node ") for label in labels):  # one server's ranks over nodes (no labels: a plan from older JSON)
        out.print("[bold]Winner:[/] (head node) " + winner.serve_command, highlight=False, soft_wrap=True)
        for node, line in enumerate(lines[1:], start=1):
            out.print(f"[bold]Node {node}:[/] {line}", highlight=False, soft_wrap=True)
        out.print(f"(replicas on {len(lines)} nodes: vLLM's multi-node data parallelism; put the head node's address for {HEAD_ADDRESS})", style="dim", highlight=False, soft_wrap=True)
    else:
        out.print(f"[bold]Winner:[/] {winner.finalist.layout}, {len(lines)} commands:", highlight=False, soft_wrap=True)
        for label, line in list(zip(labels, lines))[:MAX_PRINTED_LINES]:
            out.print(f"[bold]{label}:[/] {line}", highlight=False, soft_wrap=True)
        if len(lines) > MAX_PRINTED_LINES:
            out.print(f"... and {len(lines) - MAX_PRINTED_LINES} more the same way (every line is in --json: winner.vllm_serve_other_nodes)", style="dim", highlight=False)
    if winner.launch_note:
        out.print(f"({winner.launch_note})", style="dim", highlight=False, soft_wrap=True)
    out.print(winner.kv_cache_check, style="dim", highlight=False, soft_wrap=True)
    band = band_line(winner.finalist.band)
    if band:
        out.print("Band: " + band, highlight=False, soft_wrap=True)
    for line in winner.why:
        out.print("Why: " + line, highlight=False, soft_wrap=True)
    if winner.replay_shortfalls:
        out.print(replay_warning(list(winner.replay_shortfalls)), style="bold yellow", highlight=False, soft_wrap=True)
    for note in verdict.notes if verdict is not None else ():
        out.print(note, style="bold yellow", highlight=False, soft_wrap=True)
