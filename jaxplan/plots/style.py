"""One look for every figure: Okabe-Ito colours, slide-sized fonts, a fixed pixel size.

Figures are created with `figure()` on an Agg canvas (constrained layout) inside
`styled()`, a temporary rc_context with the settings below; pyplot is never used,
so nothing opens a window and no figure outlives its caller.
"""

from __future__ import annotations

import contextlib

# Okabe & Ito (2008), "Color Universal Design": distinguishable with every common colour-vision deficiency.
OKABE_ITO = {
    "blue": "#0072B2",
    "orange": "#E69F00",
    "green": "#009E73",
    "vermillion": "#D55E00",
    "sky": "#56B4E9",
    "purple": "#CC79A7",
    "yellow": "#F0E442",
    "black": "#000000",
}
# Order for categorical series (yellow last: weak on white).
PALETTE = tuple(OKABE_ITO[k] for k in ("blue", "orange", "green", "vermillion", "purple", "sky", "black", "yellow"))
GREY = "#999999"

DPI = 100
SIZE_IN = (12.0, 6.75)  # 16:9 at 1200 x 675 px: a full slide
PIXELS = (int(SIZE_IN[0] * DPI), int(SIZE_IN[1] * DPI))
MIN_FONT_PT = 11

RC = {
    "font.size": 13,
    "axes.titlesize": 14,
    "axes.labelsize": 13,
    "xtick.labelsize": 12,
    "ytick.labelsize": 12,
    "legend.fontsize": 11,
    "legend.title_fontsize": 12,
    "figure.titlesize": 16,
    "figure.titleweight": "bold",
    "axes.prop_cycle": None,  # filled in by rc()
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "svg.fonttype": "none",  # text stays text in SVG (searchable, small)
    "svg.hashsalt": "jaxplan",  # deterministic SVG ids
}


def rc() -> dict:
    from cycler import cycler

    return {**RC, "axes.prop_cycle": cycler(color=PALETTE)}


@contextlib.contextmanager
def styled():
    """Apply the style to figures created inside the block."""
    import matplotlib

    with matplotlib.rc_context(rc()):
        yield


def figure(nrows: int = 1, ncols: int = 1, *, size_in: tuple[float, float] = SIZE_IN, **subplot_kw):
    """(Figure, axes) on an Agg canvas with constrained layout; call inside `styled()`."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size_in, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **subplot_kw)
    return fig, axes


def colour_of(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


MIN_TICK_GAP_PX = 60  # between neighbouring tick labels on a log axis


def log_axis(ax, which: str = "x") -> None:
    """Log scale with plain-number ticks (20, 50, 100 ms rather than 10^k), the densest of 1-2-5,
    1-3 or 1 per decade whose labels stay MIN_TICK_GAP_PX apart. Call after setting the limits."""
    import math

    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    lo, hi = sorted(ax.get_xlim() if which == "x" else ax.get_ylim())
    axis.set_minor_locator(LogLocator(base=10, subs="auto"))
    axis.set_minor_formatter(NullFormatter())
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    if not (lo > 0 and hi > lo):
        return
    fig, box = ax.figure, ax.get_position()
    length_px = (box.width * fig.get_figwidth() if which == "x" else box.height * fig.get_figheight()) * fig.dpi
    px_per_decade = length_px / math.log10(hi / lo)
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    options = [[m * 10.0**k for k in decades for m in subs] for subs in ((1, 2, 5), (1, 3), (1,))]
    every = max(1, math.ceil(MIN_TICK_GAP_PX / px_per_decade))  # last resort: every n-th decade
    options.append([10.0**k for k in decades if k % every == 0])
    options = [[t for t in ticks if lo <= t <= hi] for ticks in options]
    spaced = lambda ticks: all(math.log10(b / a) * px_per_decade >= MIN_TICK_GAP_PX for a, b in zip(ticks, ticks[1:]))  # noqa: E731
    chosen = next((t for t in options if len(t) >= 2 and spaced(t)), None) or next((t for t in options if t and spaced(t)), [])
    axis.set_major_locator(FixedLocator(chosen))
