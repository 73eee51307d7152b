"""One figure factory for every plot in ``ensembles`` (experiments, planning figures).

Plots use matplotlib's object API on an Agg canvas: no pyplot, so no global backend switch and no GUI, and
matplotlib is imported only when a plot is drawn (the ``plots`` extra).
"""

from __future__ import annotations

__all__ = ["new_figure"]


def new_figure(figsize=(6.4, 4.4)):
    """A ``matplotlib.figure.Figure`` of ``figsize`` inches with constrained layout, attached to an Agg canvas
    (so ``fig.savefig`` works)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig
