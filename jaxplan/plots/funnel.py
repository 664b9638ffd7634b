"""The funnel: candidates left after each stage (log scale) and where the time went."""

from __future__ import annotations

from jaxplan.plots.labels import gpus_label
from jaxplan.plots.style import GREY, OKABE_ITO, figure, styled


def funnel_figure(result, replay: tuple[int, int, float] | None = None):
    """Two panels from a SweepResult: admitted candidates per stage, and seconds per stage group.

    replay: (finalists, requests each, seconds) of stage 7, if it ran."""
    stages = result.stages
    names = ["grid"] + [f"{s.stage} {s.name}" for s in stages]
    counts = [result.grid.size] + [s.admitted for s in stages]
    if replay:
        names.append("7 replay")
        counts.append(replay[0])
    with styled():
        fig, axes = figure(1, 2, gridspec_kw={"width_ratios": [1.35, 1]})
        left, right = axes[0]
        _admitted(left, names, counts)
        _seconds(right, result, replay)
        fig.suptitle(f"{result.model.name} on {gpus_label(g.name for g in result.grid.gpus)}: the funnel narrows {result.grid.size:,} configurations to {counts[-1]:,}")
    return fig


def _admitted(ax, names, counts) -> None:
    positions = range(len(names))
    bars = ax.bar(positions, [max(c, 0.8) for c in counts], color=[GREY] + [OKABE_ITO["blue"]] * (len(names) - 1), width=0.7)
    ax.set_yscale("log")
    ax.set_ylim(0.5, max(counts) * 8)
    for bar, count in zip(bars, counts):
        ax.annotate(_short(count), (bar.get_x() + bar.get_width() / 2, max(count, 0.8)), xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=11)
    ax.set_xticks(list(positions), names, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_ylabel("candidates admitted (count, log scale)")
    ax.set_xlabel("stage (5 and 6 each choose from stage 4's survivors)")
    ax.set_title("Candidates left after each stage")
    ax.grid(axis="x", visible=False)


def _seconds(ax, result, replay) -> None:
    by_stage = {s.stage: s for s in result.stages}
    rows = [("compile (first chunk)", result.compile_s, "one-time XLA compile", GREY)]
    rows.append(("1-4 sieves (fused)", by_stage[1].seconds or result.run_s, f"{result.grid.size:,} evaluated, {result.grid.size / max(result.run_s, 1e-9):,.0f}/s", OKABE_ITO["blue"]))
    for stage in (5, 6):
        before = by_stage[stage - 1].admitted if stage == 5 else by_stage[4].admitted
        rows.append((f"{stage} {by_stage[stage].name}", by_stage[stage].seconds or 0.0, f"{before:,} ranked", OKABE_ITO["blue"]))
    if replay:
        finalists, requests, seconds = replay
        rows.append(("7 replay", seconds, f"{finalists} x {requests:,} requests", OKABE_ITO["orange"]))
    labels = [r[0] for r in rows][::-1]
    values = [r[1] for r in rows][::-1]
    bars = ax.barh(range(len(rows)), values, color=[r[3] for r in rows][::-1], height=0.6)
    top = max(values) if values else 1.0
    for bar, (_, seconds, note, _) in zip(bars, rows[::-1]):
        ax.annotate(f"{seconds:.2f} s  {note}", (bar.get_width(), bar.get_y() + bar.get_height() / 2), xytext=(4, 0), textcoords="offset points", va="center", fontsize=11)
    ax.set_yticks(range(len(rows)), labels)
    ax.set_xlim(0, top * 1.9)  # room for the notes
    ax.set_xlabel("wall time (s)")
    ax.set_title("Work per stage")
    ax.grid(axis="y", visible=False)


def _short(count: int) -> str:
    for unit, size in (("M", 1e6), ("k", 1e3)):
        if count >= 10 * size:
            return f"{count / size:,.1f}{unit}" if count < 100 * size else f"{count / size:,.0f}{unit}"
    return f"{count:,}"

