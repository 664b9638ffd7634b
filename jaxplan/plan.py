"""The composition layer: inputs -> funnel (stages 1-6) -> replay (stage 7) -> sizing -> a typed `Plan`.

The CLI, the HTML report and a notebook call `run_plan` (or `jaxplan.sweep`); nothing here imports
the CLI. A Plan serialises to the JSON `jaxplan sweep --json` writes and reads back from it
(`Plan.from_json`), without the live sweep (figures and sensitivities need `Plan.sweep`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from jaxplan import vllm_release
from jaxplan.errors import PlanError, bad_value
from jaxplan.finalist import Finalist, Winner
from jaxplan.inputs import Inputs
from jaxplan.jsonio import json_text



@dataclasses.dataclass(frozen=True)
class Plan:
    """A sweep's answer. finalists: best first (re-ranked by the replay when it ran, else stage 4's
    order, which `shortlist` always keeps); winner: finalists[0] with its launch lines (None when
    nothing survived, see `empty_explanation`); funnel: candidates admitted/rejected per stage;
    sizing: per GPU type the fewest GPUs and the cheapest per token (with a throughput target).
    sweep: the live `SweepResult` (None for a plan read from JSON)."""

    inputs: Inputs
    funnel: tuple  # StageCount per stage 1..6
    grid_size: int
    shortlist: tuple[Finalist, ...]
    finalists: tuple[Finalist, ...]
    frontier: tuple[Finalist, ...]
    winner: Winner | None
    replay_rank_correlation: float | None  # Spearman, stage 4 vs replay scores (None: no replay or under 3)
    sizing: object | None  # jaxplan.sizing.Sizing
    compile_s: float
    run_s: float
    num_devices: int
    empty_explanation: str | None
    replay_s: float | None = None  # wall time of stage 7
    seed: int = 0  # of the replay's request sample
    verdict: object | None = None  # jaxplan.plan_bands.Verdict: does the winner's lead exceed the bands?
    vllm_version: str = ""  # the vLLM release every candidate was priced for (`vllm_release`; "" in older files)
    sweep: object | None = dataclasses.field(default=None, compare=False, repr=False)

    model = property(lambda self: self.inputs.model)
    gpus = property(lambda self: self.inputs.gpus)
    workload = property(lambda self: self.inputs.workload)
    space = property(lambda self: self.inputs.space)

    @property
    def replayed(self) -> bool:
        return bool(self.finalists) and self.finalists[0].replay is not None

    def to_dict(self) -> dict:
        """What `jaxplan sweep --json` writes, as Python (inf kept; `to_json` writes it as null)."""
        payload = {
            "model": dataclasses.asdict(self.model),
            "workload": dataclasses.asdict(self.workload),
            "space": dataclasses.asdict(self.space),
            "gpus": [dataclasses.asdict(g) for g in self.gpus],
            "grid_size": self.grid_size,
            "funnel": [dataclasses.asdict(s) for s in self.funnel],
            "replay": [f.to_row() for f in self.finalists] if self.replayed else None,
            "replay_rank_correlation_with_stage4": self.replay_rank_correlation,
            "compile_s": self.compile_s,
            "run_s": self.run_s,
            "num_devices": self.num_devices,
            "shortlist": [f.to_row() for f in self.shortlist],
            "frontier": [f.to_row() for f in self.frontier],
            "winner": self.winner.to_row() if self.winner else None,
            "winner_verdict": self.verdict.to_dict() if self.verdict is not None else None,
            "empty_explanation": self.empty_explanation,
            "vllm_version": self.vllm_version,
        }
        if self.sizing is not None:
            payload["sizing"] = self.sizing.to_json()
        return payload

    def to_json(self) -> str:
        """Strict JSON text (inf as null), the same content as `jaxplan sweep --json`."""
        return json_text(self.to_dict())

    @classmethod
    def from_json(cls, source: str | Path | Mapping) -> Plan:
        """A Plan from `to_json`'s text, a path to a `sweep --json` file, or the parsed dict."""
        from jaxplan.plan_json import plan_from_dict

        if isinstance(source, Mapping):
            return plan_from_dict(source, "the plan")
        if isinstance(source, Path) or not str(source).lstrip().startswith(("{", "[")):
            where = str(source)
            try:
                text = Path(source).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as error:
                raise PlanError(f"{where}: cannot read ({getattr(error, 'strerror', None) or error}); give a file `jaxplan sweep --json` wrote") from None
        else:
            where, text = "the plan", str(source)
        try:
            payload = json.loads(text)
        except json.JSONDecodeError as error:
            raise PlanError(f"{where}: not JSON ({error}); give a file `jaxplan sweep --json` wrote") from None
        return plan_from_dict(payload, where)

    def to_pandas(self):
        """The finalists as a pandas DataFrame, best first (one row each; replayed metrics as `replay_*`)."""
        try:
            import pandas
        except ImportError:
            raise PlanError("Plan.to_pandas needs pandas, which is not installed; pip install pandas (or use plan.to_dict()['replay'] / ['shortlist'])") from None
        return pandas.DataFrame([f.to_row() for f in self.finalists])


