"""The frontier: throughput per GPU against p99 TPOT and p99 TTFT, Pareto front highlighted."""

from __future__ import annotations

import numpy as np

from jaxplan.plots.annotate import label_column
from jaxplan.plots.labels import gpu_label, layout_label
from jaxplan.plots.style import OKABE_ITO, colour_of, figure, log_axis, styled

LABELLED = 5  # finalists labelled with their layout (the rest are numbered in the table)


def pareto_mask(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Points not dominated by another with x <= and y >= (lower latency, more throughput)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    order = np.lexsort((-y, x))  # by x, ties: higher y first
    best = np.maximum.accumulate(y[order])
    keep = np.zeros(len(x), bool)
    if len(x):
        keep[order] = np.concatenate([[True], y[order][1:] > best[:-1]])
    return keep


def frontier_figure(frontier: list[dict], finalists: list[dict], *, title: str | None = None, labelled: int = LABELLED):
    """Stage-4 estimates of the frontier rows (filled) and the finalists (open, best first);
    the 2-D Pareto front over all of them is the black step line."""
    gpus = sorted({r["gpu"] for r in frontier + finalists})
    with styled():
        fig, axes = figure(1, 2, sharey=True)
        for ax, key, name in ((axes[0][0], "tpot_p99_s", "p99 TPOT"), (axes[0][1], "ttft_p99_s", "p99 TTFT")):
            _panel(ax, frontier, finalists, gpus, key, name, labelled)
        axes[0][0].set_ylabel("output throughput per GPU (tokens/s)")
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncols=min(len(names), 3), frameon=False)
        fig.suptitle(title or "Throughput per GPU against latency (stage-4 estimates): the frontier and the finalists")
    return fig


def _panel(ax, frontier, finalists, gpus, key, name, labelled) -> None:
    points = frontier + finalists
    x = np.array([r[key] for r in points], float) * 1e3
    y = np.array([r["output_tokens_per_s_per_gpu"] for r in points], float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0)
    front = pareto_mask(x[ok], y[ok])
    fx, fy = x[ok][front], y[ok][front]
    order = np.argsort(fx)
    ax.step(fx[order], fy[order], where="post", color=OKABE_ITO["black"], lw=2, zorder=2, label="Pareto front (this panel)")
    for g, gpu in enumerate(gpus):
        mine = [i for i, r in enumerate(frontier) if r["gpu"] == gpu]
        ax.scatter(x[mine], y[mine], s=60, color=colour_of(g), zorder=3, label=f"{gpu_label(gpu)} frontier (stage 5)")
        mine = [len(frontier) + i for i, r in enumerate(finalists) if r["gpu"] == gpu]
        ax.scatter(x[mine], y[mine], s=110, facecolors="none", edgecolors=colour_of(g), linewidths=2, zorder=4, label=f"{gpu_label(gpu)} finalist (stage 6)")
    labels = [(x[len(frontier) + i], y[len(frontier) + i], f"#{i + 1} {layout_label(r)}") for i, r in enumerate(finalists[:labelled]) if ok[len(frontier) + i]]
    ax.set_xscale("log")
    ax.set_xlabel(f"{name} (ms, log scale)")
    ax.set_title(f"Throughput per GPU vs {name}")
    if len(y[ok]):
        ax.set_ylim(0, y[ok].max() * 1.15)
        lo, hi = x[ok].min(), x[ok].max()
        ax.set_xlim(lo / 1.3, hi * 1.3)
    log_axis(ax, "x")
    label_column(ax, labels)  # the upper left stays empty: no config is both fastest and best per GPU
