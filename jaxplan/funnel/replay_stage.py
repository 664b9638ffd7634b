"""Stage 7: replay the shortlist through the step-by-step scheduler and re-rank it.

The finalists run in vmapped replays (one call, or a few of finalists of
similar width: `replay_calls`); a finalist's step time is the physics'
`step_time_s` (one source of truth with stage 4), its KV blocks come from the
same memory model. Re-ranking uses the replayed metrics with the funnel's
objective: candidates that miss an SLO at the workload's percentile, leave
requests unfinished, or (with a target) fall short of it go to the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan import program_cache
from jaxplan.funnel.chunk import layout_of, rows_context
from jaxplan.funnel.estimate import objective
from jaxplan.funnel.replay_calls import CallEstimate, call_estimate, independent_calls, lockstep_calls, replica_bucket, slot_demand
from jaxplan.grid import candidates_from_digits
from jaxplan.physics.memory import replay_kv_blocks
from jaxplan.physics.shapes import Hardware, Layout, ModelShape, take
from jaxplan.physics.steady_state import BOUND_KV_CACHE
from jaxplan.physics.step_time import step_time_s
from jaxplan.replay import ReplayConfig, sample_requests, simulate
from jaxplan.replay.driver import closed_concurrency, lane_devices
from jaxplan.specs.workload import Arrival
from jaxplan.xla_options import ONE_SHOT_COMPILE

DEFAULT_REQUESTS = 2000
# How requests reach the ranks of a lock-step (MoE data-parallel) finalist: vLLM's DP coordinator.
LOCKSTEP_ROUTING = "dp_coordinator"


def physics_step(params, batch, group_batch_tokens=None):
    """The replay's step_time_fn: `step_time_s` of one finalist's (hardware, layout, model shape),
    given as `physics_params`; `group_batch_tokens`: the tokens of all its lock-step ranks this step
    (the dp_coordinator routing passes them). One function for every model, so the replay compiles
    once, not once per model (its jit takes the step function as a static argument)."""
    hw, layout, model = params
    return step_time_s(model, hw, layout, batch, group_batch_tokens)


def physics_params(model: ModelShape, hw: Hardware, layout: Layout):
    """`physics_step`'s params for finalists [F]: hardware and layout [F], and the model shape traced
    (float32) and repeated per finalist, since every leaf of the replay's params has a finalist axis."""
    num = int(np.shape(layout.tensor_parallel_size)[0])
    return hw, layout, jax.tree.map(lambda v: jax.device_put(np.full((num,), np.asarray(v), np.float32)), model)  # host-made: no program per shape


def finalist_inputs(result, rows: list[dict], routing: str = "round_robin"):
    """(ReplayConfig [F], `physics_params` [F]: hardware, layout, model shape) for sweep rows."""
    ctx = result.context
    digits = jnp.asarray(np.array([r["digits"] for r in rows], np.int32))
    hw, layout, blocks = _finalist_arrays(rows_context(ctx), digits)
    space = result.grid.space
    caching = prefix_caching(ctx.model, space.enable_prefix_caching)
    config = replay_config(layout, np.asarray(blocks), int(space.block_size_tokens), routing=routing, prefix_caching=caching)
    return config, physics_params(ctx.model, hw, layout)


@program_cache.jit(options=ONE_SHOT_COMPILE)
def _finalist_arrays(ctx, digits):
    """(hardware [F], layout [F], KV blocks per replica [F]) of the candidates with `digits` [F, A]
    (`ctx` as `rows_context` gives it: one program serves every model and space)."""
    c = candidates_from_digits(ctx.axis_values, digits, jnp.ones(digits.shape[0], bool))
    hw, layout = take(ctx.hardware, c.gpu_index), layout_of(c)
    context = ctx.workload.isl_tokens + 0.5 * ctx.workload.osl_tokens
    return hw, layout, replay_kv_blocks(ctx.model, hw, layout, ctx.gpu_memory_utilization, ctx.block_size_tokens, context)


def lockstep_ranks(layout) -> np.ndarray:
    """[F] int: the DP ranks of each layout that step together (1: independent replicas)."""
    return np.rint(np.asarray(layout.lockstep_ranks, np.float64)).astype(np.int64)


def prefix_caching(model: ModelShape, enabled: bool = True) -> bool:
    """Whether vLLM keeps a preempted request's blocks cached for its readmission
    (`ReplayConfig.prefix_caching`), its prefix cache `enabled` (vLLM's default): for attention-only
    models; not for a hybrid with linear-attention layers, whose recurrent state vLLM caches only in
    some releases and experimentally, so its victims are recomputed whole."""
    return bool(enabled) and not bool(np.any(np.asarray(model.linear_layers) > 0))


