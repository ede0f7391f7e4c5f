"""A run folder or a CV folder on disk -> its pictures and tables again (``python -m kaggle_utils report OUT``).

A run folder is one the kit trained into (it has ``metrics.json``); a CV folder holds run
folders ``fold0/``, ``fold1/``, ... Everything is rebuilt from files the run wrote, so a report
needs no model, no data and no accelerator, and can be redrawn after the files are deleted or
for a run made before reporting existed (without ``val_counts.json`` its per-class table
cannot be rebuilt; one line says so).
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Sequence

from .. import checkpoint
from .curves import CURVES_FILE, write_curves
from .tables import COUNTS_FILE, PER_CLASS_FILE, counts_record, read_counts, write_counts, write_per_class_from_counts

__all__ = ["METRICS_FILE", "ReportError", "finish_run", "fold_folders", "read_metrics", "redraw", "report_command"]

METRICS_FILE = "metrics.json"
_FOLD = re.compile(r"^fold(\d+)$")


class ReportError(checkpoint.CheckpointError):
    """A folder that is not a run (or CV) folder of the kit, or a run file that cannot be read; names it.

    A :class:`~kaggle_utils.checkpoint.CheckpointError` (a run's files are not what the kit wrote),
    so the job reports it as it reports any unreadable run: one line, exit code 2.
    """


def read_metrics(out: Path) -> dict:
    path = Path(out) / METRICS_FILE
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{out} is not a run folder of the kit (no {METRICS_FILE})") from None
    except ValueError as err:
        raise ReportError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(report, dict) or not isinstance(report.get("history"), list):
        raise ReportError(f"{path} has no 'history' list: not a metrics file written by the kit")
    return report


def fold_folders(path: Path) -> list[Path]:
    """The ``foldK/`` run folders of a CV folder, in fold order (empty for anything else)."""
    found = [(int(m.group(1)), p) for p in Path(path).iterdir()
             if p.is_dir() and (m := _FOLD.match(p.name)) and (p / METRICS_FILE).is_file()]
    return [p for _, p in sorted(found)]


def redraw(out: Path) -> list[str]:
    """``curves.png`` and ``per_class.csv`` of one run folder again; one line per file or per reason it is not."""
    out = Path(out)
    report = read_metrics(out)
    lines = []
    try:
        lines.append(f"wrote {write_curves(out, report, title=out.name)}")
    except ModuleNotFoundError as err:
        lines.append(f"no {CURVES_FILE}: {err.name} is not installed (pip install matplotlib)")
    try:
        counts = read_counts(out)
    except ValueError as err:
        counts, reason = None, str(err)
    else:
        reason = (f"the run stored no validation counts ({COUNTS_FILE}; a run before reporting, or a task "
                  "with neither a confusion matrix nor per-class counts)")
    if counts is None:
        lines.append(f"no {PER_CLASS_FILE}: {reason}")
    else:
        lines.append(f"wrote {write_per_class_from_counts(out, counts)}")
    return lines


def finish_run(out: str | Path, sums: dict, class_names: Sequence[str], best: dict | None) -> list[str]:
    """The end of a run: the best evaluation's validation ``sums`` stored as ``val_counts.json`` (so a report never
    evaluates again), then ``curves.png`` and ``per_class.csv`` drawn; the lines saying what was written."""
    record = counts_record(sums, class_names, best)
    if record is not None:
        write_counts(Path(out), record)
    return redraw(Path(out))


def _best_line(name: str, report: dict) -> tuple[str, float | None]:
    best, monitor = report.get("best"), report.get("monitor")
    value = best.get(monitor) if best and monitor else None
    if value is None:
        return f"{name}: no best row ({report.get('stop_reason', 'unknown stop')})", None
    return f"{name}: best {monitor} {value:.4f} at epoch {best['epoch']}, step {best['step']}", float(value)


def report_command(path: str | Path) -> list[str]:
    """Redraws a run folder, or each fold of a CV folder; the lines to print. Raises :class:`ReportError`."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path} is not a folder (give a run folder or a CV folder of foldK/ run folders)")
    if (path / METRICS_FILE).is_file():
        return redraw(path) + [_best_line(path.name, read_metrics(path))[0]]
    folds = fold_folders(path)
    if not folds:
        raise ReportError(f"{path} is neither a run folder (no {METRICS_FILE}) nor a CV folder "
                          f"(no fold0/, fold1/, ... holding {METRICS_FILE})")
    lines, values = [], []
    for fold in folds:
        lines += redraw(fold)
        line, value = _best_line(fold.name, read_metrics(fold))
        lines.append(line)
        values.append(value)
    known = [v for v in values if v is not None]
    if len(known) > 1:
        mean = sum(known) / len(known)
        spread = math.sqrt(sum((v - mean) ** 2 for v in known) / (len(known) - 1))
        lines.append(f"mean of the folds' best scores over {len(known)} folds: {mean:.4f} +- {spread:.4f} (std)")
    return lines
