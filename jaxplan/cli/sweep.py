"""`jaxplan sweep`: the whole funnel over the grid, then the replay of the finalists."""

from __future__ import annotations

import dataclasses
import math
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
    PriceOption,
    RateOption,
    Routing,
    RoutingOption,
    SpaceOption,
    TargetOption,
    WorkloadOption,
    app,
    check_writable,
    clean_errors,
    err,
    finite,
    json_text,
    out,
    run_sweep,
    stage7_deadline,
    sweep_options,
    WeightDtypesOption,
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
    target_throughput: TargetOption = None,
    rate: RateOption = None,
    top: Annotated[int, typer.Option(min=1, max=1000, help="Finalists to keep (one per GPU/TP/PP/DP layout).")] = 20,
    price: PriceOption = None,
    chunk_size: Annotated[int, typer.Option(min=1024, max=1 << 24, help="Candidates per streamed chunk.")] = 1 << 16,
    params: ParamsOption = None,
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
    from jaxplan.report.vllm_command import vllm_serve_command

    check_writable(json_path, "--json")
    model_spec, gpu_specs, workload_spec, space_spec = sweep_options(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes, kv_cache_dtypes)
    if plot:
        from jaxplan.plots.save import plot_dir

        plot_dir(plot)  # a bad --plot fails now, not after the sweep
    import time as _time

    started = _time.perf_counter()
    result = run_sweep(model_spec, gpu_specs, workload_spec, space_spec, top, chunk_size, params, max_seconds=max_seconds, max_memory_gib=max_memory_gib)
    out.print(funnel_table(result))
    replayed = None
    if replay and result.shortlist:
        from jaxplan.funnel.replay_stage import replay_rows

        t0 = _time.perf_counter()
        with err.status(f"stage 7: replaying {len(result.shortlist)} finalists x {replay_requests:,} requests"):
            deadline = stage7_deadline(max_seconds, started, len(result.shortlist), replay_requests)
            replayed = replay_rows(result, result.shortlist, num_requests=replay_requests, seed=seed, routing=routing.value, progress=deadline)
        replay_seconds = _time.perf_counter() - t0
        from jaxplan.funnel.replay_stage import rank_agreement

        agreement = rank_agreement(replayed)
        out.print(
            f"7 replay: {len(replayed)} finalists x {replayed[0]['replay_requests']:,} requests in {_time.perf_counter() - t0:.1f} s; "
            f"re-ranked by replayed metrics (Spearman rank correlation with stage 4: {agreement:.2f})"
            if math.isfinite(agreement) else "re-ranked by replayed metrics (rank correlation with stage 4: n/a, under 3 finalists or tied scores)",
            highlight=False,
        )
    elif not replay:
        out.print("7 replay: skipped (--no-replay); ranking is stage 4's.", style="dim")
    report = sweep_report(result, space_spec.gpu_memory_utilization, vllm_serve_command, replayed)
    if result.shortlist:
        final = replayed or result.shortlist
        title = "re-ranked by the replay" if replayed else "ranked by stage 4"
        out.print(rows_table(final, f"Top {len(final)} configurations (one per GPU/TP/PP/DP layout), {title}", width=out.width))
        print_winner(report["winner"])
    else:
        err.print(f"[bold red]{result.empty_explanation()}[/]", highlight=False, soft_wrap=True)  # one line, even when piped
    if target_throughput is not None and result.shortlist:  # sizing: per GPU type, the fewest GPUs and the cheapest per token
        from jaxplan.sizing import size_deployments, sizing_table

        sizing = size_deployments(result)
        out.print(sizing_table(sizing))
        report["sizing"] = sizing.to_json()
    if json_path:
        json_path.write_text(json_text(report))
        out.print(f"wrote {json_path}")
    if plot:
        from jaxplan.cli.report import plot_sweep

        plot_sweep(result, replayed, plot, replay_seconds=replay_seconds if replayed else None, seed=seed)
    if not result.shortlist:
        raise typer.Exit(code=ExitCode.NOTHING_SURVIVED)


def sweep_report(result, gpu_memory_utilization: float, command, replayed=None) -> dict:
    from jaxplan.funnel.replay_stage import rank_agreement, replay_shortfalls
    from jaxplan.report.vllm_command import kv_cache_check, other_node_commands

    clean = lambda row: {k: finite(v) for k, v in row.items()}  # noqa: E731
    best = replayed[0] if replayed else result.winner
    block = result.grid.space.block_size_tokens
    winner = dict(clean(best), vllm_serve=command(result.model, best, gpu_memory_utilization, block), kv_cache_check=kv_cache_check(best, block)) if best else None
    if winner:  # replicas on several nodes: the head node's line above, the others' here
        winner["vllm_serve_other_nodes"] = other_node_commands(winner["vllm_serve"], best)
    if winner and replayed:  # the replay ranks passing finalists first: a winner that fails means all do
        winner["replay_shortfalls"] = replay_shortfalls(best, result.workload)
    return {
        "model": dataclasses.asdict(result.model),
        "workload": dataclasses.asdict(result.workload),
        "space": dataclasses.asdict(result.grid.space),
        "gpus": [dataclasses.asdict(g) for g in result.grid.gpus],
        "grid_size": result.grid.size,
        "funnel": [dataclasses.asdict(s) for s in result.stages],
        "replay": [clean(r) for r in replayed] if replayed else None,
        "replay_rank_correlation_with_stage4": finite(rank_agreement(replayed)) if replayed else None,
        "compile_s": result.compile_s,
        "run_s": result.run_s,
        "num_devices": result.num_devices,
        "shortlist": [clean(r) for r in result.shortlist],
        "frontier": [clean(r) for r in result.frontier],
        "winner": winner,
        "empty_explanation": None if result.shortlist else result.empty_explanation(),
    }


def replay_warning(shortfalls: list[str]) -> str:
    """The line under the winner when, replayed step by step, no finalist meets the workload."""
    return (
        f"Warning: replayed step by step, no finalist meets the workload; the winner misses it by {'; '.join(shortfalls)}. "
        "Stage 4's steady state promised it: give more GPUs (--budget; jaxplan size finds how many), loosen the SLOs "
        "or lower the target."
    )


def print_winner(winner: dict) -> None:
    """The winner's `vllm serve` line (the head node's, then one per other node when its replicas span
    nodes), the KV cache to check in its log, and the replay's warning when it misses the workload."""
    others = winner.get("vllm_serve_other_nodes") or []
    out.print("[bold]Winner:[/] " + ("(head node) " if others else "") + winner["vllm_serve"], highlight=False, soft_wrap=True)
    for node, line in enumerate(others, start=1):
        out.print(f"[bold]Node {node}:[/] {line}", highlight=False, soft_wrap=True)
    if others:
        out.print(f"(replicas on {len(others) + 1} nodes: vLLM's multi-node data parallelism; put the head node's address for {HEAD_ADDRESS})", style="dim", highlight=False, soft_wrap=True)
    out.print(winner["kv_cache_check"], style="dim", highlight=False, soft_wrap=True)
    if winner.get("replay_shortfalls"):
        out.print(replay_warning(winner["replay_shortfalls"]), style="bold yellow", highlight=False, soft_wrap=True)