def replay_config(layout, kv_blocks, block_size: int = 16, *, routing: str = "round_robin", prefix_caching: bool = True) -> ReplayConfig:
    """The scheduler capacities of layouts [F] with `kv_blocks` [F] per replica (at least one block).

    routing: how requests reach independent data-parallel replicas, "round_robin" or
    "least_loaded". Layouts with lock-step ranks (a MoE model's vLLM data parallelism) are routed
    as vLLM's DP coordinator routes them (LOCKSTEP_ROUTING), and then so is every layout of the
    call: replay lock-step and independent finalists in separate calls (`replay_parts`).
    """
    ranks = lockstep_ranks(layout)
    return ReplayConfig.create(
        max_num_seqs=np.asarray(layout.max_num_seqs),
        max_num_batched_tokens=np.asarray(layout.max_num_batched_tokens),
        num_kv_blocks=np.clip(kv_blocks, 1, None),
        data_parallel_size=np.asarray(layout.data_parallel_size),
        pipeline_parallel_size=np.asarray(layout.pipeline_parallel_size),
        lockstep_ranks=ranks,
        block_size=block_size,
        routing=LOCKSTEP_ROUTING if np.any(ranks > 1) else routing,
        prefix_caching=prefix_caching,
    )


def replay_parts(configs: ReplayConfig, params, routing: str = "round_robin", estimate: CallEstimate | None = None, devices: int = 1) -> list[tuple]:
    """Finalists [F] split into the replay calls stage 7 makes: [(indices, their physics params,
    their ReplayConfig)], the independent replicas' calls (routed by `routing`) first, then the
    lock-step ones' (routed as vLLM's DP coordinator routes, see `replay_config`); empty ones left out.

    With `estimate` (`finalist_estimate`, for the same `routing`), finalists of different widths
    (slot rows of independent replicas, padded replicas in lock-step) are replayed in calls of their own where the loop time saved
    pays for the extra programs (`replay_calls`). The results do not depend on the calls."""
    ranks = lockstep_ranks(params[1])
    independent, lockstep = np.flatnonzero(ranks <= 1), np.flatnonzero(ranks > 1)
    groups = [independent]
    if estimate is not None and independent.size:
        groups = [independent[g] for g in independent_calls(CallEstimate(*(np.asarray(x)[independent] for x in estimate)), routing, devices)]
    if lockstep.size:
        buckets = replica_bucket(np.asarray(configs.data_parallel_size)[lockstep])
        steps = None if estimate is None else np.asarray(estimate.steps, np.float64)[lockstep]
        groups += [lockstep[g] for g in lockstep_calls(buckets, steps, devices)]
    parts = []
    for idx in groups:
        if idx.size:
            sub_params = jax.tree.map(lambda x, idx=idx: np.asarray(x)[idx], params)
            parts.append((idx, sub_params, replay_config(sub_params[1], np.asarray(configs.num_kv_blocks)[idx], configs.block_size, routing=routing, prefix_caching=configs.prefix_caching)))
    return parts


def finalist_estimate(rows: list[dict], workload, requests, configs: ReplayConfig, routing: str = "round_robin") -> CallEstimate:
    """Stage 4's view of the finalists' replay with independent replicas routed by `routing`, for
    `replay_parts` (`replay_calls.call_estimate`)."""
    return call_estimate(
        replica_steps_hint(rows, workload, requests, configs), concurrency_hint(rows), np.asarray(configs.max_num_seqs), np.asarray(configs.data_parallel_size),
        requests, closed_concurrency(workload), np.array([r.get("bound") == BOUND_KV_CACHE for r in rows]), routing,
    )  # fmt: skip


