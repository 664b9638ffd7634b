"""Does vLLM's release change what a deployment measures? The same configuration under two releases.

NVIDIA's silicon rows name the vLLM release of each run (`backend_version`). Where one configuration
(model, GPU, quantisation, TP, attention DP, MoE TP and EP, ISL, OSL, concurrency) was measured under
two releases, the ratio of the later release's TTFT and TPOT to the earlier one's is a measurement
of the release alone: no model of jaxplan's is involved. `docs/vllm_versions.md` reports them.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from jaxplan.calibrate._data import resolve_root, version_key
from jaxplan.calibrate.serving import SILICON_CSV as SILICON_CSV
from jaxplan.calibrate.serving import silicon_source
CONFIGURATION = ("model_path", "system", "gemm_quant_mode", "tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size", "isl", "osl", "batch_size")


class ReleasePair(NamedTuple):
    model: str
    gpu: str
    earlier: str
    later: str
    configurations: int
    ttft_ratio_median: float  # later / earlier
    ttft_ratio_low: float
    ttft_ratio_high: float
    tpot_ratio_median: float
    tpot_ratio_low: float
    tpot_ratio_high: float


def release_pairs(data_root: str | Path | None = None) -> list[ReleasePair]:
    """Every (model, GPU, earlier release, later release) with configurations measured under both
    (vLLM, aggregated serving; rows without a release are left out), sorted."""
    runs: dict[tuple, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for row in silicon_source(resolve_root(data_root)):
        if row["backend"] != "vllm" or row["mode"] != "agg" or not row["backend_version"]:
            continue
        key = tuple(row[c] for c in CONFIGURATION)
        runs[key][row["backend_version"]].append((float(row["silicon_ttft_ms"]), float(row["silicon_tpot_ms"])))
    # A configuration measured more than once under one release counts as the mean of its runs.
    measured = {key: {release: tuple(map(statistics.fmean, zip(*values))) for release, values in by.items()} for key, by in runs.items()}
    ratios: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for key, by_release in measured.items():
        releases = sorted(by_release, key=version_key)
        for i, earlier in enumerate(releases):
            for later in releases[i + 1 :]:
                (ttft0, tpot0), (ttft1, tpot1) = by_release[earlier], by_release[later]
                ratios[(key[0].split("/")[-1], key[1], earlier, later)].append((ttft1 / ttft0, tpot1 / tpot0))
    out = []
    for (model, gpu, earlier, later), values in sorted(ratios.items()):
        ttft, tpot = [v[0] for v in values], [v[1] for v in values]
        out.append(ReleasePair(model, gpu, earlier, later, len(values), statistics.median(ttft), min(ttft), max(ttft), statistics.median(tpot), min(tpot), max(tpot)))
    return out
