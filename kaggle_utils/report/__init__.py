"""What a run did, in words and pictures, read from its folder: ``tables`` (val_counts.json, per_class.csv),
``curves`` (curves.png, lr_find.png, importance.png), ``folder`` (the end of a run, ``report OUT``, a ``tune`` study).
Imports nothing of :mod:`kaggle_utils.run`, which calls it.
"""
from .curves import write_importance, write_lr_find_plot
from .folder import (finish_run, fold_folders, next_lines, prediction_lines, read_metrics, report_command,
                     summary_lines, tune_lines)
from .tables import write_per_class

__all__ = ["finish_run", "fold_folders", "next_lines", "prediction_lines", "read_metrics", "report_command",
           "summary_lines", "tune_lines", "write_importance", "write_lr_find_plot", "write_per_class"]
