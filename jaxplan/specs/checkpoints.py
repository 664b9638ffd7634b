"""Checkpoints of a bundled model under other ids: its quantised and fine-tuned releases.

Publishers and quantisers name a model's quantised checkpoints after it, with the format last:
`Qwen/Qwen3-32B-FP8`, `RedHatAI/Meta-Llama-3.1-70B-Instruct-FP8`, `nvidia/Llama-3.3-70B-Instruct-FP4`
(ModelOpt's NVFP4), `amd/Llama-3.3-70B-Instruct-FP8-KV`, `nvidia/Kimi-K2.5-NVFP4`; and its chat
releases with a suffix (`meta-llama/Meta-Llama-3.1-70B-Instruct`, `Qwen/Qwen3-30B-A3B-Thinking-2507`).
These are what `vllm bench serve` records as `model_id` and what users type. Such an id has the
shape of the model it names, so it resolves to that bundled model, with its own id (what `vllm
serve` is given) and the format its weights are stored in (what vLLM serves, and what a row without
`weight_dtype` prices).
"""

from __future__ import annotations

import re

# Trailing name parts that say how the weights are stored -> jaxplan weight format. INT8 and other
# formats are not priced, so ids naming them stay unknown (the error then asks for the config.json).
FORMAT_PARTS = {
    "fp8": "fp8",
    "nvfp4": "nvfp4",
    "fp4": "nvfp4",  # NVIDIA ModelOpt names its NVFP4 checkpoints -FP4 (quant_algo NVFP4)
    "mxfp4": "mxfp4",
    "awq": "int4",
    "gptq": "int4",
    "int4": "int4",
    "w4a16": "int4",
}
# Trailing name parts that qualify the format without changing it: FP8-Dynamic (per-token activation
# scales), FP8-KV (KV-cache scales included; vLLM's cache dtype is still set by --kv-cache-dtype),
# W8A8-FP8, -Preview releases.
QUALIFIER_PARTS = frozenset({"dynamic", "static", "kv", "block", "w8a8", "preview"})
# Releases of one architecture: Llama-3.1-70B and Llama-3.1-70B-Instruct share a config's shape, as do
# Qwen3-30B-A3B and its 2507 Instruct and Thinking releases.
VARIANT_SUFFIXES = ("-instruct", "-it", "-chat", "-base", "-instruct-2507", "-thinking-2507")
_SPLIT = re.compile(r"[-_]")


def _normalised(repo: str) -> str:
    return repo.strip().lower().replace("_", "-")


def _bases(repo: str) -> tuple[str, ...]:
    """The names a repo (without its organisation) is matched by: as it is and without a fine-tune suffix."""
    name = _normalised(repo)
    stripped = next((name[: -len(s)] for s in VARIANT_SUFFIXES if name.endswith(s)), None)
    return (name,) if stripped is None else (name, stripped)


def split_format(hf_id: str) -> tuple[str, str | None] | None:
    """(the repo name before its format parts, the format, None if it names none) of an
    `org/name[-FORMAT...]` id; None when it is not `org/name` or names two formats."""
    if hf_id.count("/") != 1:
        return None
    parts = _SPLIT.split(hf_id.split("/")[1])
    formats = set()
    while len(parts) > 1 and (parts[-1].lower() in FORMAT_PARTS or parts[-1].lower() in QUALIFIER_PARTS):
        part = parts.pop().lower()
        if part in FORMAT_PARTS:
            formats.add(FORMAT_PARTS[part])
    if len(formats) > 1:
        return None
    return "-".join(parts), (formats.pop() if formats else None)


def base_names(known_ids: dict[str, str]) -> dict[str, str]:
    """Normalised repo name (and its form without a fine-tune suffix) -> bundled model, from
    `known_ids` (an HF id or alias -> bundled model); a name two models share is left out."""
    table: dict[str, set[str]] = {}
    for hf_id, model in known_ids.items():
        if "/" not in hf_id:
            continue
        for base in _bases(hf_id.split("/", 1)[1]):
            table.setdefault(base, set()).add(model)
    return {base: models.pop() for base, models in table.items() if len(models) == 1}


def resolve(hf_id: str, known_ids: dict[str, str]) -> tuple[str, str | None] | None:
    """(bundled model, stored weight format; None: the model's own) of a checkpoint's id, or None."""
    split = split_format(hf_id)
    if split is None:
        return None
    repo, fmt = split
    table = base_names(known_ids)
    return next(((table[b], fmt) for b in _bases(repo) if b in table), None)
