"""How sure a sweep's answer is: each finalist's p10-p90 band, and whether the winner's lead holds.

The bands are `jaxplan.bands`' (measured / predicted over held-out rows, per prediction class),
applied to what ranked the finalist: the replayed means where stage 7 ran, else stage 4's. The
verdict compares the winner with the runner-up on the ranking's own quantity (`funnel.estimate.
objective`): output tokens per dollar without a target, cost with one. Band ends of two finalists
are compared as if their errors were independent, which overstates the doubt between layouts on
the same GPU (their errors share a calibration) and is the cautious reading.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxplan.layout_kind import kind_label, row_kind
from jaxplan.specs.workload import Arrival

# Row keys a finalist gains (SI units, like the sweep's own metrics).
BAND_KEYS = (
    "band_class", "ttft_mean_s_p10", "ttft_mean_s_p90", "tpot_mean_s_p10", "tpot_mean_s_p90",
    "output_tokens_per_s_p10", "output_tokens_per_s_p90",
)  # fmt: skip


def _metric_values(row: dict) -> tuple[float, float, float]:
    """(TTFT mean s, TPOT mean s, output tokens/s) that ranked `row`: replayed where it was replayed."""
    if "replay_output_tokens_per_s" in row:
        return row["replay_ttft_mean_s"], row["replay_tpot_mean_s"], row["replay_output_tokens_per_s"]
    return row["ttft_mean_s"], row["tpot_mean_s"], row["output_tokens_per_s"]


def kv_fits(rows: list[dict], workload, block_size_tokens: int) -> np.ndarray:
    """[R] bool, `bands.kv_regime`'s rule (the one calibrate's measured rows are classed by) for sweep
    rows: an open loop (Poisson, burst) fits; a closed loop fits when one replica's KV cache holds its
    share of the clients' full contexts (mean prompt + mean output)."""
    from jaxplan.bands import kv_regime

    closed = workload.arrival == Arrival.CLOSED
    return kv_regime([
        {
            "concurrency": workload.concurrency if closed else None, "num_prompts": workload.num_requests,
            "data_parallel_size": r["data_parallel_size"], "isl": workload.isl_mean_tokens, "osl": workload.osl_mean_tokens,
            "kv_cache_tokens": r["kv_blocks_per_replica"] * block_size_tokens,
        }
        for r in rows
    ])  # fmt: skip


def with_bands(rows: list[dict], model_name: str, workload, block_size_tokens: int, params_path: str | None = None,
               table: dict | None = None) -> list[dict]:
    """`rows` (sweep or replayed rows) with BAND_KEYS added; a band end is None where the class has
    no band for that metric. table: `bands.load_bands`' dict (default: the bands that go with
    `params_path`)."""
    from jaxplan import bands
    from jaxplan.physics.params import load_priors

    if not rows:
        return []
    values = np.array([_metric_values(r) for r in rows], dtype=np.float64).reshape(len(rows), 3)
    capacity = poisson_capacity(rows, workload)
    kept_up = np.isfinite(capacity)
    # Under Poisson traffic a finalist that keeps up serves what arrives; what is in doubt is its
    # capacity, so the throughput's band is the capacity's, capped at the rate sent.
    banded_values = np.where(kept_up[:, None] & (np.arange(3) == 2), capacity[:, None], values)
    low, high, classes = bands.band_arrays(
        [r["gpu"] for r in rows], [model_name] * len(rows), kv_fits(rows, workload, block_size_tokens), banded_values,
        table if table is not None else bands.bands_for(params_path), prior_gpus=load_priors(params_path),
    )  # fmt: skip
    if workload.arrival == Arrival.POISSON:  # no deployment serves more than is offered: cap the throughput's ends there
        offered = workload.offered_output_tokens_per_s
        ceiling = np.where(kept_up, offered, np.maximum(values[:, 2], offered))
        low[:, 2], high[:, 2] = np.minimum(low[:, 2], ceiling), np.minimum(high[:, 2], ceiling)
    out = []
    for i, row in enumerate(rows):
        ends = [None if not math.isfinite(v) else float(v) for pair in zip(low[i], high[i]) for v in pair]
        out.append({**row, **dict(zip(BAND_KEYS, (str(classes[i]), *ends)))})
    return out


