"""``lr_find.png``: the LR range test's loss against the learning rate, with the rate it picked.

Drawn like ``curves.png`` (matplotlib's object interface on an Agg canvas, never ``pyplot``), so
a range test inside a notebook neither switches the notebook's backend nor opens a window.
"""
from __future__ import annotations

from pathlib import Path

from .curves import save_png

__all__ = ["LR_FIND_PLOT", "write_lr_find_plot"]

LR_FIND_PLOT = "lr_find.png"


def write_lr_find_plot(out: str | Path, finding) -> Path:
    """``OUT/lr_find.png`` of a :class:`kaggle_utils.run.LrFinding`: raw and smoothed loss, the minimum, the pick."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    ax.plot(finding.lrs, finding.losses, color="C0", alpha=0.3, linewidth=1, label="loss")
    ax.plot(finding.lrs, finding.smoothed, color="C0", label="smoothed loss")
    if finding.min_loss_lr is not None:
        ax.axvline(finding.min_loss_lr, color="grey", linestyle=":", label=f"lowest loss at {finding.min_loss_lr:.2g}")
    ax.axvline(finding.lr, color="C3", linestyle="--", label=f"picked {finding.lr:.2g} ({finding.rule})")
    smoothed = [v for v in finding.smoothed if v == v]
    if smoothed:  # the fall is the part to read: the explosion above 1.5 x the first loss is cut off
        low, start = min(smoothed + [v for v in finding.losses if v == v]), smoothed[0]
        ax.set_ylim(low - 0.1 * (start - low) - 1e-3, max(1.5 * start, low + 1e-3))
    ax.set_xscale("log")
    ax.set_xlabel("learning rate per 256 images")
    ax.set_ylabel("training loss")
    ax.set_title(f"LR range test: {len(finding.lrs)} steps, {finding.stop}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_png(figure, Path(out) / LR_FIND_PLOT)
