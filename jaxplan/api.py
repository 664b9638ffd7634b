"""The public Python API (re-exported by `jaxplan/__init__.py`): sweep, predict, sensitivity.

Every function takes spec objects or the names/paths the CLI takes, and raises a one-line
`PlanError` for bad input. See docs/api.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from jaxplan.errors import PlanError, bad_value
from jaxplan.inputs import load_inputs
from jaxplan.plan import Plan, run_plan

METHODS = ("replay", "analytical")


def sweep(
    model,
    gpus,
    workload,
    space="default",
    *,
    budget: int | None = None,
    weight_dtypes=None,
    kv_cache_dtypes=None,
    layout_kinds=None,
    target_throughput: float | None = None,
    rate: float | None = None,
    price=None,
    top: int = 20,
    chunk_size: int | None = None,
    params: str | Path | None = None,
    replay: bool = True,
    replay_requests: int = 2000,
    seed: int = 0,
    routing: str = "round_robin",
    max_seconds: float | None = None,
    max_memory_gib: float | None = None,
    vllm_version: str | None = None,
) -> Plan:
    """Search the grid (stages 1-6), replay the finalists (stage 7, unless `replay=False`) and, with a
    `target_throughput`, size the deployment per GPU type, as `jaxplan sweep` does.

    model: a ModelSpec, bundled name, HF id or config.json path; gpus: 'h100_sxm,h200_sxm', a list of
    names / GpuSpecs, or one GpuSpec; workload: a Workload or a bundled name / .toml path; space: a
    SearchSpace or a bundled name / .toml path. budget, weight_dtypes ('bf16,fp8' or a list),
    kv_cache_dtypes, layout_kinds ('tp,dp_ep' or a list: a MoE model's tp, ep, dp, dp_ep), target_throughput (output tokens/s), rate (Poisson requests/s) and price
    ('h100_sxm=2.5' or {'h100_sxm': 2.5} USD per GPU-hour) override the workload and the space.
    vllm_version: the vLLM release to price (default: $JAXPLAN_VLLM_VERSION, else the newest measured)."""
    inputs = load_inputs(
        model, gpus, workload, space, budget=budget, target_throughput=target_throughput, rate=rate, price=price,
        weight_dtypes=weight_dtypes, kv_cache_dtypes=kv_cache_dtypes, layout_kinds=layout_kinds,
    )
    return run_plan(
        inputs, top=top, chunk_size=chunk_size, params=params, replay=replay, replay_requests=replay_requests, seed=seed,
        routing=routing, size=target_throughput is not None, max_seconds=max_seconds, max_memory_gib=max_memory_gib,
        vllm_version=vllm_version,
    )


def predict(
    rows: Sequence[Mapping] | str | Path,
    method: str = "replay",
    *,
    num_requests: int | None = None,
    seed: int = 0,
    routing: str = "round_robin",
    params: str | Path | None = None,
    max_seconds: float | None = None,
    vllm_version: str | None = None,
) -> list[dict]:
    """TTFT, TPOT and throughput of explicit configurations, as `jaxplan predict` does: each row (a
    dict with the predict CSV's columns: model, gpu, tensor_parallel_size, isl, osl, request_rate or
    concurrency, ...) comes back with the output columns added (times in ms: ttft_ms_mean, ttft_ms_p99,
    tpot_ms_mean, tpot_ms_p99, output_tok_s, request_s, kv_cache_tokens, status), each mean's p10-p90
    band (`ttft_ms_mean_p10`, ..., `output_tok_s_p90`) and `prediction_class` (docs/uncertainty.md).

    rows: a list of dicts or a predict CSV path. method: "replay" (step by step per row) or
    "analytical" (stage 4's steady state, instant). vllm_version: the release of the rows that do not
    state one in their `vllm_version` column (default: $JAXPLAN_VLLM_VERSION, else the newest measured)."""
    from jaxplan.prediction import predict_rows, replay_predict_rows
    from jaxplan.replay.routing import routing_policy

    if method not in METHODS:
        raise bad_value("method", method, f"use one of {', '.join(METHODS)}")
    routing_policy(routing)
    source = "input"
    if isinstance(rows, (str, Path)):
        from jaxplan.calibrate.rows import read_predict_csv

        source, rows = str(rows), read_predict_csv(rows)
    if isinstance(rows, Mapping) or not isinstance(rows, Sequence) or not all(isinstance(r, Mapping) for r in rows):
        raise bad_value("rows", type(rows).__name__, "give a list of dicts (one per configuration) or a predict CSV path")
    if not rows:
        raise bad_value("rows", [], "give at least one configuration")
    rows = [dict(r) for r in rows]
    if vllm_version:
        from jaxplan.vllm_release import parse_release

        parse_release(vllm_version)
        rows = [r if r.get("vllm_version") not in (None, "") else {**r, "vllm_version": vllm_version} for r in rows]
    from jaxplan.bands import with_bands

    params_path = str(params) if params else None
    if method == "analytical":
        predicted = predict_rows(rows, params_path=params_path, source=source)
    else:
        predicted = replay_predict_rows(rows, params_path=params_path, source=source, num_requests=num_requests, seed=seed, routing=routing, max_seconds=max_seconds)
    return with_bands(predicted, params_path)  # each metric's p10-p90 and the class it comes from, as the CLI writes


def sensitivity(plan: Plan | None = None, *, top: int | None = None, **sweep_options):
    """Elasticities (d log metric / d log parameter) of finalists' stage-4 throughput, TTFT, TPOT and
    cost to the workload's ISL, OSL, rate or concurrency and prefix hit rate: a
    `jaxplan.elasticity.Sensitivity` whose axis 0 follows `plan.finalists[:top]`.

    plan: a Plan from `sweep` (live, not read from JSON); without one, `sweep_options` (model, gpus,
    workload, ...) run a sweep without the replay and its `top` (default 10) finalists are used, as
    `jaxplan sensitivity` does."""
    from jaxplan.elasticity import for_rows

    if plan is None:
        if "replay" in sweep_options:
            raise bad_value("replay", sweep_options["replay"], "sensitivity sweeps without the replay; pass a plan from jaxplan.sweep to analyse replayed finalists")
        plan = sweep(**sweep_options, top=10 if top is None else top, replay=False)
    elif sweep_options:
        raise bad_value(sorted(sweep_options)[0], sweep_options[sorted(sweep_options)[0]], "give either a plan or sweep options, not both")
    if not isinstance(plan, Plan):
        raise bad_value("plan", type(plan).__name__, "pass the Plan jaxplan.sweep returned")
    if plan.sweep is None:
        raise PlanError("this plan was read from JSON: sensitivities need the live sweep; run jaxplan.sweep and pass its plan")
    if not plan.finalists:
        raise PlanError(plan.empty_explanation or "no finalist to analyse")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise bad_value("top", top, "must be an integer >= 1")
    rows = [f.to_row() for f in plan.finalists[:top]]
    return for_rows(plan.sweep, rows)