def check_options(*, top: int, chunk_size: int | None, replay_requests: int, seed: int, routing: str) -> None:
    """The run options' ranges (the CLI's typer options check the same); chunk_size None: the default."""
    options = [("top", top, 1, 1000), ("replay_requests", replay_requests, 10, 1_000_000), ("seed", seed, 0, 2**63)]
    if chunk_size is not None:
        options.append(("chunk_size", chunk_size, 1024, 1 << 24))
    for name, value, low, high in options:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise bad_value(name, value, f"must be an integer in {low:,}..{high:,}")
    from jaxplan.replay.routing import routing_policy  # imports JAX, which the run needs anyway

    routing_policy(routing)


def stage7_deadline(max_seconds: float | None, started: float, finalists: int, requests: int):
    """The `progress` that stops stage 7 once the whole run (begun at `started`, perf_counter)
    projects past `max_seconds`; None without a limit."""
    if max_seconds is None:
        return None
    from jaxplan.deadline import Deadline

    return Deadline(
        max_seconds, start=started, what=f"stage 7 (the replay of {finalists} finalists x {requests:,} requests)", unit="output tokens",
        fix="use fewer --replay-requests, a smaller --top or --no-replay",
    )


def _quiet(text: str):
    import contextlib

    return contextlib.nullcontext()


def run_plan(
    inputs: Inputs,
    *,
    top: int = 20,
    chunk_size: int | None = None,
    params: str | Path | None = None,
    replay: bool = True,
    replay_requests: int = 2000,
    seed: int = 0,
    routing: str = "round_robin",
    size: bool = False,
    replay_sizing: bool | None = None,
    rollout_prompts: int | None = None,
    max_seconds: float | None = None,
    max_memory_gib: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_funnel: Callable[[object], None] | None = None,
    replay_status: Callable[[str], object] = _quiet,
    vllm_version: str | None = None,
) -> Plan:
    """Stages 1-6 over the grid, stage 7 over the shortlist (`replay`), and sizing (`size`, needs the
    workload's throughput target; `rollout_prompts`: a batch job's prompts, for its wall time), its
    picks replayed too (`replay_sizing`, default `replay`). Refused up front when the sweep's estimated time or memory exceeds
    `max_seconds` / `max_memory_gib` (default: the machine's available memory). `vllm_version`: the
    release every candidate is priced for (default: $JAXPLAN_VLLM_VERSION, else the newest measured).

    Hooks for a front end: `progress(done, total)` per chunk, `on_funnel(sweep_result)` before the
    replay, `replay_status(text)` a context manager around it (a spinner)."""
    from jaxplan.funnel.budget import GIB
    from jaxplan.funnel.sweep import run_sweep
    from jaxplan.system import available_memory_bytes

    check_options(top=top, chunk_size=chunk_size, replay_requests=replay_requests, seed=seed, routing=routing)
    started = time.perf_counter()
    result = run_sweep(
        inputs.model, inputs.gpus, inputs.workload, inputs.space, top_k=top, chunk_size=chunk_size,
        params_path=str(params) if params else None, progress=progress, max_seconds=max_seconds,
        max_memory_bytes=max_memory_gib * GIB if max_memory_gib is not None else available_memory_bytes(), vllm_version=vllm_version,
    )
    if on_funnel is not None:
        on_funnel(result)
    replayed, replay_s = None, None
    if replay and result.shortlist:
        from jaxplan.funnel.replay_stage import replay_rows

        t0 = time.perf_counter()
        with replay_status(f"stage 7: replaying {len(result.shortlist)} finalists x {replay_requests:,} requests"):
            deadline = stage7_deadline(max_seconds, started, len(result.shortlist), replay_requests)
            replayed = replay_rows(result, result.shortlist, num_requests=replay_requests, seed=seed, routing=routing, progress=deadline)
        replay_s = time.perf_counter() - t0
    sizing = None
    if size and result.shortlist:
        from jaxplan.sizing import replay_picks, size_deployments

        sizing = size_deployments(result, rollout_prompts=rollout_prompts)
        if replay if replay_sizing is None else replay_sizing:  # stage 4 picked them; the replay checks them as it checks the finalists
            with replay_status("replaying the sizing's picks"):
                sizing = replay_picks(sizing, result, replayed or (), num_requests=replay_requests, seed=seed, routing=routing,
                                      progress=stage7_deadline(max_seconds, started, 2 * len(sizing.per_gpu), replay_requests))
    release = ".".join(map(str, vllm_release.selected(vllm_version)))
    return plan_of(inputs, result, replayed, sizing, replay_s, seed, params=params, vllm_version=release)


