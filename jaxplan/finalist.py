"""Typed results above stage 4: a finalist (layout + stage-4 metrics + replayed metrics) and the winner.

The funnel and the replay hand over rows (dicts, `jaxplan.funnel.sweep.rows_for` and
`jaxplan.funnel.replay_stage.replay_rows`); `Finalist.from_row` types them once, `to_row` gives
back the same dict (same keys, same order) for tables, CSV and JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jaxplan.errors import PlanError
from jaxplan.layout_kind import KIND_KEYS, kind_label

REPLAY_PREFIX = "replay_"


@dataclasses.dataclass(frozen=True)
class ReplayMetrics:
    """Stage 7's metrics of one finalist (seconds, tokens/s; p99 = at the workload's SLO percentile)."""

    output_tokens_per_s: float
    ttft_mean_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p99_s: float
    goodput_req_per_s: float
    slo_attainment: float  # fraction of requests within the SLOs
    mean_batch_size: float
    kv_utilization_peak: float  # fraction of the KV blocks
    preemptions: int
    unfinished: int
    requests: int  # requests replayed
    routing: str
    score: float  # the funnel's objective on replayed numbers; failing finalists score below passing ones
    # Under Poisson traffic, whether it keeps up (`jaxplan.replay.backlog`); rows written before these
    # existed read as keeping up, as stage 4 judged them.
    falls_behind: bool = False  # its queue stops emptying while requests arrive
    queue_at_last_arrival: int = 0  # requests never yet admitted when the last one arrives
    sustained_output_tokens_per_s: float = float("nan")  # output tokens made in the arrivals' last third / its length


@dataclasses.dataclass(frozen=True)
class Finalist:
    """One configuration with its stage-4 estimate (SI units; cost in USD) and, after stage 7, `replay`."""

    gpu: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    weight_dtype: str
    kv_cache_dtype: str
    data_parallel_size: int
    num_gpus: int
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    requests_per_s: float
    ttft_mean_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p99_s: float
    concurrency_per_replica: float
    max_concurrency_per_replica: float
    utilization: float
    bound: int
    kv_blocks_per_replica: int
    hourly_usd: float
    cost_per_million_output_tokens_usd: float
    score: float  # stage 4's objective
    reason: int
    digits: tuple[int, ...]  # the candidate's index along each grid axis
    # The layout's kind (`jaxplan.layout_kind`); a row written without them reads as one tp server.
    layout_kind: str = "tp"  # tp | ep | dp | dp_ep
    lockstep_ranks: int = 1  # vLLM's --data-parallel-size of a lock-step kind (D), else 1
    enable_expert_parallel: bool = False
    servers: int = 1  # separate `vllm serve` deployments (a dense model's DP replicas are one)
    expert_weight_format: str = ""  # routed experts' format (the weight dtype; mxfp4 / int4 leave the rest bf16)
    replay: ReplayMetrics | None = None
    extra: tuple[tuple[str, object], ...] = ()  # row keys this class does not name, kept in order for `to_row`

    @classmethod
    def from_row(cls, row: Mapping) -> Finalist:
        """A sweep row (with `replay_*` keys after stage 7; a JSON row may carry null for inf)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("replay", "extra")]
        replay_names = [REPLAY_PREFIX + f.name for f in dataclasses.fields(ReplayMetrics)]
        missing = [n for n in names if n not in row and n not in KIND_KEYS]
        if missing:
            raise PlanError(f"a finalist row lacks {', '.join(missing)}; pass rows a sweep wrote (jaxplan sweep --json)")
        values = {n: _number(row[n]) for n in names if n in row}
        values["digits"] = tuple(int(d) for d in row["digits"])
        replay = None
        if any(n in row for n in replay_names):
            required = [REPLAY_PREFIX + f.name for f in dataclasses.fields(ReplayMetrics) if f.default is dataclasses.MISSING]
            if lacking := [n for n in required if n not in row]:
                raise PlanError(f"a replayed finalist row lacks {', '.join(lacking)}; pass rows a sweep wrote (jaxplan sweep --json)")
            replay = ReplayMetrics(**{n.removeprefix(REPLAY_PREFIX): _number(row[n], nan_if_null=n in NULL_IS_NAN) for n in replay_names if n in row})
        extra = tuple((k, v) for k, v in row.items() if k not in names and k not in replay_names)
        return cls(**values, replay=replay, extra=extra)

    def to_row(self) -> dict:
        """The row as the funnel and the replay write it (`replay_*` keys when replayed; digits a list)."""
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("replay", "extra")}
        row["digits"] = list(self.digits)
        row.update(self.extra)
        if self.replay is not None:
            row.update({REPLAY_PREFIX + f.name: getattr(self.replay, f.name) for f in dataclasses.fields(ReplayMetrics)})
        return row

    @property
    def band(self) -> dict | None:
        """The p10-p90 band the plan gave this finalist (`jaxplan.plan_bands.BAND_KEYS`: its class, and
        TTFT / TPOT means in s and output tokens/s at p10 and p90), or None."""
        from jaxplan.plan_bands import BAND_KEYS

        extra = dict(self.extra)
        return {k: extra[k] for k in BAND_KEYS if k in extra} or None

    @property
    def layout(self) -> str:
        """'4 x h100_sxm: TP2xPP1xDP2', '8 x h200_sxm: TP1xPP1 DP8-lockstep EP8' (`layout_kind.kind_label`)."""
        return f"{self.num_gpus} x {self.gpu}: {kind_label(self.to_row())}"


