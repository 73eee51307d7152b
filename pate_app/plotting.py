"""One figure factory and one style for every plot of the application (experiments, planning figures).

Plots use matplotlib's object API on an Agg canvas: no pyplot, so no global backend switch and no GUI, and
matplotlib is imported only when a plot is drawn (the ``plots`` extra).  The style is applied per figure
(:func:`styled`, a ``matplotlib.rc_context``), never to the caller's global ``rcParams``:

* fonts readable at the width a paper prints a figure (11 pt text, 9-10 pt ticks and legends, at 150 dpi);
* one colour per *series*, the same in every panel and every figure (:data:`COLORS`): a token is green,
  a fail grey, a target hit red, Hot PATE orange, Cold PATE blue, the paper's formula black;
* legends outside the data (:func:`legend_outside`), log axes where the data span decades (the callers),
  titles in words (no LaTeX labels), and :func:`quiet_minor_ticks` so log-axis labels do not collide (and
  an axis spanning less than a decade is labelled at its data points).
"""

from __future__ import annotations

import functools

__all__ = ["COLORS", "STYLE", "legend_outside", "new_figure", "quiet_minor_ticks", "styled"]

#: The rc parameters of every figure.
STYLE = {
    "font.size": 11,
    "axes.titlesize": 11.5,
    "axes.labelsize": 11,
    "xtick.labelsize": 9.5,
    "ytick.labelsize": 9.5,
    "legend.fontsize": 9,
    "figure.titlesize": 12,
    "lines.linewidth": 1.7,
    "lines.markersize": 4.5,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "legend.framealpha": 0.9,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
}

#: One colour per series, kept across panels and figures.
COLORS = {
    "token": "tab:green",
    "fail": "tab:gray",
    "target": "tab:red",
    "below": "tab:olive",
    "fallback": "tab:brown",
    "hot": "tab:orange",
    "cold": "tab:blue",
    "paper": "black",
    "queries": "tab:purple",
    "yields": "tab:green",
    "plain": "tab:gray",
    "optimal": "tab:red",
    "drv": "tab:blue",
    "threshold": "dimgray",
}


def styled(plot):
    """Decorator: draw ``plot`` (and save its files) under :data:`STYLE`."""

    @functools.wraps(plot)
    def wrapper(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context(STYLE):
            return plot(*args, **kwargs)

    return wrapper


def new_figure(figsize=(6.4, 4.4)):
    """A ``matplotlib.figure.Figure`` of ``figsize`` inches with constrained layout, attached to an Agg canvas
    (so ``fig.savefig`` works)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def legend_outside(ax, *, where: str = "right", ncol: int = 1, **kwargs):
    """The legend of ``ax`` beside it (``where="right"``) or under it (``"below"``), never on the data."""
    if where == "right":
        return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, ncol=ncol, **kwargs)
    return ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), borderaxespad=0.0, ncol=ncol, **kwargs)


def quiet_minor_ticks(ax, axis: str = "x", at=None) -> None:
    """No labels on the minor ticks of a log axis (they collide when the axis spans less than a decade); with
    ``at``, labelled ticks at those values instead (an axis spanning less than a decade has no major tick)."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_minor_formatter(NullFormatter())
    if at is not None:
        values = sorted({float(v) for v in at})
        target.set_major_locator(FixedLocator(values))
        target.set_major_formatter(lambda value, _position: f"{value:,.0f}" if value >= 100 else f"{value:g}")
        target.set_minor_locator(FixedLocator([]))

