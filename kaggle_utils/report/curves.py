"""The pictures: ``curves.png`` (loss, scores, learning rate by step, from ``metrics.json``), ``lr_find.png`` and a
``tune`` study's ``importance.png``.

matplotlib's Agg canvas, never ``pyplot`` (a notebook's backend stays); imported when a picture is drawn,
so a kit without it still trains.
"""
import io
import math
from pathlib import Path

from .. import checkpoint

CURVES_FILE, LR_FIND_PLOT, IMPORTANCE_FILE = "curves.png", "lr_find.png", "importance.png"


def new_figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # drawing only; no pyplot: see the docstring
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height))
    FigureCanvasAgg(figure)
    return figure


def write_curves(out: str | Path, report: dict, *, title: str | None = None) -> Path:
    """``OUT/curves.png`` from a ``metrics.json`` record (its history rows and best row)."""
    history = report.get("history") or []
    steps = [row["step"] for row in history]
    style = "o-" if len(history) < 30 else "-"
    figure = new_figure(15, 4.2)
    columns = list(history[0]) if history else []
    scores = [c for c in columns if c == "train_acc" or (c.startswith("val_") and "loss" not in c and c != "val_count")]
    panels = (("loss", [c for c in ("train_loss", "val_loss") if c in columns]), ("accuracy / F1", scores),
              ("learning rate", [c for c in ("lr",) if c in columns]))
    best = report.get("best")
    for ax, (name, plotted) in zip(figure.subplots(1, 3), panels):
        for column in plotted:  # JSON's null (a non-finite value) back as NaN: the line shows a gap
            values = [math.nan if row.get(column) is None else float(row[column]) for row in history]
            ax.plot(steps, values, style, label=column, markersize=3)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if best:
            ax.axvline(best["step"], color="grey", linestyle="--", linewidth=1)
        if plotted:
            ax.legend(fontsize=8)
    monitor = report.get("monitor")
    if best and monitor and best.get(monitor) is not None:
        title = f"{title + ': ' if title else ''}best {monitor} {best[monitor]:.4g} at step {best['step']} (dashed)"
    if title:
        figure.suptitle(title)
    return save_png(figure, Path(out) / CURVES_FILE)


def save_png(figure, path: Path) -> Path:
    """A drawn figure to ``path``, atomically: a run killed mid-write leaves the previous picture, not half of one."""
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    checkpoint.atomic_write_bytes(path, buffer.getvalue())
    return path


def write_lr_find_plot(out: str | Path, finding) -> Path:
    """``OUT/lr_find.png`` of a :class:`kaggle_utils.run.LrFinding`: raw and smoothed loss, the minimum, the pick."""
    figure = new_figure(7, 4.2)
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


def write_importance(out: str | Path, importance: dict, monitor: str) -> Path | None:
    """A bar per searched flag: how much of the objective's variance it explains (Optuna's fANOVA); None: no bars."""
    if not importance:
        return None
    figure = new_figure(6, 1 + 0.4 * len(importance))
    axes = figure.add_subplot()
    axes.barh(list(importance)[::-1], list(importance.values())[::-1])
    axes.set_xlabel(f"importance for {monitor} (Optuna's fANOVA)")
    return save_png(figure, Path(out) / IMPORTANCE_FILE)
