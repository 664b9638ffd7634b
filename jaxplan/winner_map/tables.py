"""The winner map in the terminal: rich tables (one per facet) and summary lines."""

from __future__ import annotations

import math

import numpy as np

from jaxplan.winner_map.axes import axis_label
from jaxplan.winner_map.result import WinnerMap, layout_label


def _value(name: str, v: float) -> str:
    if name == "hit":
        return f"{v:.0%}"
    return f"{v:,.0f}" if v >= 100 else f"{v:g}"


def _margin_text(margin: float, label: str) -> str:
    if not label:
        return "none"
    if not math.isfinite(margin):
        return "only"
    return f"+{margin:.1%}" if margin >= 0.01 else f"+{margin:.2%}"


def map_tables(wmap: WinnerMap) -> list:
    """Rich tables: rows = y values, columns = x values, cell = winner label and margin; * = the current
    workload's nearest cell. One table per value of a third (facet) axis."""
    from rich.table import Table

    labels, margins = wmap.labels, wmap.margins
    cz, cy, cx = wmap.current_cell()
    x, y = wmap.axes[0], wmap.axes[1] if len(wmap.axes) > 1 else None
    tables = []
    for iz in range(wmap.shape[0]):
        title = f"Winning layout by {axis_label(x.name)}" + (f" x {axis_label(y.name)}" if y else "")
        if wmap.z_name:
            title += f" at {wmap.z_name} = {_value(wmap.z_name, wmap.z_values[iz])}"
        table = Table(title=title, show_lines=True)
        table.add_column(f"{y.name} \\ {x.name}" if y else x.name, justify="right")
        for v in x.values:
            table.add_column(_value(x.name, v), justify="center")
        for iy in range(wmap.shape[1]):
            cells = []
            for ix in range(wmap.shape[2]):
                text = f"{labels[iz, iy, ix] or '-'}\n{_margin_text(margins[iz, iy, ix], labels[iz, iy, ix])}"
                if (iz, iy, ix) == (cz, cy, cx):
                    text = f"[bold]*{text}[/]"
                cells.append(text)
            table.add_row(_value(y.name, y.values[iy]) if y else "", *cells)
        table.caption = "cell: winning (GPU, TP, PP, DP, layout kind) layout; +x% = its objective over the best other layout's; * = nearest the current workload"
        tables.append(table)
    return tables


def summary_lines(wmap: WinnerMap, max_boundaries: int = 12) -> list[str]:
    """The current workload's winner and margin, and where the winner changes."""
    here = ", ".join(f"{a.name} = {_value(a.name, v)}" for a, v in zip(wmap.axes, wmap.current_values()))
    lines = [
        f"current workload ({here}): {layout_label(wmap.current_winner) or 'nothing passes'}"
        + (f", margin {_margin_text(wmap.current_margin, layout_label(wmap.current_winner))} over {layout_label(wmap.current_runner_up)}" if wmap.current_runner_up else ""),
    ]
    bounds = wmap.boundaries()
    distinct = sorted({b for b in wmap.labels.ravel() if b})
    lines.append(f"{len(distinct)} distinct winner(s) over {int(np.prod(wmap.shape)):,} scenarios; {len(bounds)} boundary crossing(s) between neighbouring cells")
    for b in bounds[:max_boundaries]:
        at = ", ".join(f"{k} = {_value(k, v)}" for k, v in b["at"].items())
        lines.append(
            f"  {b['axis']} {_value(b['axis'], b['from_value'])} -> {_value(b['axis'], b['to_value'])}"
            + (f" at {at}" if at else "") + f": {b['from_winner'] or 'none'} -> {b['to_winner'] or 'none'}"
        )
    if len(bounds) > max_boundaries:
        lines.append(f"  ... {len(bounds) - max_boundaries} more (--json has all)")
    lines.append(f"{wmap.num_candidates:,} candidates x {int(np.prod(wmap.shape)) + 1} scenarios: compile {wmap.compile_s:.1f} s, streamed in {wmap.run_s:.1f} s")
    return lines
