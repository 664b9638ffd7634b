"""Sizing: the smallest and the cheapest deployment per GPU type that meets a throughput target and the SLOs.

Stage 4 already removes every candidate that misses the SLOs or the target (`BELOW_TARGET`), and
the sweep's streaming per-layout table keeps the best candidate of every (GPU, TP, PP, DP) layout
under the sweep's objective (with a target: the cheapest per hour, ties to more throughput). Every
layout in that table is therefore a deployment that meets the target; per GPU type this module
picks

* the smallest: fewest GPUs (for one GPU type also the lowest USD/hour; ties: the better objective),
* the cheapest per token: lowest USD per million output tokens (more GPUs can deliver enough extra
  throughput to cost less per token, which is what a batch job pays).

For a batch job (RL rollouts: N prompts x mean OSL output tokens) the wall time is
N x OSL / (output tokens/s): throughput and rollout time are inversely proportional, so half the
throughput means twice the rollout time.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from jaxplan.errors import PlanError, bad_value
from jaxplan.funnel.estimate import HOUR_S

TIE_RELATIVE = 1e-3  # costs per token within 0.1% count as equal


def layout_rows(result) -> list[dict]:
    """Rows of the best candidate of every layout that passed stages 1-4, best first: the sweep's
    per-layout table (`sweep.layout_table`), its rows checked against the table's scores
    (`sweep.checked_rows`)."""
    from jaxplan.funnel.shortlist import top_layouts
    from jaxplan.funnel.sweep import checked_rows, layout_table

    table = layout_table(result)
    scores, digits = np.asarray(table.score), np.asarray(table.digits)
    chosen = top_layouts(scores, len(scores))
    return checked_rows(result.grid, result.context, digits[chosen], scores[chosen], what="sizing table")


@dataclasses.dataclass
class Choice:
    gpu: str
    smallest: dict  # fewest GPUs
    cheapest_per_token: dict  # lowest USD per million output tokens
    feasible_layouts: int

    @property
    def picks(self) -> list[tuple[str, dict]]:
        """(label, row) of the deployments shown for this GPU type: the fewest GPUs, and the cheapest
        per token where that is another."""
        if self.cheapest_per_token["digits"] != self.smallest["digits"]:
            return [("fewest GPUs", self.smallest), ("cheapest per token", self.cheapest_per_token)]
        return [("fewest GPUs, cheapest per token", self.smallest)]


@dataclasses.dataclass
class Sizing:
    target_output_tokens_per_s: float
    osl_mean_tokens: float
    per_gpu: list[Choice]  # in the sweep's GPU order; GPU types with no feasible layout are listed in `missing`
    missing: list[str]
    rollout_prompts: int | None = None

    @property
    def smallest_overall(self) -> dict | None:
        rows = [c.smallest for c in self.per_gpu]
        return min(rows, key=lambda r: (r["hourly_usd"], -r["score"])) if rows else None

    @property
    def cheapest_per_token_overall(self) -> dict | None:
        rows = [c.cheapest_per_token for c in self.per_gpu]
        return min(rows, key=lambda r: (r["cost_per_million_output_tokens_usd"], -r["score"])) if rows else None

    def rollout_s(self, output_tokens_per_s: float) -> float | None:
        """Wall time of the batch job at this throughput: N x mean OSL / tokens per second."""
        if self.rollout_prompts is None:
            return None
        return rollout_seconds(self.rollout_prompts, self.osl_mean_tokens, output_tokens_per_s)

    def to_json(self) -> dict:
        def row(r):
            out = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()}
            if self.rollout_prompts is not None:
                seconds = self.rollout_s(pick_tokens_per_s(r))
                out.update(rollout_s=seconds, rollout_usd=seconds / HOUR_S * r["hourly_usd"])
            return out

        payload = {
            "target_output_tokens_per_s": self.target_output_tokens_per_s,
            "per_gpu": [
                {"gpu": c.gpu, "feasible_layouts": c.feasible_layouts, "smallest": row(c.smallest), "cheapest_per_token": row(c.cheapest_per_token)}
                for c in self.per_gpu
            ],
            "no_feasible_layout": self.missing,
            "smallest_overall": row(self.smallest_overall) if self.per_gpu else None,
            "cheapest_per_token_overall": row(self.cheapest_per_token_overall) if self.per_gpu else None,
        }
        if self.rollout_prompts is not None:
            at_target = self.rollout_s(self.target_output_tokens_per_s)
            payload["rollout"] = {
                "prompts": self.rollout_prompts, "osl_mean_tokens": self.osl_mean_tokens,
                "output_tokens": self.rollout_prompts * self.osl_mean_tokens,
                "at_target_s": at_target, "at_half_target_s": self.rollout_s(0.5 * self.target_output_tokens_per_s),
            }
        return payload


def pick_tokens_per_s(row: dict) -> float:
    """A pick's output tokens/s: the replay's where `replay_picks` replayed it, else stage 4's."""
    return float(row.get("replay_output_tokens_per_s", row["output_tokens_per_s"]))


