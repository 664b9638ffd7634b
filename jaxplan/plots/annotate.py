"""Point labels that never overlap: a column of labels in an empty corner, with leader lines."""

from __future__ import annotations


def label_column(ax, points: list[tuple[float, float, str]], *, x_frac: float = 0.03, top_frac: float = 0.96, step_frac: float = 0.065, fontsize: float = 11, **text_kw) -> list:
    """Annotate (x, y, text) data points from a column of labels at axes fraction `x_frac`, stacked
    downward from `top_frac` in the order of the points' heights (highest first), `step_frac` apart.

    Use it where the data leave a corner empty (e.g. the upper left of a throughput-vs-latency plot,
    which the Pareto front keeps free)."""
    order = sorted(range(len(points)), key=lambda i: -points[i][1])
    annotations = [None] * len(points)
    for slot, i in enumerate(order):
        x, y, text = points[i]
        annotations[i] = ax.annotate(
            text, (x, y), xytext=(x_frac, top_frac - slot * step_frac), textcoords="axes fraction",
            fontsize=fontsize, ha="left", va="center",
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.7", "alpha": 0.9},
            arrowprops={"arrowstyle": "-", "color": "0.35", "lw": 0.8, "shrinkA": 0, "shrinkB": 6},
            zorder=6, **text_kw,
        )
    return annotations
