"""What a run did, in words and pictures, read from its folder: ``tables`` (val_counts.json, per_class.csv),
``curves`` (curves.png, lr_find.png, importance.png), ``folder`` (the end of a run, ``report OUT``, a ``tune`` study).
Imports nothing of :mod:`kaggle_utils.run`, which calls it.
"""
from .curves import CURVES_FILE, IMPORTANCE_FILE, LR_FIND_PLOT, write_curves, write_importance, write_lr_find_plot
from .folder import (METRICS_FILE, ReportError, finish_run, fold_folders, next_lines, prediction_lines, read_metrics,
                     redraw, report_command, summary_lines, tune_lines)
from .tables import (COUNTS_FILE, PER_CLASS_FILE, confusion_rows, counts_record, multilabel_rows, read_counts,
                     write_counts, write_per_class, write_per_class_from_counts)

__all__ = ["COUNTS_FILE", "CURVES_FILE", "IMPORTANCE_FILE", "LR_FIND_PLOT", "METRICS_FILE", "PER_CLASS_FILE",
           "ReportError", "confusion_rows", "counts_record", "finish_run", "fold_folders", "multilabel_rows",
           "next_lines", "prediction_lines", "read_counts", "read_metrics", "redraw", "report_command",
           "summary_lines", "tune_lines", "write_counts", "write_curves", "write_importance", "write_lr_find_plot",
           "write_per_class", "write_per_class_from_counts"]
