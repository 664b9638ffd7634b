"""What the vLLM release changes in a deployment, where the measurements or vLLM's source show it
(docs/vllm_versions.md): the engine that serves pipeline parallelism, and the default memory fraction.

- Pipeline parallelism ran on the V0 engine before vLLM 0.9.1: the V1 engine's check admitted `-pp N`
  only with `--distributed-executor-backend ray` given explicitly, and fell back to V0 otherwise
  (vllm#18915, merged 2025-05-30, fixed it). V0 turns asynchronous output processing off under PP, so
  each step's per-sequence output processing runs between steps (`pipeline_seq_overhead_s`). Its
  cost is fitted on the only such runs measured, vLLM 0.8.3 on A100 (`V0_PIPELINE_GPU`); a release
  that serves PP on V1 keeps the V1 value (`params.DEFAULTS`) on every GPU, the A100 included.
- `--gpu-memory-utilization` defaults to 0.92 from vLLM 0.22 (vllm/config/cache.py), 0.9 before.

The release a prediction assumes: a row's `vllm_version` column, else `--vllm-version` /
$JAXPLAN_VLLM_VERSION, else NEWEST_MEASURED.
"""

from __future__ import annotations

import os
import re

from jaxplan.errors import PlanError, bad_value

RELEASE_ENV = "JAXPLAN_VLLM_VERSION"
NEWEST_MEASURED = "0.19.0"  # the newest release a measured row in ../shared states
PIPELINE_ON_V1 = (0, 9, 1)
GPU_MEMORY_UTILIZATION_092 = (0, 22, 0)
V0_PIPELINE_GPU = "a100_sxm"
PIPELINE_FIELD = "pipeline_seq_overhead_s"
_RELEASE = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[.+-]?(?:rc|post|dev)\w*)*")


def parse_release(text, field: str = "vllm_version", where: str | None = None) -> tuple[int, int, int]:
    """(major, minor, patch) of a vLLM release such as 0.8.3, v0.10.1 or 0.11.0rc2 (a pre- or
    post-release counts as its release); anything else is a PlanError naming the field."""
    match = _RELEASE.fullmatch(str(text).strip())
    if match is None:
        raise bad_value(field, text, "must be a vLLM release such as 0.8.3 or 0.19.0", where=where)
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def selected(release: str | None = None) -> tuple[int, int, int]:
    """The release given, else $JAXPLAN_VLLM_VERSION when set, else NEWEST_MEASURED."""
    if release:
        return parse_release(release, "--vllm-version")
    value = os.environ.get(RELEASE_ENV, "").strip()
    if value:
        try:
            return parse_release(value, f"${RELEASE_ENV}")
        except PlanError as error:
            raise PlanError(f"{error}; or unset {RELEASE_ENV}") from None
    return parse_release(NEWEST_MEASURED)


def pipeline_on_v0(release: tuple[int, int, int]) -> bool:
    """Whether `vllm serve -pp N` of this release runs the V0 engine."""
    return release < PIPELINE_ON_V1


def default_gpu_memory_utilization(release: tuple[int, int, int]) -> float:
    """vLLM's `--gpu-memory-utilization` when a command leaves it out."""
    return 0.92 if release >= GPU_MEMORY_UTILIZATION_092 else 0.9


def v1_pipeline_seq_overhead_s() -> float:
    """Host seconds per running sequence per step under PP on the V1 engine, which overlaps output
    processing with the next step: the parameters' default."""
    # Imported here: jaxplan.physics imports JAX, and `import jaxplan` (whose API reaches this module) must not.
    from jaxplan.physics.params import DEFAULTS

    return DEFAULTS[PIPELINE_FIELD]


def pipeline_seq_overhead_s(efficiency: dict[str, dict[str, float]], gpu: str, release: tuple[int, int, int]) -> float:
    """Host seconds per running sequence per step under PP on `gpu` for `release`: V1's (the default)
    where V1 serves PP; under V0 the larger of `gpu`'s own value and the V0 pipeline fit's
    (`V0_PIPELINE_GPU` in `efficiency`), since only a fit on V0 pipeline rows raises it above V1's."""
    v1 = v1_pipeline_seq_overhead_s()
    if not pipeline_on_v0(release):
        return v1
    own = efficiency.get(gpu, {}).get(PIPELINE_FIELD, v1)
    return max(own, efficiency.get(V0_PIPELINE_GPU, {}).get(PIPELINE_FIELD, own))


def for_release(efficiency: dict[str, dict[str, float]], release: tuple[int, int, int], every: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, float]]:
    """`efficiency` (GPU name -> fields) with each GPU's pipeline host cost for `release`; `every` holds
    the V0 pipeline fit's GPU where `efficiency` lacks it."""
    lookup = {**(every or {}), **efficiency}
    return {g: {**fields, PIPELINE_FIELD: pipeline_seq_overhead_s(lookup, g, release)} for g, fields in efficiency.items()}