def plan_of(inputs: Inputs, result, replayed: list[dict] | None, sizing=None, replay_s: float | None = None, seed: int = 0,
            params: str | Path | None = None, vllm_version: str = "") -> Plan:
    """Type a sweep result (and its replayed rows) as a Plan: each finalist gets its p10-p90 band
    (`plan_bands`, from the bands that go with `params`), the winner its launch lines and a verdict on
    its lead over the runner-up."""
    from jaxplan.funnel.replay_stage import rank_agreement
    from jaxplan.plan_bands import verdict, with_bands

    def banded(rows):
        return with_bands(rows, result.model.name, result.workload, result.grid.space.block_size_tokens, str(params) if params else None)

    shortlist_rows = banded(result.shortlist)
    final_rows = banded(replayed) if replayed else shortlist_rows
    shortlist = tuple(Finalist.from_row(r) for r in shortlist_rows)
    finalists = tuple(Finalist.from_row(r) for r in final_rows) if replayed else shortlist
    agreement = rank_agreement(replayed) if replayed else math.nan
    return Plan(
        inputs=inputs, funnel=tuple(result.stages), grid_size=result.grid.size, shortlist=shortlist, finalists=finalists,
        frontier=tuple(Finalist.from_row(r) for r in result.frontier), winner=winner_of(result, finalists[0], bool(replayed)) if finalists else None,
        replay_rank_correlation=agreement if math.isfinite(agreement) else None, sizing=sizing,
        compile_s=result.compile_s, run_s=result.run_s, num_devices=result.num_devices,
        empty_explanation=None if result.shortlist else result.empty_explanation(), replay_s=replay_s, seed=seed, sweep=result,
        verdict=verdict(final_rows, result.workload), vllm_version=vllm_version,
    )


def winner_of(result, best: Finalist, replayed: bool) -> Winner:
    """The winner's `vllm serve` line(s), how they fit together and the KV-cache check; for a MoE
    model, why it beats the best layout of each other kind (`why_it_wins`). The replay ranks passing
    finalists first, so a replayed winner with shortfalls means every finalist has some."""
    from jaxplan.funnel.replay_stage import replay_shortfalls
    from jaxplan.report.vllm_command import kv_cache_check, launch_note, serve_lines
    from jaxplan.why_it_wins import why_it_wins

    row = best.to_row()
    space = result.grid.space
    node_gpus = next((g.launch_gpus_per_host for g in result.grid.gpus if g.name == best.gpu), None)
    lines = serve_lines(result.model, row, space.gpu_memory_utilization, space.block_size_tokens, gpus_per_node=node_gpus,
                        enable_prefix_caching=space.enable_prefix_caching)
    shortfalls = tuple(replay_shortfalls(row, result.workload)) if replayed else None
    return Winner(
        best, lines[0].command, tuple(line.command for line in lines[1:]), kv_cache_check(row, space.block_size_tokens), shortfalls,
        tuple(line.label for line in lines), launch_note(result.model, row, node_gpus), tuple(why_it_wins(result, row)),
    )