def replay_picks(sizing: Sizing, result, replayed: list[dict] = (), **replay_options) -> Sizing:
    """`sizing` with each pick replayed step by step (`replay_stage.replay_rows`, `replay_options` passed
    on: num_requests, seed, routing, progress; a pick among `replayed`, rows replayed with the same
    options, is taken from there): its rows gain the replay_* keys and `replay_shortfalls`, so the
    table, the notes and a batch job's wall time go by the replayed throughput. Stage 4 picked them;
    where vLLM preempts (`plan_bands.kv_bound`), which it does not price, the replay can serve less."""
    from jaxplan.funnel.replay_stage import replay_rows, replay_shortfalls

    picks = {tuple(r["digits"]): r for choice in sizing.per_gpu for _, r in choice.picks}
    done = {tuple(r["digits"]): r for r in replayed if tuple(r["digits"]) in picks}
    missing = [r for key, r in picks.items() if key not in done]
    if missing:
        done.update({tuple(r["digits"]): r for r in replay_rows(result, missing, **replay_options)})
    judged = {key: {**r, "replay_shortfalls": replay_shortfalls(r, result.workload)} for key, r in done.items()}
    per_gpu = [dataclasses.replace(c, smallest=judged[tuple(c.smallest["digits"])], cheapest_per_token=judged[tuple(c.cheapest_per_token["digits"])])
               for c in sizing.per_gpu]
    return dataclasses.replace(sizing, per_gpu=per_gpu)


def rollout_seconds(prompts: int, osl_mean_tokens: float, output_tokens_per_s: float) -> float:
    if output_tokens_per_s <= 0 or not math.isfinite(output_tokens_per_s):
        return math.inf
    return prompts * osl_mean_tokens / output_tokens_per_s


def size_deployments(result, rows: list[dict] | None = None, rollout_prompts: int | None = None) -> Sizing:
    """Per GPU type, the smallest and the cheapest-per-token deployment meeting the sweep's target and SLOs."""
    target = float(result.workload.target_output_tokens_per_s)
    if target <= 0:
        raise PlanError("sizing needs a throughput target: pass --target-throughput (output tokens/s for the whole deployment)")
    if rollout_prompts is not None and not (isinstance(rollout_prompts, int) and 1 <= rollout_prompts <= 10**12):
        raise bad_value("--rollout-prompts", rollout_prompts, "must be an integer number of prompts in 1..10^12")
    rows = layout_rows(result) if rows is None else rows
    per_gpu, missing = [], []
    for gpu in result.grid.labels["gpu"]:
        mine = [r for r in rows if r["gpu"] == gpu]
        if not mine:
            missing.append(gpu)
            continue
        smallest = min(mine, key=lambda r: (r["num_gpus"], -r["score"]))
        lowest = min(r["cost_per_million_output_tokens_usd"] for r in mine)
        # Within TIE_RELATIVE of the lowest cost per token, fewer GPUs win (float32 noise is not a reason to grow).
        near = [r for r in mine if r["cost_per_million_output_tokens_usd"] <= lowest * (1.0 + TIE_RELATIVE)]
        cheapest = min(near, key=lambda r: (r["num_gpus"], r["cost_per_million_output_tokens_usd"], -r["score"]))
        per_gpu.append(Choice(gpu, smallest, cheapest, len(mine)))
    return Sizing(target, float(result.workload.osl_mean_tokens), per_gpu, missing, rollout_prompts)


