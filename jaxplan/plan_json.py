"""A Plan read back from the JSON `jaxplan sweep --json` (or `Plan.to_json`) wrote, without recomputing.

Specs are rebuilt through the same typed loader as TOML files (`specs.loader.build`), so a file edited
by hand fails with a one-line PlanError naming the field; a null float is the inf JSON cannot hold.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Mapping

from jaxplan.errors import PlanError
from jaxplan.finalist import Finalist, Winner
from jaxplan.funnel.sweep import StageCount
from jaxplan.inputs import Inputs
from jaxplan.specs.gpu import GpuSpec
from jaxplan.specs.model import ModelSpec
from jaxplan.specs.space import SearchSpace
from jaxplan.specs.workload import Workload

KEYS = ("model", "workload", "space", "gpus", "grid_size", "funnel", "replay", "shortlist", "frontier", "winner")


def plan_from_dict(payload: Mapping, where: str):
    """The Plan of a parsed `sweep --json` payload; `where` names it in errors."""
    from jaxplan.plan import Plan

    if not isinstance(payload, Mapping) or any(k not in payload for k in KEYS):
        missing = [k for k in KEYS if not isinstance(payload, Mapping) or k not in payload]
        raise PlanError(f"{where}: not a `jaxplan sweep --json` file (no {', '.join(missing)}); give a file the sweep wrote")
    try:
        inputs = Inputs(
            _spec(ModelSpec, payload["model"], "model"), tuple(_spec(GpuSpec, g, "gpus") for g in payload["gpus"]),
            _spec(Workload, payload["workload"], "workload"), _spec(SearchSpace, payload["space"], "space"),
            str(payload["space"].get("name", "")),
        )
        shortlist = tuple(Finalist.from_row(r) for r in payload["shortlist"])
        replayed = payload["replay"]
        return Plan(
            inputs=inputs, funnel=tuple(StageCount(**s) for s in payload["funnel"]), grid_size=int(payload["grid_size"]),
            shortlist=shortlist, finalists=tuple(Finalist.from_row(r) for r in replayed) if replayed else shortlist,
            frontier=tuple(Finalist.from_row(r) for r in payload["frontier"]),
            winner=Winner.from_row(payload["winner"]) if payload["winner"] else None,
            replay_rank_correlation=payload.get("replay_rank_correlation_with_stage4"),
            sizing=_sizing(payload.get("sizing"), inputs.workload), compile_s=payload.get("compile_s", 0.0), run_s=payload.get("run_s", 0.0),
            num_devices=payload.get("num_devices", 1), empty_explanation=payload.get("empty_explanation"),
            verdict=_verdict(payload.get("winner_verdict")), vllm_version=str(payload.get("vllm_version") or ""),
        )
    except PlanError as error:
        raise PlanError(f"{where}: {error}") from None
    except (TypeError, KeyError, ValueError, AttributeError) as error:
        raise PlanError(f"{where}: malformed sweep JSON ({type(error).__name__}: {error}); give a file `jaxplan sweep --json` wrote") from None


def _verdict(data):
    """The winner's verdict from its `to_dict` (None in a file written without bands)."""
    if data is None:
        return None
    from jaxplan.plan_bands import Verdict

    return Verdict(data.get("lead"), bool(data["close"]), tuple(str(n) for n in data["notes"]))


def _spec(cls, data, where: str):
    """A spec dataclass from its JSON fields: nulls in float fields back to inf, then the loader's typed build."""
    from jaxplan.specs.loader import build

    if not isinstance(data, Mapping):
        raise PlanError(f"{where}: expected a table of fields, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {k: (math.inf if v is None and hints.get(k) is float else v) for k, v in data.items() if k != "name"}
    return build(cls, fields, name=str(data.get("name", "")), where=where)


def _sizing(data, workload: Workload):
    """Sizing from its `to_json` (a rollout's extra columns dropped; `rollout_prompts` kept)."""
    if data is None:
        return None
    from jaxplan.sizing import Choice, Sizing

    def row(r):
        return {k: (math.inf if v is None else v) for k, v in r.items() if k not in ("rollout_s", "rollout_usd")}

    per_gpu = [Choice(c["gpu"], row(c["smallest"]), row(c["cheapest_per_token"]), int(c["feasible_layouts"])) for c in data["per_gpu"]]
    prompts = (data.get("rollout") or {}).get("prompts")
    return Sizing(float(data["target_output_tokens_per_s"]), float(workload.osl_mean_tokens), per_gpu, list(data["no_feasible_layout"]), prompts)


__all__ = ["plan_from_dict"]
