"""`jaxplan size`: the smallest and the cheapest deployment per GPU type for a throughput target, and a batch job's wall time."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from jaxplan.cli.common import (
    check_writable,
    BudgetOption,
    KvDtypesOption,
    GpusOption,
    MaxMemoryGibOption,
    ModelOption,
    ParamsOption,
    PrefixCachingOption,
    PriceOption,
    RateOption,
    SpaceOption,
    TargetOption,
    VllmVersionOption,
    WorkloadOption,
    app,
    clean_errors,
    err,
    json_text,
    load_cli_inputs,
    out,
    plan_with_progress,
    WeightDtypesOption,
    LayoutKindsOption,
)
from jaxplan.cli.exit_codes import ExitCode


@app.command()
@clean_errors
def size(
    model: ModelOption = "llama-3.1-70b",
    gpus: GpusOption = "h100_sxm,h200_sxm",
    workload: WorkloadOption = "rl-rollout",
    space: SpaceOption = "default",
    budget: BudgetOption = None,
    weight_dtypes: WeightDtypesOption = None,
    kv_cache_dtypes: KvDtypesOption = None,
    layout_kinds: LayoutKindsOption = None,
    target_throughput: TargetOption = None,
    rate: RateOption = None,
    price: PriceOption = None,
    prefix_caching: PrefixCachingOption = None,
    params: ParamsOption = None,
    vllm_version: VllmVersionOption = None,
    rollout_prompts: Annotated[int | None, typer.Option(min=1, help="Batch job (RL rollouts): prompts to generate; prints its wall time and cost at each pick's throughput.")] = None,
    replay: Annotated[bool, typer.Option(help="Replay each pick step by step (as sweep's stage 7 does its finalists) and say which meet the workload.")] = True,
    replay_requests: Annotated[int, typer.Option(min=10, max=1_000_000, help="Requests per replay (sampled from the workload, seeded).")] = 2000,
    json_path: Annotated[Path | None, typer.Option("--json", dir_okay=False, help="Write the sizing here.")] = None,
    max_seconds: Annotated[Optional[float], typer.Option(min=0.001, help="Refuse (or stop) a sweep estimated to take longer (default: no limit).")] = None,
    max_memory_gib: MaxMemoryGibOption = None,
) -> None:
    """How many GPUs for X output tokens/s? Per GPU type, the fewest GPUs and the cheapest per token
    that meet the target (--target-throughput, or the workload's own) and the SLOs."""
    from jaxplan.errors import PlanError
    from jaxplan.sizing import size_deployments, sizing_table

    check_writable(json_path, "--json")
    inputs = load_cli_inputs(model, gpus, workload, space, budget, target_throughput, rate, price, weight_dtypes, kv_cache_dtypes, layout_kinds,
                             prefix_caching)
    if inputs.workload.target_output_tokens_per_s <= 0:
        raise PlanError(f"workload {inputs.workload.name!r} has no throughput target; pass --target-throughput (output tokens/s for the whole deployment)")
    plan = plan_with_progress(inputs, top=1, params=params, replay=False, size=True, replay_sizing=replay, replay_requests=replay_requests,
                              rollout_prompts=rollout_prompts, max_seconds=max_seconds, max_memory_gib=max_memory_gib)
    # Nothing survived: the plan has no sizing; the empty one says so per GPU type.
    sizing = plan.sizing or size_deployments(plan.sweep, rollout_prompts=rollout_prompts)
    out.print(sizing_table(sizing))
    if json_path:
        json_path.write_text(json_text(sizing.to_json()))
        out.print(f"wrote {json_path}")
    if not sizing.per_gpu:
        err.print(f"[bold red]{plan.sweep.empty_explanation()}[/]", highlight=False, soft_wrap=True)
        raise typer.Exit(code=ExitCode.NOTHING_SURVIVED)