def _hours(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "inf"
    return f"{seconds / HOUR_S:,.2f} h" if seconds >= 600 else f"{seconds / 60:,.1f} min"


def sizing_table(sizing: Sizing):
    """A rich renderable: per GPU type, the smallest and the cheapest-per-token deployment (a table),
    then the cheapest per hour overall and, for a batch job, its wall time at the target and at half of it."""
    from rich.table import Table

    from jaxplan.plots.labels import replay_tokens_cell, split_label

    title = f"Sizing for >= {sizing.target_output_tokens_per_s:,.0f} output tokens/s within the SLOs"
    if sizing.rollout_prompts is not None:
        title += f"; rollout of {sizing.rollout_prompts:,} prompts x {sizing.osl_mean_tokens:,.0f} output tokens"
    table = Table(title=title)
    replayed = any("replay_output_tokens_per_s" in r for c in sizing.per_gpu for _, r in c.picks)
    columns = ["GPU", "pick", "GPUs", "layout", "seqs", "budget", "W/KV", "out tok/s", *(["replay tok/s"] if replayed else []), "$/hour", "$/M tok"]
    if sizing.rollout_prompts is not None:
        columns += ["rollout time", "rollout $"]
    for name in columns:
        table.add_column(name, justify="left" if name in ("GPU", "pick", "layout", "W/KV") else "right")
    for choice in sizing.per_gpu:
        for k, (pick, r) in enumerate(choice.picks):
            cells = [
                choice.gpu if k == 0 else "", pick, str(r["num_gpus"]), split_label(r), str(r["max_num_seqs"]), str(r["max_num_batched_tokens"]),
                f"{r['weight_dtype']}/{r['kv_cache_dtype']}", f"{r['output_tokens_per_s']:,.0f}",
                *([replay_tokens_cell(r) if "replay_output_tokens_per_s" in r else "-"] if replayed else []),
                f"{r['hourly_usd']:,.2f}", f"{r['cost_per_million_output_tokens_usd']:.2f}",
            ]
            if sizing.rollout_prompts is not None:
                seconds = sizing.rollout_s(pick_tokens_per_s(r))
                usd = seconds / HOUR_S * r["hourly_usd"]
                cells += [_hours(seconds), f"{usd:,.2f}" if usd < 100 else f"{usd:,.0f}"]
            table.add_row(*cells)
    for gpu in sizing.missing:
        table.add_row(gpu, "none meets the target and SLOs", *[""] * (len(columns) - 2))
    notes = []
    if sizing.per_gpu:
        best = sizing.smallest_overall
        notes.append(f"cheapest per hour: {best['gpu']} x {best['num_gpus']} ({split_label(best)}) at ${best['hourly_usd']:,.2f}/h")
    notes += unmeasured_notes(sizing)
    notes += replay_notes(sizing)
    if sizing.rollout_prompts is not None:
        at_target = sizing.rollout_s(sizing.target_output_tokens_per_s)
        half = sizing.rollout_s(0.5 * sizing.target_output_tokens_per_s)
        notes.append(
            f"rollout of {sizing.rollout_prompts:,} prompts x {sizing.osl_mean_tokens:,.0f} tokens: {_hours(at_target)} at the target "
            f"{sizing.target_output_tokens_per_s:,.0f} tok/s; at half this throughput it takes 2x longer: {_hours(half)}"
        )
    from rich.console import Group
    from rich.text import Text

    return Group(table, *(Text(n) for n in notes))


def replay_notes(sizing: Sizing) -> list[str]:
    """For replayed picks (`replay_picks`): one line for those whose replay meets the workload, one for
    each that misses it, with what it misses."""
    from jaxplan.plots.labels import split_label

    picks = [(choice.gpu, label, r) for choice in sizing.per_gpu for label, r in choice.picks if "replay_shortfalls" in r]
    if not picks:
        return []
    met = [f"{gpu} {split_label(r)}" for gpu, _, r in picks if not r["replay_shortfalls"]]
    # Under Poisson traffic a pick that keeps up serves the rate sent; its replayed tok/s counts the run's ramp and drain too.
    poisson = any(math.isfinite(float(r.get("replay_sustained_output_tokens_per_s", math.nan))) for _, _, r in picks)
    notes = [f"replayed step by step, {', '.join(met)} meet{'s' if len(met) == 1 else ''} the workload"
             + (" (keeping up with the requests sent; the replay tok/s column counts the run's ramp and drain too)" if poisson else "")] if met else []
    notes += [f"{gpu} {split_label(r)} ({label}), replayed: {'; '.join(r['replay_shortfalls'])}; `jaxplan sweep --target-throughput` "
              "ranks replayed finalists" for gpu, label, r in picks if r["replay_shortfalls"]]
    return notes


def unmeasured_notes(sizing: Sizing) -> list[str]:
    """A line for each layout part of the picks that no measured run behind the predictions checks
    (as `plan_bands.unmeasured_layout_notes` says of a sweep's winner), and one for the picks whose KV
    cache bounds their batch (`plan_bands.kv_bound`: vLLM preempts them), naming the picks."""
    from jaxplan.plan_bands import KV_BOUND_UNPRICED, LOCKSTEP_UNMEASURED, PIPELINE_UNMEASURED, kv_bound, uses_lockstep, uses_pipeline
    from jaxplan.plots.labels import split_label

    picks = [(choice.gpu, r) for choice in sizing.per_gpu for _, r in choice.picks]
    parts = ((uses_lockstep, f"{LOCKSTEP_UNMEASURED} (docs/moe.md)"), (uses_pipeline, f"{PIPELINE_UNMEASURED} (docs/accuracy.md)"),
             (kv_bound, f"{KV_BOUND_UNPRICED}; the replay (without --no-replay) counts them"))
    notes = []
    for uses, what in parts:
        users = [f"{gpu} {split_label(r)}" for gpu, r in picks if uses(r)]
        if users:
            notes.append(f"{', '.join(users)}: {what}; measure before committing.")
    return notes
