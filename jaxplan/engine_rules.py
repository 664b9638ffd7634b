"""vLLM's own rules for a configuration row: what it refuses to start, or the requests it turns away.

`predict` and `simulate` mark such rows `invalid: ...` instead of predicting them."""

from __future__ import annotations

from jaxplan.errors import PlanError
from jaxplan.specs import load_model
from jaxplan.specs.model import ModelSpec


def invalid_reason(model: ModelSpec, row: dict) -> str | None:
    """Why vLLM would refuse this row's engine or its requests (one line, starting "invalid:"), or None.
    vLLM's own rules: attention heads divide by TP, KV heads divide by TP or TP by them (replicated),
    at least one layer per pipeline stage (uneven stages are allowed, and priced at the mean), a token
    budget of at least max_num_seqs, requests within the context length; and the replay's limits."""
    from jaxplan.replay.config import LIMITS

    size = lambda field: int(float(row.get(field) or 1))  # noqa: E731
    tp, pp = size("tensor_parallel_size"), size("pipeline_parallel_size")
    if model.num_attention_heads % tp:
        return f"invalid: tensor_parallel_size {tp} does not divide {model.name}'s {model.num_attention_heads} attention heads (vLLM refuses to start)"
    kv = model.num_kv_heads
    if model.kv_lora_rank == 0 and kv > 0 and (kv % tp if kv >= tp else tp % kv):
        return f"invalid: tensor_parallel_size {tp} and {model.name}'s {kv} KV heads: one must divide the other (vLLM refuses to start)"
    if pp > model.num_layers:
        return f"invalid: pipeline_parallel_size {pp} exceeds {model.name}'s {model.num_layers} layers"
    for field, most in (("pipeline_parallel_size", LIMITS["pipeline_parallel_size"]), ("data_parallel_size", LIMITS["data_parallel_size"]),
                        ("max_num_seqs", LIMITS["max_num_seqs"]), ("max_num_batched_tokens", LIMITS["max_num_batched_tokens"])):
        if row.get(field) not in (None, "") and int(float(row[field])) > most:
            return f"invalid: {field} {int(float(row[field])):,} is above the {most:,} jaxplan models"
    seqs, budget = row.get("max_num_seqs"), row.get("max_num_batched_tokens")
    if seqs not in (None, "") and budget not in (None, "") and int(float(budget)) < int(float(seqs)):
        return f"invalid: max_num_batched_tokens {int(float(budget)):,} is below max_num_seqs {int(float(seqs)):,} (vLLM refuses to start)"
    isl, osl = row.get("isl"), row.get("osl")
    if isl not in (None, "") and osl not in (None, "") and float(isl) + float(osl) > model.max_position_embeddings:
        return f"invalid: isl + osl = {float(isl) + float(osl):,.0f} tokens exceeds {model.name}'s context of {model.max_position_embeddings:,} (vLLM rejects such requests)"
    return None


def invalid_rows(rows: list[dict], source: str) -> dict[int, str]:
    """Row index -> `invalid_reason`, for the rows vLLM would refuse."""
    models: dict[str, ModelSpec] = {}
    out = {}
    for i, row in enumerate(rows):
        name = str(row.get("model") or "").strip()
        if not name:
            continue  # row_batches names the missing model
        try:
            model = models.setdefault(name, load_model(name))
        except PlanError as err:
            raise PlanError(f"{source} row {i + 1}: {err}") from None
        reason = invalid_reason(model, row)
        if reason:
            out[i] = reason
    return out