def poisson_capacity(rows: list[dict], workload) -> np.ndarray:
    """[R] output tokens/s each finalist serves at full load under Poisson traffic, as stage 4 prices
    it (the rate sent / its utilization), where it keeps up (stage 4's utilization below 1 and, if
    replayed, a queue that keeps emptying: `replay.backlog`); NaN elsewhere and for other traffic."""
    out = np.full(len(rows), np.nan)
    if workload.arrival != Arrival.POISSON:
        return out
    offered = workload.offered_output_tokens_per_s
    for i, r in enumerate(rows):
        utilization = r.get("utilization")
        if utilization is not None and 0 < utilization < 1 and not r.get("replay_falls_behind"):
            out[i] = offered / utilization
    return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether the winner's lead over the runner-up exceeds their bands. lead: the winner's ranking
    quantity over the runner-up's, minus 1 (None when it is not uncertain: ranked by cost alone);
    close: the bands overlap, so the measured order could go either way; notes: one line each, for the
    terminal, the JSON and the report."""

    lead: float | None
    close: bool
    notes: tuple[str, ...]

    def to_dict(self) -> dict:
        return {"lead": self.lead, "close": self.close, "notes": list(self.notes)}


def band_line(band: dict | None) -> str | None:
    """One line for a banded row: 'p10-p90 (class ...): TTFT mean a-b ms, TPOT mean c-d ms, e-f output tokens/s'."""
    if not band or band.get("output_tokens_per_s_p10") is None:
        return None
    def ms(key: str) -> str:
        value = band.get(key)
        return "?" if value is None else f"{value * 1e3:,.0f}" if value >= 0.1 else f"{value * 1e3:,.1f}"

    low, high = f"{band['output_tokens_per_s_p10']:,.0f}", f"{band['output_tokens_per_s_p90']:,.0f}"
    # Both ends at the rate sent: Poisson traffic that even the capacity's p10 keeps up with.
    throughput = f"{low} output tokens/s at both ends" if low == high else f"{low}-{high} output tokens/s"
    return (f"p10-p90 ({band['band_class']}, docs/uncertainty.md): TTFT mean {ms('ttft_mean_s_p10')}-{ms('ttft_mean_s_p90')} ms, "
            f"TPOT mean {ms('tpot_mean_s_p10')}-{ms('tpot_mean_s_p90')} ms, {throughput}")


def _thr(row: dict, end: str) -> float | None:
    value = row.get(f"output_tokens_per_s_{end}")
    return None if value is None else float(value)


def verdict(rows: list[dict], workload) -> Verdict | None:
    """Judge the first row (the winner) against the second (the runner-up, if any) and the workload's
    SLOs and target. rows: banded rows best first. None without rows."""
    if not rows:
        return None
    best = rows[0]
    notes = []
    lead, close = None, False
    target = workload.target_output_tokens_per_s
    if len(rows) > 1:
        second = rows[1]
        if target > 0 or workload.arrival == Arrival.POISSON:
            # Ranked by cost, which is exact: the doubt is whether the winner keeps up, checked below.
            pass
        elif all(v is not None for v in (_thr(best, "p10"), _thr(second, "p90"))):
            per_dollar = lambda row, thr: thr / row["hourly_usd"]  # noqa: E731
            lead = per_dollar(best, _metric_values(best)[2]) / per_dollar(second, _metric_values(second)[2]) - 1
            close = per_dollar(second, _thr(second, "p90")) >= per_dollar(best, _thr(best, "p10"))
            if close:
                notes.append(
                    f"Too close to call: the runner-up ({_layout(second)}) is {lead:.0%} behind on output tokens per dollar, "
                    "within the two predictions' p10-p90 bands; measure both before choosing."
                )
    low_thr = _thr(best, "p10")
    offered = workload.offered_output_tokens_per_s
    if math.isfinite(poisson_capacity([best], workload)[0]) and low_thr is not None and low_thr < offered * (1 - 1e-6):
        notes.append(f"At its band's low end (p10) the winner's capacity is {low_thr:,.0f} output tokens/s, below the {offered:,.0f} "
                     f"that arrive: it would fall behind them; more GPUs (stage 4 runs it at {best['utilization']:.0%} of its capacity) cover it.")
    elif target > 0 and low_thr is not None and low_thr < target:
        notes.append(f"At its band's low end (p10) the winner serves {low_thr:,.0f} output tokens/s, below the {target:,.0f} target; "
                     "a larger --target-throughput margin or more GPUs covers it.")
    for metric, slo, name in (("ttft", workload.ttft_slo_s, "TTFT"), ("tpot", workload.tpot_slo_s, "TPOT")):
        ratio = _high_ratio(best, metric)
        p99 = best.get(f"replay_{metric}_p99_s", best[f"{metric}_p99_s"])
        if math.isfinite(slo) and ratio is not None and p99 * ratio > slo:
            notes.append(f"At its band's high end (p90) the winner's p99 {name} would be {p99 * ratio * 1e3:,.0f} ms, past the "
                         f"{slo * 1e3:,.0f} ms SLO.")
    notes += preemption_notes(best)
    notes += unmeasured_layout_notes(best, rows[1:], workload)
    return Verdict(lead, close, tuple(notes))


def kv_bound(row: dict) -> bool:
    """Stage 4 bounds the row's batch by its KV cache (at the requests' mean context): vLLM admits
    requests on their prompts' KV blocks up to max_num_seqs, past what the cache holds at their whole
    length, and preempts them as they grow, which stage 4 does not price (docs/accuracy.md)."""
    from jaxplan.physics.steady_state import BOUND_KV_CACHE

    return row.get("bound") is not None and int(row["bound"]) == BOUND_KV_CACHE


# What a KV-bound row's line says after naming it: stage 4 sized it, and the replay is what sees the preemptions.
KV_BOUND_UNPRICED = ("the KV cache bounds the batch, so vLLM preempts (it admits requests on their prompts' KV blocks), "
                     "which stage 4 does not price (docs/accuracy.md, \"KV-starved closed loops\")")


def preemption_notes(row: dict) -> list[str]:
    """One line where the winner's replay preempted notably (`prediction.notable_preemptions`): stage 4
    chose its max_num_seqs and token budget without pricing the recomputation, whose cost they decide
    (docs/accuracy.md, "KV-starved closed loops"); not replayed, where stage 4's batch is KV-bound."""
    from jaxplan.prediction import notable_preemptions

    count, requests = int(row.get("replay_preemptions") or 0), int(row.get("replay_requests") or 0)
    if requests < 1:  # not replayed: stage 4's bound says whether vLLM will preempt
        return [f"The winner: {KV_BOUND_UNPRICED}; the replay (without --no-replay) counts them."] if kv_bound(row) else []
    if not notable_preemptions(count, requests):
        return []
    return [f"The winner's replay preempted {count:,} times ({count / requests:.2g} a request): vLLM admits a request on its prompt's "
            "KV blocks, and the winner's KV cache cannot hold the batch it admits whole; each preempted request recomputes what of its "
            "prompt and output so far the prefix cache lost. That cost depends on its --max-num-seqs and --max-num-batched-tokens, which stage 4 chose without "
            "pricing it, and the replay may price it high (docs/accuracy.md): measure those settings on your vLLM before committing."]


