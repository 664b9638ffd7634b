"""The replay over time for one finalist: running requests, KV-cache use, queue and output tokens/s."""

from __future__ import annotations

import numpy as np

from jaxplan.plots.style import OKABE_ITO, figure, styled


def timeline_figure(tl, index: int, label: str, *, max_running: float | None = None, offered_tokens_per_s: float | None = None, title: str | None = None):
    """Four panels from finalist `index` of a `jaxplan.replay.timeline.Timeline`.

    max_running: the deployment's request slots (max_num_seqs x replicas), drawn as a limit;
    offered_tokens_per_s: the traffic's mean output tokens/s, drawn as a reference."""
    from matplotlib.ticker import MaxNLocator

    t = tl.time_s[index]
    with styled():
        fig, axes = figure(2, 2, sharex=True)
        panels = (
            (axes[0][0], tl.running[index], "requests running (count)", "Requests running (the batch)", OKABE_ITO["blue"]),
            (axes[0][1], 100 * tl.kv_utilization[index], "KV cache in use (% of blocks)", "KV-cache use", OKABE_ITO["green"]),
            (axes[1][0], tl.queue_length[index], "requests waiting (count)", "Queue: arrived, not yet admitted", OKABE_ITO["vermillion"]),
            (axes[1][1], tl.output_tokens_per_s[index], "output tokens/s (all replicas)", "Output throughput", OKABE_ITO["orange"]),
        )
        for ax, values, ylabel, name, colour in panels:
            ax.plot(t, values, color=colour, lw=2)
            ax.fill_between(t, values, color=colour, alpha=0.15, lw=0)
            ax.set_ylabel(ylabel)
            ax.set_title(name)
            top = float(np.nanmax(values)) if len(values) and np.isfinite(values).any() else 0.0
            ax.set_ylim(0, max(top * 1.15, 1.0))
        kv_ax, batch_ax, out_ax = axes[0][1], axes[0][0], axes[1][1]
        for ax in (batch_ax, axes[1][0]):  # counts of requests: whole-number ticks
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        _limit(kv_ax, 100.0, "KV-cache use (dashed: capacity)")
        if max_running and max_running <= 3 * max(float(np.nanmax(tl.running[index])), 1.0):
            _limit(batch_ax, max_running, f"Requests running (dashed: {max_running:,.0f} slots = max_num_seqs x DP)")
        elif max_running:  # a line far above the data would squash it
            batch_ax.set_title(f"Requests running (of {max_running:,.0f} slots = max_num_seqs x DP)")
        if offered_tokens_per_s:
            _limit(out_ax, offered_tokens_per_s, f"Output throughput (dashed: offered {offered_tokens_per_s:,.0f})")
        for ax in axes[1]:
            ax.set_xlabel("time since the first arrival (s)")
            ax.set_xlim(0, float(tl.duration_s[index]) or 1.0)
        fig.suptitle(title or f"Replay of {label} over time ({float(tl.duration_s[index]):,.0f} s)")
    return fig


def _limit(ax, value: float, title: str) -> None:
    """A dashed reference line, explained in the panel's title (nothing drawn over the data)."""
    ax.axhline(value, color=OKABE_ITO["black"], ls="--", lw=1.5)
    ax.set_ylim(0, max(ax.get_ylim()[1], value * 1.15))
    ax.set_title(title)
