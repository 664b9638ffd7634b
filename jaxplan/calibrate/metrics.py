"""Accuracy metrics for predicted vs measured values, and deterministic train/test splits.

All metrics take two array-likes of the same shape [N] (predicted, measured),
any positive unit as long as both use the same one, and return a float.
Relative errors are fractions (0.1 = 10 %), not percent. Bad input (shape
mismatch, empty, NaN/inf, non-positive where a ratio or log is taken) is a
one-line PlanError: a silent NaN would poison a fit report.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from jaxplan.errors import PlanError, bad_value


def _pair(predicted, measured, *, positive_measured: bool = False, positive_both: bool = False) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(predicted, dtype=np.float64)
    m = np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape:
        raise PlanError(f"predicted has shape {p.shape} but measured has {m.shape}; pass arrays of equal length")
    if p.size == 0:
        raise PlanError("no values to compare: predicted and measured are empty")
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(m))):
        raise PlanError(f"{int(np.sum(~np.isfinite(p)) + np.sum(~np.isfinite(m)))} NaN/inf value(s) in predicted/measured; drop those rows first")
    if (positive_measured or positive_both) and np.any(m <= 0):
        raise PlanError(f"measured holds {int(np.sum(m <= 0))} value(s) <= 0; relative and log errors need positive measurements")
    if positive_both and np.any(p <= 0):
        raise PlanError(f"predicted holds {int(np.sum(p <= 0))} value(s) <= 0; log errors need positive predictions")
    return p.ravel(), m.ravel()


def absolute_percentage_errors(predicted, measured) -> np.ndarray:
    """|predicted - measured| / measured, as fractions, shape [N]."""
    p, m = _pair(predicted, measured, positive_measured=True)
    return np.abs(p - m) / m


def mape(predicted, measured) -> float:
    """Mean absolute percentage error, as a fraction: mean(|p - m| / m)."""
    return float(np.mean(absolute_percentage_errors(predicted, measured)))


def median_ape(predicted, measured) -> float:
    """Median absolute percentage error, as a fraction."""
    return float(np.median(absolute_percentage_errors(predicted, measured)))


def log_rmse(predicted, measured) -> float:
    """Root mean square of ln(predicted / measured); symmetric in over/under-prediction.

    exp(log_rmse) - 1 is a typical multiplicative error (0.1 -> ~10.5 %).
    """
    p, m = _pair(predicted, measured, positive_both=True)
    return float(np.sqrt(np.mean(np.square(np.log(p) - np.log(m)))))


def rank_with_ties(values) -> np.ndarray:
    """1-based ranks, ties get the mean of the ranks they span (scipy.stats.rankdata 'average')."""
    x = np.asarray(values, dtype=np.float64).ravel()
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    # Start index of each run of equal values in sorted order.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], x.size]
    run_rank = (starts + ends + 1) / 2.0  # mean of 1-based ranks start+1 .. end
    ranks = np.empty(x.size, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(predicted, measured) -> float:
    """Spearman rank correlation (Pearson correlation of tie-averaged ranks), in [-1, 1].

    NaN when either input is constant (rank correlation undefined); needs N >= 2.
    """
    p, m = _pair(predicted, measured)
    if p.size < 2:
        raise PlanError("spearman needs at least 2 pairs")
    rp, rm = rank_with_ties(p), rank_with_ties(m)
    rp -= rp.mean()
    rm -= rm.mean()
    denom = math.sqrt(float(np.dot(rp, rp)) * float(np.dot(rm, rm)))
    if denom == 0.0:
        return math.nan
    return float(np.dot(rp, rm) / denom)


def summary(predicted, measured) -> dict[str, float]:
    """All metrics at once: n, mape, median_ape, log_rmse, spearman."""
    p, m = _pair(predicted, measured, positive_both=True)
    return {"n": float(p.size), "mape": mape(p, m), "median_ape": median_ape(p, m), "log_rmse": log_rmse(p, m), "spearman": spearman(p, m) if p.size > 1 else math.nan}


# --- splits -------------------------------------------------------------------------------------


def split_by(rows: Sequence[dict], key: str, held_out_values: Iterable[Hashable]) -> tuple[list[dict], list[dict]]:
    """(train, test): test = rows whose row[key] is in held_out_values (e.g. key='gpu', ['b200_sxm']).

    Order is kept. A held-out value that no row has is an error (likely a typo).
    """
    held = {held_out_values} if isinstance(held_out_values, str) else set(held_out_values)
    if not held:
        raise bad_value("held_out_values", [], "name at least one value to hold out")
    if rows and any(key not in row for row in rows):
        raise bad_value("key", key, f"is not a column of every row; columns: {', '.join(sorted(rows[0]))}")
    present = {row[key] for row in rows}
    absent = sorted(map(str, held - present))
    if absent:
        raise bad_value("held_out_values", absent, f"no row has that {key}; values present: {', '.join(sorted(map(str, present)))}")
    test = [row for row in rows if row[key] in held]
    train = [row for row in rows if row[key] not in held]
    return train, test


def random_split(rows: Sequence[dict], test_fraction: float = 0.2, *, seed: int = 0, group_key: str | None = None) -> tuple[list[dict], list[dict]]:
    """(train, test) by a seeded random permutation; same seed -> same split.

    group_key keeps all rows sharing that column's value on one side (e.g.
    'source_id' prefixes or a (model, gpu) label you added), so near-duplicate
    rows cannot leak across the split. Order within each side is kept.
    """
    if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0.0 < test_fraction < 1.0:
        raise bad_value("test_fraction", test_fraction, "must be a fraction strictly between 0 and 1")
    if len(rows) < 2:
        raise PlanError(f"random_split needs at least 2 rows, got {len(rows)}")
    rng = np.random.default_rng(seed)
    if group_key is None:
        n_test = min(len(rows) - 1, max(1, round(test_fraction * len(rows))))
        test_index = set(rng.permutation(len(rows))[:n_test].tolist())
        in_test = [i in test_index for i in range(len(rows))]
    else:
        if any(group_key not in row for row in rows):
            raise bad_value("group_key", group_key, "is not a column of every row")
        groups = sorted({row[group_key] for row in rows}, key=repr)
        if len(groups) < 2:
            raise PlanError(f"random_split by {group_key!r} needs at least 2 distinct values, got {len(groups)}")
        n_test = min(len(groups) - 1, max(1, round(test_fraction * len(groups))))
        test_groups = {groups[i] for i in rng.permutation(len(groups))[:n_test].tolist()}
        in_test = [row[group_key] in test_groups for row in rows]
    train = [row for row, t in zip(rows, in_test) if not t]
    test = [row for row, t in zip(rows, in_test) if t]
    return train, test
