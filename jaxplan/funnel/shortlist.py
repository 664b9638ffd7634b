"""Stage 6, shortlist: the top K candidates, at most one per (GPU, TP, PP, DP) layout."""

from __future__ import annotations

import numpy as np


def top_layouts(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best finite scores, best first, compared as the tables compare them
    (`rank_key`); ties to the lower index (stable)."""
    from jaxplan.funnel.tables import rank_key

    finite = np.flatnonzero(np.isfinite(scores))
    order = np.argsort(-rank_key(np.asarray(scores, np.float32)[finite]), kind="stable")
    return finite[order[:k]]


def shortlist(grid, ctx, scores: np.ndarray, digits: np.ndarray, k: int) -> list[dict]:
    """Rows of the k best layouts, priced by the report rows' program and checked against the chunk
    kernel's `scores` (`sweep.checked_rows`)."""
    from jaxplan.funnel.sweep import checked_rows

    chosen = top_layouts(scores, k)
    return checked_rows(grid, ctx, digits[chosen], np.asarray(scores)[chosen])
