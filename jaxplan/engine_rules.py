"""vLLM's own rules for configuration rows: what it refuses to start, or the requests it turns away.

`predict` and `simulate` mark such rows `invalid: ...` instead of predicting them. The engine rules
are the sweep's (`funnel.rules`, evaluated over all rows of a model at once); the replay's limits and
the context length are checked here, per row."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxplan.buckets import bucket_size, pad_rows
from jaxplan.engine_defaults import batch_knobs
from jaxplan.errors import PlanError
from jaxplan.funnel.rules import BUDGET_BELOW_SEQS, ENGINE_RULES, LAYOUT_RULES
from jaxplan.physics.shapes import ModelShape, model_shape
from jaxplan.row_gpu import gpu_key, row_gpu
from jaxplan.specs import load_model
from jaxplan.specs.model import ModelSpec


def _number(row: dict, field: str, default: float = math.nan) -> float:
    value = row.get(field)
    return default if value in (None, "") else float(value)


def _knobs(row: dict) -> tuple[float, float]:
    """(max_num_seqs, max_num_batched_tokens) the row's server runs: those it states, vLLM's values on
    its GPU for those it leaves out (`engine_defaults.batch_knobs`); NaN for a knob left out where the
    row's GPU is not valid (`prediction.row_batches` reports that)."""
    seqs, budget = _number(row, "max_num_seqs"), _number(row, "max_num_batched_tokens")
    if not (math.isnan(seqs) or math.isnan(budget)):
        return seqs, budget
    try:
        gpu = row_gpu(gpu_key(row, "row"), "row")  # the row's own GPU: its HBM override decides vLLM's defaults
    except PlanError:
        return seqs, budget
    return batch_knobs(gpu, None if math.isnan(seqs) else seqs, None if math.isnan(budget) else budget)


def engine_arguments(rows: list[dict]) -> tuple[np.ndarray, ...]:
    """(tp, pp, max_num_seqs, max_num_batched_tokens) [R] float64 for `funnel.rules`: TP and PP
    default to 1; the knobs as the row's server runs them (`_knobs`)."""
    sizes = lambda field: np.array([float(int(_number(r, field, 0.0) or 1)) for r in rows])  # noqa: E731
    knobs = np.array([_knobs(r) for r in rows], np.float64).reshape(len(rows), 2)
    return sizes("tensor_parallel_size"), sizes("pipeline_parallel_size"), knobs[:, 0], knobs[:, 1]


@jax.jit
def _rules_fail(shape: ModelShape, tp, pp, seqs, budget):
    """[len(ENGINE_RULES), R] bool: each engine rule's verdict on every row. One program for the rules'
    few dozen operations, which evaluated one by one were as many small programs to compile or load."""
    return jnp.stack([jnp.broadcast_to(rule.fails(shape, tp, pp, seqs, budget), jnp.shape(tp)) for rule in ENGINE_RULES])


def rule_failures(shape: ModelShape, engine: tuple[np.ndarray, ...]) -> dict:
    """Reason -> [R] bool (NumPy) for every engine rule on the rows' `engine_arguments`: the rows
    padded to a power of two (at least 8, the last row repeated), so that row counts share programs."""
    num = len(engine[0])
    padded = pad_rows(tuple(np.asarray(a, np.float32) for a in engine), num, bucket_size(num, 8))
    fails = np.asarray(_rules_fail(shape, *padded))[:, :num]
    return {rule.reason: fails[i] for i, rule in enumerate(ENGINE_RULES)}


def invalid_reasons(model: ModelSpec, rows: list[dict]) -> list[str | None]:
    """Per row, why vLLM would refuse its engine or its requests (one line, starting "invalid:"), or None.
    In order: the layout rules (attention heads, KV heads, PP stages), the replay's limits, the token
    budget against max_num_seqs, the requests' length against the context."""
    from jaxplan.replay.config import LIMITS

    shape: ModelShape = model_shape(model)
    engine = engine_arguments(rows)
    fails = rule_failures(shape, engine)
    out: list[str | None] = []
    for k, row in enumerate(rows):
        values = tuple(float(a[k]) for a in engine)
        layout = next((rule for rule in LAYOUT_RULES if fails[rule.reason][k]), None)
        if layout is not None:
            out.append("invalid: " + layout.says(model.name, shape, *values))
            continue
        over = next(((field, int(_number(row, field))) for field in ("pipeline_parallel_size", "data_parallel_size", "max_num_seqs", "max_num_batched_tokens")
                     if row.get(field) not in (None, "") and int(_number(row, field)) > LIMITS[field]), None)
        if over is not None:
            out.append(f"invalid: {over[0]} {over[1]:,} is above the {LIMITS[over[0]]:,} jaxplan models")
            continue
        if fails[BUDGET_BELOW_SEQS.reason][k]:
            default = "" if row.get("max_num_batched_tokens") not in (None, "") else (
                f"; {values[3]:,.0f} is vLLM's default on {row.get('gpu')}: state max_num_batched_tokens of at least {values[2]:,.0f}")
            out.append("invalid: " + BUDGET_BELOW_SEQS.says(model.name, shape, *values) + default)
            continue
        length = _number(row, "isl") + _number(row, "osl")
        if length > model.max_position_embeddings:  # NaN (either not given) compares False
            out.append(f"invalid: isl + osl = {length:,.0f} tokens exceeds {model.name}'s context of {model.max_position_embeddings:,} (vLLM rejects such requests)")
            continue
        out.append(None)
    return out


def invalid_rows(rows: list[dict], source: str) -> dict[int, str]:
    """Row index -> `invalid_reasons`' line, for the rows vLLM would refuse (rows grouped by model)."""
    groups: dict[str, tuple[ModelSpec, list[int]]] = {}
    for i, row in enumerate(rows):
        name = str(row.get("model") or "").strip()
        if not name:
            continue  # row_batches names the missing model
        if name not in groups:
            try:
                groups[name] = (load_model(name), [])
            except PlanError as err:
                raise PlanError(f"{source} row {i + 1}: {err}") from None
        groups[name][1].append(i)
    out = {}
    for model, ids in groups.values():
        for i, reason in zip(ids, invalid_reasons(model, [rows[i] for i in ids])):
            if reason:
                out[i] = reason
    return out