# Replay metrics that are NaN where they do not apply (JSON writes both NaN and inf as null).
NULL_IS_NAN = frozenset({REPLAY_PREFIX + "sustained_output_tokens_per_s"})


def _number(value, nan_if_null: bool = False):
    """JSON writes inf as null: read it back as inf for a metric (never None), or as NaN for a metric
    that has no value where it does not apply (`NULL_IS_NAN`)."""
    return (float("nan") if nan_if_null else float("inf")) if value is None else value


@dataclasses.dataclass(frozen=True)
class Winner:
    """The best finalist and how to launch it: `serve_command` (the first `vllm serve` line: the head
    node's, or the first server's), `other_node_commands` (the further lines: one per further node
    when a server's ranks span nodes, one per further server of a MoE model's independent servers),
    `line_labels` (where each of `serve_commands` runs), `launch_note` (how they fit together: the
    router over independent servers, lock-step ranks), the KV-cache size to check in vLLM's log, what
    the replay found it misses (None: not replayed; []: meets it all) and, for a MoE model, `why`:
    how it beats the best layout of each other kind on the same GPUs (`jaxplan.why_it_wins`).
    Metric names not defined here read through to `finalist` (winner.output_tokens_per_s)."""

    finalist: Finalist
    serve_command: str
    other_node_commands: tuple[str, ...]
    kv_cache_check: str
    replay_shortfalls: tuple[str, ...] | None
    line_labels: tuple[str, ...] = ()
    launch_note: str = ""
    why: tuple[str, ...] = ()

    @property
    def serve_commands(self) -> tuple[str, ...]:
        """Every line, the head node's (first server's) first."""
        return (self.serve_command, *self.other_node_commands)

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "finalist":
            raise AttributeError(name)
        return getattr(self.finalist, name)

    def to_row(self) -> dict:
        """The winner as `sweep --json` writes it: the finalist's row plus its launch lines."""
        row = dict(
            self.finalist.to_row(), vllm_serve=self.serve_command, kv_cache_check=self.kv_cache_check, vllm_serve_other_nodes=list(self.other_node_commands),
            vllm_serve_labels=list(self.line_labels), launch_note=self.launch_note, why_it_wins=list(self.why),
        )
        if self.replay_shortfalls is not None:
            row["replay_shortfalls"] = list(self.replay_shortfalls)
        return row

    @classmethod
    def from_row(cls, row: Mapping) -> Winner:
        launch = ("vllm_serve", "kv_cache_check", "vllm_serve_other_nodes", "replay_shortfalls", "vllm_serve_labels", "launch_note", "why_it_wins")
        shortfalls = row.get("replay_shortfalls")
        return cls(
            Finalist.from_row({k: v for k, v in row.items() if k not in launch}), row["vllm_serve"],
            tuple(row.get("vllm_serve_other_nodes") or ()), row["kv_cache_check"], None if shortfalls is None else tuple(shortfalls),
            tuple(row.get("vllm_serve_labels") or ()), str(row.get("launch_note") or ""), tuple(row.get("why_it_wins") or ()),
        )
