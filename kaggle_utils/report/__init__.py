"""What a run did, in words and pictures: the end-of-run summary, ``curves.png``, ``per_class.csv``, ``lr_find.png``.

Reads run folders (``metrics.json``, ``val_counts.json``) and CV folders of ``foldK/`` run folders, and
imports nothing of :mod:`kaggle_utils.run` (which calls it): ``python -m kaggle_utils report OUT``
(:func:`report_command`) redraws everything from the files, with no model and no data.

* ``tables``: the best checkpoint's validation counts and the per-class table made from them.
* ``curves``: the pictures (matplotlib, Agg, no pyplot).
* ``folder``: run and CV folders: the end of a run (:func:`finish_run`), redrawing, the ``report`` command.
* ``summary``: the blocks a run and a prediction end with.
"""
from .curves import CURVES_FILE, LR_FIND_PLOT, write_curves, write_lr_find_plot
from .folder import METRICS_FILE, ReportError, finish_run, fold_folders, read_metrics, redraw, report_command
from .summary import next_lines, prediction_lines, summary_lines
from .tables import (COUNTS_FILE, PER_CLASS_FILE, confusion_rows, counts_record, multilabel_rows, read_counts,
                     write_counts, write_per_class, write_per_class_from_counts)

__all__ = [
    "COUNTS_FILE", "CURVES_FILE", "LR_FIND_PLOT", "METRICS_FILE", "PER_CLASS_FILE", "ReportError", "confusion_rows",
    "counts_record", "finish_run", "fold_folders", "multilabel_rows", "next_lines", "prediction_lines",
    "read_counts", "read_metrics", "redraw", "report_command", "summary_lines", "write_counts", "write_curves",
    "write_lr_find_plot", "write_per_class", "write_per_class_from_counts",
]