def replay_rows(result, rows: list[dict], *, num_requests: int | None = None, seed: int = 0, routing: str = "round_robin", progress=None) -> list[dict]:
    """The rows with replayed metrics added (`replay_*` keys), re-ranked best first.

    progress: `progress(output tokens done, total)` during the replay (see `simulate_trace`),
    e.g. a `jaxplan.deadline.Deadline` that stops it.

    routing: "round_robin" (request i to replica i % dp) or "least_loaded" (to the replica
    with the fewest waiting + running requests when it arrives), for independent replicas; the
    ranks of a lock-step (MoE data-parallel) finalist step together and are routed as vLLM's DP
    coordinator routes (LOCKSTEP_ROUTING), in replay calls of their own (`replay_parts`)."""
    if not rows:
        return []
    workload = result.workload
    configs, params = finalist_inputs(result, rows, routing)
    requests = sample_requests(workload, num_requests or min(workload.num_requests, DEFAULT_REQUESTS), seed)
    estimate = finalist_estimate(rows, workload, requests, configs, routing)
    parts = replay_parts(configs, params, routing, estimate, lane_devices())
    reported = {"before": 0, "last": 0}  # output tokens of the parts replayed, of this part's total

    def part_progress(parts_left: int):
        if progress is None:
            return None

        def report(done, total):
            reported["last"] = total
            progress(reported["before"] + done, reported["before"] + total * parts_left)

        return report

    metrics, routed_by = [None] * len(rows), [routing] * len(rows)
    for n, (idx, sub_params, sub_config) in enumerate(parts):
        sub_rows = [rows[i] for i in idx]
        m = jax.device_get(simulate(sub_config, requests, workload, physics_step, sub_params, replica_steps_hint=estimate.steps[idx], replica_concurrency_hint=concurrency_hint(sub_rows),
                                    initial_slots=initial_slots_hint(sub_rows), progress=part_progress(len(parts) - n)))  # fmt: skip
        reported["before"] += reported["last"]
        for j, i in enumerate(idx):
            metrics[i] = jax.tree.map(lambda x, j=j: x[j] if np.ndim(x) else x, m)
            routed_by[i] = sub_config.routing
    # The API server's per-request time is outside the engine steps the replay re-enacts; it is the
    # same calibrated constant stage 4 adds (physics params `request_overhead_s`).
    overhead_s = np.asarray(params[0].request_overhead_s)
    out = []
    for i, row in enumerate(rows):
        replayed = dict(row)
        m = metrics[i]
        replayed.update(
            replay_output_tokens_per_s=float(m.output_tokens_per_s),
            replay_ttft_mean_s=float(m.ttft.mean_s + overhead_s[i]),
            replay_ttft_p99_s=float(m.ttft_at_slo_percentile_s + overhead_s[i]),
            replay_tpot_mean_s=float(m.tpot.mean_s),
            replay_tpot_p99_s=float(m.tpot_at_slo_percentile_s),
            replay_goodput_req_per_s=float(m.goodput_req_per_s),
            replay_slo_attainment=float(m.slo_attainment),
            replay_mean_batch_size=float(m.mean_batch_size),
            replay_kv_utilization_peak=float(m.kv_utilization_peak),
            replay_preemptions=int(m.num_preemptions),
            replay_unfinished=int(m.unfinished),
            replay_requests=int(requests.prompt_tokens.shape[0]),
            replay_routing=routed_by[i],
        )
        queue = dict(replay_falls_behind=bool(m.falls_behind), replay_queue_at_last_arrival=int(m.queue_at_last_arrival),
                     replay_sustained_output_tokens_per_s=float(m.sustained_output_tokens_per_s))
        replayed["replay_score"] = replay_score({**replayed, **queue}, workload)
        replayed.update(queue)  # after the score, as `finalist.ReplayMetrics` orders them
        out.append(replayed)
    return sorted(out, key=lambda r: -r["replay_score"])


