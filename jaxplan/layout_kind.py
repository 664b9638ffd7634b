"""Which kind of layout a sweep row is, as its fields and as a compact label.

A row's `data_parallel_size` counts engine ranks (replicas of TP x PP GPUs, each with its own scheduler
and KV cache), as `physics.shapes.Layout` does. The kind says how they are launched (vLLM's flags):

  kind    servers (separate `vllm serve` deployments)      flags of each
  tp      dense: 1 (its --data-parallel-size ranks are      --tensor-parallel-size T --pipeline-parallel-size P
          independent); MoE: one per replica                (dense: + --data-parallel-size replicas)
  ep      one per replica                                   + --enable-expert-parallel
  dp      replicas / D, each of D lock-step ranks           + --data-parallel-size D
  dp_ep   replicas / D                                      + --data-parallel-size D --enable-expert-parallel

Labels (tables, figures, `Finalist.layout`): one server of kind tp keeps `TP4xPP1xDP2` (a dense
model's DP replicas are one server; a MoE model's single tp server reads `TP8xPP1xDP1`). Otherwise
the label names one server and prefixes the count of servers when there are several:
  `4x(TP2xPP1)`                  four independent servers behind a router (kind tp)
  `TP4xPP1 EP4`                  one server with --enable-expert-parallel (kind ep)
  `TP1xPP2 DP4-lockstep`         --data-parallel-size 4, experts sliced over 4 GPUs (kind dp)
  `2x(TP1xPP1 DP8-lockstep EP8)` two servers, each DP 8 with expert parallelism (kind dp_ep)
EPn is the expert-parallel group (DP x TP GPUs per pipeline stage).
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxplan.specs.space import EXPERT_PARALLEL_KINDS, LOCKSTEP_KINDS, parse_kind_label

KIND_KEYS = ("layout_kind", "lockstep_ranks", "enable_expert_parallel", "servers", "expert_weight_format")


def kind_fields(kind_label: str, dp_axis_value: int, weight_dtype: str, is_moe: bool) -> dict:
    """The row fields of a grid candidate: `data_parallel_size` (replicas = the DP axis value x the
    lock-step ranks) and KIND_KEYS. kind_label: the grid's layout-kind label ('tp', 'dp_ep:8')."""
    kind, ranks = parse_kind_label(kind_label)
    replicas = int(dp_axis_value) * ranks
    if kind in LOCKSTEP_KINDS:
        servers = replicas // ranks
    else:
        servers = replicas if is_moe else 1
    return {
        "data_parallel_size": replicas, "layout_kind": kind, "lockstep_ranks": ranks,
        "enable_expert_parallel": kind in EXPERT_PARALLEL_KINDS, "servers": servers, "expert_weight_format": weight_dtype,
    }


def row_kind(row: Mapping) -> tuple[str, int, bool, int]:
    """(kind, lock-step ranks D, expert parallel, servers) of a row; a row without the kind fields
    (written before they existed, or by hand) is a tp layout of one server."""
    kind = str(row.get("layout_kind") or "tp")
    ranks = int(row.get("lockstep_ranks") or 1)
    return kind, ranks, bool(row.get("enable_expert_parallel", kind in EXPERT_PARALLEL_KINDS)), int(row.get("servers") or 1)


def is_independent_servers(row: Mapping) -> bool:
    """True for a MoE row of several tp / ep replicas: one `vllm serve` per replica behind a router."""
    kind, _, _, servers = row_kind(row)
    return kind not in LOCKSTEP_KINDS and servers > 1


def kind_label(row: Mapping) -> str:
    """The compact label of a row's layout (module docstring)."""
    tp, pp, replicas = int(row["tensor_parallel_size"]), int(row["pipeline_parallel_size"]), int(row["data_parallel_size"])
    kind, ranks, expert_parallel, servers = row_kind(row)
    if kind == "tp" and servers == 1:
        return f"TP{tp}xPP{pp}xDP{replicas}"  # a dense model's (its DP replicas are one server), or one MoE server
    one = f"TP{tp}xPP{pp}"
    if kind in LOCKSTEP_KINDS:
        one += f" DP{ranks}-lockstep"
    if expert_parallel:
        one += f" EP{ranks * tp}"
    return one if servers == 1 else f"{servers}x({one})"


def kind_name(row: Mapping) -> str:
    """The kind as the sweep compares kinds: 'tp', 'ep', 'dp:4', 'dp_ep:8' (lock-step kinds with D)."""
    kind, ranks, _, _ = row_kind(row)
    return f"{kind}:{ranks}" if kind in LOCKSTEP_KINDS else kind
