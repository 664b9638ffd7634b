"""Sensitivity figures: a tornado chart of the winner's elasticities, and the winner map."""

from __future__ import annotations

import numpy as np

from jaxplan.plots.style import GREY, OKABE_ITO, colour_of, figure, log_axis, styled

PARAMETER_NAMES = {
    "isl_tokens": "mean ISL (prompt tokens)",
    "osl_tokens": "mean OSL (output tokens)",
    "request_rate_per_s": "arrival rate (requests/s)",
    "prefix_hit_rate": "prefix hit rate (per +10 pt)",
    "concurrency": "concurrency (requests)",
}
METRIC_NAMES = {
    "output_tokens_per_s": "output throughput",
    "ttft_mean_s": "mean TTFT",
    "tpot_mean_s": "mean TPOT",
    "cost_per_million_usd": "cost per M output tokens",
}
CELL_TEXT_MAX = 14  # cells per axis up to which the margin is written in each cell


def tornado_figure(sens, index: int, label: str, *, title: str | None = None):
    """One panel per metric: finalist `index`'s elasticities (a `jaxplan.elasticity.Sensitivity`),
    largest magnitude on top; blue = the metric rises with the parameter, vermillion = it falls."""
    metrics = list(sens.metrics)
    ncols = 2 if len(metrics) > 1 else 1
    nrows = -(-len(metrics) // ncols)
    with styled():
        fig, axes = figure(nrows, ncols)
        for m, metric in enumerate(metrics):
            ax = axes[m // ncols][m % ncols]
            values = np.asarray(sens.elasticity[index, m], float)
            order = np.argsort(np.abs(values))  # barh: last on top
            names = [PARAMETER_NAMES.get(sens.parameters[k], sens.parameters[k]) for k in order]
            shown = values[order]
            colours = [OKABE_ITO["blue"] if v >= 0 else OKABE_ITO["vermillion"] for v in shown]
            bars = ax.barh(range(len(shown)), shown, color=colours, height=0.6)
            reach = max(float(np.max(np.abs(shown))) if len(shown) else 0.0, 0.05)
            ax.set_xlim(-reach * 1.45, reach * 1.45)
            for bar, v in zip(bars, shown):
                ax.annotate(f"{v:+.2f}" if abs(v) >= 0.005 else "0", (v, bar.get_y() + bar.get_height() / 2), xytext=(5 if v >= 0 else -5, 0), textcoords="offset points",
                            ha="left" if v >= 0 else "right", va="center", fontsize=11)
            ax.axvline(0, color=OKABE_ITO["black"], lw=1)
            ax.set_yticks(range(len(shown)), names)
            ax.set_title(f"{METRIC_NAMES.get(metric, metric)} ({_value(metric, sens.values[index, m])})")
            ax.grid(axis="y", visible=False)
        for m in range(len(metrics), nrows * ncols):
            axes[m // ncols][m % ncols].set_visible(False)
        fig.supxlabel("elasticity: % change of the metric per +1% of the parameter", fontsize=13)
        fig.suptitle(title or f"What moves the answer: elasticities of {label} (stage-4 model)")
    return fig


def _value(metric: str, value: float) -> str:
    if metric.endswith("tokens_per_s"):
        return f"now {value:,.0f} tokens/s"
    if metric.startswith("cost"):
        return f"now ${value:,.2f}"
    return f"now {value * 1e3:,.1f} ms"


def winner_map_figure(x_name: str, x_values, y_name: str, y_values, winner_labels, margin, current=None, title: str = "Which configuration wins where"):
    """Heat map of the winning layout per (x, y) workload cell: colour = winner, shade = its margin
    over the runner-up (pale = a close call), the margin written in each cell when the map is small,
    and the current workload marked with a star. Empty labels mean nothing passes there (grey).

    x_values [nx], y_values [ny]: cell centres (log axis when positive and spanning > 10x);
    winner_labels [ny, nx] str; margin [ny, nx]: winner's objective / runner-up's - 1 (nan: no runner-up);
    current: (x, y) of the current workload, or None."""
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Patch, Rectangle

    x, y = np.asarray(x_values, float), np.asarray(y_values, float)
    labels = np.asarray(winner_labels, dtype=object)
    margin = np.asarray(margin, float)
    if labels.shape != (len(y), len(x)) or margin.shape != labels.shape:
        raise ValueError(f"winner_labels and margin must be [ny={len(y)}, nx={len(x)}], got {labels.shape} and {margin.shape}")
    names = sorted({str(v) for v in labels.ravel() if v}, key=lambda n: -int(np.sum(labels == n)))
    colour = {n: to_rgb(colour_of(i)) for i, n in enumerate(names)}
    finite = margin[np.isfinite(margin)]
    top = max(float(np.percentile(finite, 95)) if finite.size else 0.0, 1e-6)
    shade = np.clip(np.where(np.isfinite(margin), margin, top) / top, 0, 1)  # no runner-up: as clear as it gets
    rgb = np.ones(labels.shape + (3,))
    for n, c in colour.items():
        mine = labels == n
        strength = (0.3 + 0.7 * shade[mine])[:, None]
        rgb[mine] = 1 - strength * (1 - np.array(c)[None, :])  # blend with white
    rgb[labels == ""] = 1.0  # white, hatched below
    x_log, y_log = _is_log(x), _is_log(y)
    with styled():
        fig, axes = figure(1, 1)
        ax = axes[0][0]
        ax.pcolormesh(_edges(x, x_log), _edges(y, y_log), rgb, shading="flat")
        if x_log:
            log_axis(ax, "x")
        if y_log:
            log_axis(ax, "y")
        here = None if current is None else (_nearest(x, current[0], x_log), _nearest(y, current[1], y_log))
        if len(x) <= CELL_TEXT_MAX and len(y) <= CELL_TEXT_MAX:
            for j in range(len(y)):
                for i in range(len(x)):
                    # the winner's legend number too: colours repeat past 8 winners and must not be the only cue
                    number = names.index(labels[j, i]) + 1 if labels[j, i] else 0
                    text = "none" if not labels[j, i] else f"{number}: " + ("only" if not np.isfinite(margin[j, i]) else f"+{margin[j, i]:.0%}")
                    lift = 15 if here == (i, j) else 0  # clear of the star
                    ax.annotate(text, (x[i], y[j]), xytext=(0, lift), textcoords="offset points", ha="center", va="center", fontsize=11, color=OKABE_ITO["black"])
        xe, ye = _edges(x, x_log), _edges(y, y_log)
        for j, i in zip(*np.nonzero(labels == "")):
            ax.add_patch(Rectangle((xe[i], ye[j]), xe[i + 1] - xe[i], ye[j + 1] - ye[j], fill=False, hatch="//", ec=GREY, lw=0, zorder=3))
        if current is not None:
            i, j = here
            ax.add_patch(Rectangle((xe[i], ye[j]), xe[i + 1] - xe[i], ye[j + 1] - ye[j], fill=False, ec=OKABE_ITO["black"], lw=3, zorder=4))
            ax.plot([current[0]], [current[1]], marker="*", ms=16, mfc="white", mec=OKABE_ITO["black"], mew=1.5, ls="none", label="current workload", zorder=5)
        ax.grid(False)
        ax.set_xlabel(x_name)
        ax.set_ylabel(y_name)
        handles = [Patch(facecolor=colour[n], edgecolor="0.3", label=f"{k}: {n}") for k, n in enumerate(names, start=1)]
        if (labels == "").any():
            handles.append(Patch(facecolor="white", edgecolor=GREY, hatch="//", label="nothing passes"))
        if current is not None:
            handles += ax.get_legend_handles_labels()[0]
        fig.legend(handles=handles, loc="outside right upper", title="winner (pale = close call)", frameon=False)
        fig.suptitle(title)
    return fig


def _nearest(centres: np.ndarray, value: float, log: bool) -> int:
    if log and value > 0:
        return int(np.argmin(np.abs(np.log(centres) - np.log(value))))
    return int(np.argmin(np.abs(centres - value)))


def _is_log(values: np.ndarray) -> bool:
    return len(values) > 1 and bool(np.all(values > 0)) and values.max() / values.min() > 10


def _edges(centres: np.ndarray, log: bool) -> np.ndarray:
    """Cell edges around sorted centres (midpoints, in log space on a log axis)."""
    v = np.log(centres) if log else centres.astype(float)
    if len(v) == 1:
        half = 0.5 if not log else np.log(2.0)
        edges = np.array([v[0] - half, v[0] + half])
    else:
        mid = (v[:-1] + v[1:]) / 2
        edges = np.concatenate([[v[0] - (mid[0] - v[0])], mid, [v[-1] + (v[-1] - mid[-1])]])
    return np.exp(edges) if log else edges