def replica_steps_hint(rows: list[dict], workload, requests, configs: ReplayConfig) -> np.ndarray:
    """Stage 4's estimate of one replica's scheduler steps in the replay [F]: how long the traffic
    lasts over the mean step time (TPOT). The replay only uses it to spread replicas over lanes
    (`simulate_trace`); inf where unknown."""
    tpot = np.array([r.get("tpot_mean_s", np.nan) for r in rows], np.float64)
    ttft = np.array([r.get("ttft_mean_s", np.nan) for r in rows], np.float64)
    lifetime = ttft + max(workload.osl_mean_tokens - 1.0, 0.0) * tpot  # one request, arrival to last token
    num_r = requests.num_requests
    if workload.arrival == Arrival.CLOSED:  # each client's requests one after the other
        duration = lifetime * num_r / max(min(workload.concurrency, num_r), 1)
    elif workload.arrival == Arrival.POISSON:
        duration = float(np.max(requests.arrival_s)) + lifetime
    else:  # burst: each replica's requests in waves of max_num_seqs
        per_replica = np.ceil(num_r / np.asarray(configs.data_parallel_size, np.float64))
        duration = lifetime * np.ceil(per_replica / np.asarray(configs.max_num_seqs, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = duration / tpot
    return np.where(np.isfinite(steps) & (steps > 0), steps, np.inf)


def concurrency_hint(rows: list[dict]) -> np.ndarray:
    """Stage 4's requests in flight per replica [F] (nan where unknown): the replay's lane split
    estimates its work from it (`jaxplan.replay.driver.replica_work`)."""
    return np.array([r.get("concurrency_per_replica", np.nan) for r in rows], np.float64)


def initial_slots_hint(rows: list[dict]) -> int | None:
    """Slot rows for the replay to start with: the largest `slot_demand` (twice stage 4's requests in
    flight per replica, at most the finalist's max_num_seqs) over the finalists stage 4 estimated
    (the replay widens them if a replica needs more, and only ever to the same results); None where
    stage 4 gave no estimate."""
    inflight = concurrency_hint(rows)
    seqs = np.array([float(r.get("max_num_seqs") or np.inf) for r in rows])
    known = np.isfinite(inflight) & (inflight > 0)
    return int(np.ceil(slot_demand(inflight[known], seqs[known]).max())) if known.any() else None


def rank_agreement(rows: list[dict]) -> float:
    """Spearman rank correlation between stage 4's score and the replay's over the replayed rows."""
    from jaxplan.calibrate.metrics import spearman

    if len(rows) < 3:
        return float("nan")
    return float(spearman([r["score"] for r in rows], [r["replay_score"] for r in rows]))


def replay_shortfalls(row: dict, workload) -> list[str]:
    """What a replayed row misses of the workload, in words ([] when it meets it all): unfinished
    requests, the p99 TTFT and TPOT SLOs (at the workload's percentile), and the throughput: under
    Poisson traffic, whether it keeps up with what arrives (`jaxplan.replay.backlog`), as stage 4's
    OVERLOADED sieve asks, and then the offered rate against the target; else the replayed
    throughput against the target."""
    misses = []
    if row["replay_unfinished"]:
        misses.append(f"{row['replay_unfinished']:,} requests did not finish")
    pct = f"p{workload.slo_percentile:g}"
    for name, key, slo in (("TTFT", "replay_ttft_p99_s", workload.ttft_slo_s), ("TPOT", "replay_tpot_p99_s", workload.tpot_slo_s)):
        if not row[key] <= slo:
            misses.append(f"{pct} {name} {row[key] * 1e3:,.0f} ms > SLO {slo * 1e3:,.0f} ms")
    target = workload.target_output_tokens_per_s
    if getattr(workload, "arrival", None) == Arrival.POISSON:
        # The finite run's own throughput (ramp and drain included) is below the offered rate for
        # every deployment, so it cannot say whether one serves what arrives; its queue can.
        offered = workload.offered_output_tokens_per_s
        if row.get("replay_falls_behind"):
            misses.append(f"falls behind the {offered:,.0f} output tok/s sent: its queue stops emptying and holds "
                          f"{row['replay_queue_at_last_arrival']:,} requests at the last arrival; it serves about "
                          f"{row['replay_sustained_output_tokens_per_s']:,.0f} output tok/s")
        elif not offered * (1 + 1e-6) >= target:
            misses.append(f"the traffic sends {offered:,.0f} output tok/s < target {target:,.0f}")
    elif not row["replay_output_tokens_per_s"] >= target:
        misses.append(f"{row['replay_output_tokens_per_s']:,.0f} output tok/s < target {target:,.0f}")
    return misses


# One program for the objective's handful of scalar operations, rather than one per operation.
_objective = jax.jit(objective)


def replay_score(row: dict, workload) -> float:
    """The funnel's objective on replayed numbers; failing candidates (`replay_shortfalls`) score below
    every passing one."""
    misses = replay_shortfalls(row, workload)
    thr = max(row["replay_output_tokens_per_s"], 1e-9)
    if not misses and getattr(workload, "arrival", None) == Arrival.POISSON:
        # A deployment that keeps up with Poisson traffic serves what arrives, as stage 4 prices it. The finite
        # replay's own figure falls short by its ramp and drain, by amounts (0.1-0.3% between such
        # finalists) that would outweigh the objective's tie-break among equally priced layouts.
        thr = workload.offered_output_tokens_per_s
    score = float(_objective(thr, row["replay_tpot_p99_s"], row["hourly_usd"], workload.target_output_tokens_per_s))
    return score - 1e3 if misses else score