# The layout parts no measured run behind the bands checks, as the winner's notes and `size`'s name them.
LOCKSTEP_UNMEASURED = "vLLM's lock-step data parallelism (--data-parallel-size on a MoE model), which no measured vLLM run here checks"
PIPELINE_UNMEASURED = "pipeline parallelism, which the measured runs check only under vLLM 0.8.3's V0 engine"


def uses_lockstep(row: dict) -> bool:
    return row_kind(row)[1] > 1


def uses_pipeline(row: dict) -> bool:
    return int(row.get("pipeline_parallel_size") or 1) > 1


def unmeasured_layout_notes(row: dict, others: list[dict] = (), workload=None) -> list[str]:
    """One line for each part of a finalist's layout that no measured run behind the bands checks: their
    classes pool rows of other layouts, so the band alone would not say it (docs/accuracy.md, docs/moe.md).
    others: the finalists ranked after it (with `workload`), of which each line names the best without
    that part (`best_without`), so that a cautious reader has the choice in hand."""
    notes = []
    if uses_lockstep(row):
        notes.append(f"The winner runs {LOCKSTEP_UNMEASURED}: its band comes from TP and EP runs (docs/moe.md)." + best_without(others, uses_lockstep, row, workload))
    if uses_pipeline(row):
        notes.append(f"The winner uses {PIPELINE_UNMEASURED} (A100): measure it on your vLLM before committing (docs/accuracy.md)."
                     + best_without(others, uses_pipeline, row, workload))
    return notes


