"""Stage 5, frontier: the Pareto front over throughput per GPU (up), p99 TPOT (down), GPU count (down).

The streaming table keeps the best throughput/GPU per (GPU-count bin, TPOT bin);
the exact front is taken here over those few thousand entries.
"""

from __future__ import annotations

import numpy as np


def non_dominated(throughput_per_gpu: np.ndarray, tpot_s: np.ndarray, num_gpus: np.ndarray) -> np.ndarray:
    """[N] bool: no other point is at least as good on all three and better on one."""
    better_eq = (
        (throughput_per_gpu[None, :] >= throughput_per_gpu[:, None])
        & (tpot_s[None, :] <= tpot_s[:, None])
        & (num_gpus[None, :] <= num_gpus[:, None])
    )
    strictly = (
        (throughput_per_gpu[None, :] > throughput_per_gpu[:, None])
        | (tpot_s[None, :] < tpot_s[:, None])
        | (num_gpus[None, :] < num_gpus[:, None])
    )
    return ~np.any(better_eq & strictly, axis=1)


def pareto_front(grid, ctx, scores: np.ndarray, digits: np.ndarray) -> list[dict]:
    """Rows of the Pareto-optimal candidates, by ascending GPU count then TPOT (priced by the report
    rows' program and checked against the table's throughput per GPU, `sweep.checked_rows`)."""
    from jaxplan.funnel.sweep import checked_rows

    filled = np.isfinite(scores)
    rows = checked_rows(grid, ctx, digits[filled], np.asarray(scores)[filled], key="output_tokens_per_s_per_gpu", what="frontier")
    if not rows:
        return []
    keep = non_dominated(
        np.array([r["output_tokens_per_s_per_gpu"] for r in rows]),
        np.array([r["tpot_p99_s"] for r in rows]),
        np.array([r["num_gpus"] for r in rows]),
    )
    front = [r for r, k in zip(rows, keep) if k]
    return sorted(front, key=lambda r: (r["num_gpus"], r["tpot_p99_s"]))
