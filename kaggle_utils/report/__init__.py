"""What a run did, in words and pictures: the end-of-run summary, ``curves.png``, ``per_class.csv``.

Reads a run folder (``metrics.json``, ``val_counts.json``) or a CV folder of ``foldK/`` run
folders, and sits above :mod:`kaggle_utils.run` and :mod:`kaggle_utils.train`: the trainer
reaches it only through one lazy call at the end of a run (:func:`finish_run`), and the job
prints :func:`summary_lines` and runs ``python -m kaggle_utils report OUT``
(:func:`report_command`), which redraws everything from the folder with no model and no data.

* ``tables``: the best checkpoint's validation counts and the per-class table made from them.
* ``curves``: the loss, scores and learning rate against the step (matplotlib, Agg, no pyplot).
* ``folder``: run and CV folders, redrawing them, the ``report`` command.
* ``summary``: the blocks a run and a prediction end with.
* ``finish``: the end of a training run (one more evaluation of the best checkpoint).
* ``study``: what a ``tune`` study found (its table, ``importance.png``).
"""
from .curves import CURVES_FILE, write_curves
from .finish import finish_run, validation_sums
from .folder import METRICS_FILE, ReportError, fold_folders, read_metrics, redraw, report_command
from .study import IMPORTANCE_FILE, tune_lines, write_importance
from .summary import next_lines, prediction_lines, summary_lines
from .tables import (COUNTS_FILE, PER_CLASS_FILE, confusion_rows, counts_record, multilabel_rows, read_counts,
                     write_counts, write_per_class, write_per_class_from_counts)

__all__ = [
    "COUNTS_FILE", "CURVES_FILE", "IMPORTANCE_FILE", "METRICS_FILE", "PER_CLASS_FILE", "ReportError", "confusion_rows", "counts_record",
    "finish_run", "fold_folders", "multilabel_rows", "next_lines", "prediction_lines", "read_counts", "read_metrics", "redraw",
    "report_command", "summary_lines", "tune_lines", "validation_sums", "write_counts", "write_curves", "write_per_class",
    "write_importance", "write_per_class_from_counts",
]