def _meets_workload(row: dict, workload) -> bool:
    """A replayed finalist meets the workload when the replay finds no shortfall; a finalist stage 4
    alone ranked passed its sieves to be one."""
    from jaxplan.funnel.replay_stage import replay_shortfalls

    return "replay_output_tokens_per_s" not in row or workload is None or not replay_shortfalls(row, workload)


def best_without(others: list[dict], uses, winner: dict, workload) -> str:
    """' The best finalist without it: ...' (its layout, cost against the winner's, p99 TTFT and TPOT,
    replayed where it was replayed) for the first of `others` (best first) for which `uses` is false
    and that meets the workload; a sentence saying none does where all such finalists miss it; '' where
    every finalist uses it."""
    without = [r for r in others if not uses(r)]
    if not without:
        return ""
    meeting = [r for r in without if _meets_workload(r, workload)]
    if not meeting:
        return f" None of the {len(without)} finalists without it meets the workload."
    alt = meeting[0]
    replayed = "replay_ttft_p99_s" in alt
    ttft, tpot = (alt["replay_ttft_p99_s"], alt["replay_tpot_p99_s"]) if replayed else (alt["ttft_p99_s"], alt["tpot_p99_s"])
    cost = "cost_per_million_output_tokens_usd"
    price = (f"${alt[cost]:,.2f} per million output tokens against the winner's ${winner[cost]:,.2f}" if cost in alt and cost in winner
             else f"${alt['hourly_usd']:,.2f} an hour against the winner's ${winner['hourly_usd']:,.2f}")
    return (f" The best finalist without it: {_layout(alt)}, {price}, "
            f"{'replayed ' if replayed else ''}p99 TTFT {ttft * 1e3:,.0f} ms, TPOT {tpot * 1e3:,.1f} ms.")


def _high_ratio(row: dict, metric: str) -> float | None:
    """The band's high end over the prediction for `metric` (ttft, tpot), applied to the p99 as well."""
    high = row.get(f"{metric}_mean_s_p90")
    mean = row.get(f"replay_{metric}_mean_s", row[f"{metric}_mean_s"])
    if high is None or not mean or not math.isfinite(mean):
        return None
    return high / mean


def _layout(row: dict) -> str:
    """A row's deployment as every line under the winner spells it: '16 x h100_sxm as TP2xPP1xDP8'."""
    return f"{row['num_gpus']} x {row['gpu']} as {kind_label(row)}"
