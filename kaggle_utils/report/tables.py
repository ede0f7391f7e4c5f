"""``per_class.csv`` and the counts it is made from (``val_counts.json``: the best evaluation's confusion matrix,
or a multi-label task's TP / FP / FN, stored once by the run), with no model and no data.
"""
import json
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from .. import checkpoint
from ..metrics import class_scores, confusion_scores

COUNTS_FILE = "val_counts.json"
PER_CLASS_FILE = "per_class.csv"
_COLUMNS = ("class", "name", "support", "precision", "recall", "f1", "predicted", "most_confused_with",
            "most_confused_count")


def _names(class_names: Sequence[str], num_classes: int) -> list[str]:
    """The run's class names, or the class indices as text (a run of integer labels has none)."""
    return list(class_names) if len(class_names) == num_classes else [str(i) for i in range(num_classes)]


def counts_record(sums: Mapping[str, np.ndarray], class_names: Sequence[str], best: Mapping | None) -> dict | None:
    """What ``val_counts.json`` holds, from an evaluation's summed statistics; None if the task sums
    neither a confusion matrix nor per-class TP / FP / FN (a custom task)."""
    keys = ("confusion",) if "confusion" in sums else ("tp", "fp", "fn")
    if not all(k in sums for k in keys):
        return None
    where = {"step": best.get("step"), "epoch": best.get("epoch")} if best else {}
    return {**where, "count": int(sums["count"]), "class_names": _names(class_names, len(sums[keys[0]])),
            **{k: np.asarray(sums[k], np.int64).tolist() for k in keys}}


def read_counts(out: Path) -> dict | None:
    """The stored counts, or None when the run has none (a run from before they were stored)."""
    path = Path(out) / COUNTS_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except ValueError as err:
        raise checkpoint.CheckpointError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(record, dict) or not ({"confusion"} <= set(record) or {"tp", "fp", "fn"} <= set(record)):
        raise checkpoint.CheckpointError(f"{path} holds neither 'confusion' nor 'tp'/'fp'/'fn' counts")
    return record


def confusion_rows(confusion, class_names: Sequence[str] = ()) -> list[dict]:
    """One row per class of a ``[C, C]`` confusion matrix (rows: true); ``most_confused_with``: the class its images
    were most often taken for (the first on a tie; empty when none was)."""
    confusion = np.asarray(confusion, np.int64)
    names = _names(class_names, len(confusion))
    precision, recall, f1 = confusion_scores(confusion)
    mistakes = confusion - np.diag(np.diag(confusion))
    rows = []
    for c, name in enumerate(names):
        other = int(np.argmax(mistakes[c]))
        taken = int(mistakes[c, other])
        rows.append({"class": c, "name": name, "support": int(confusion[c].sum()), "precision": precision[c],
                     "recall": recall[c], "f1": f1[c], "predicted": int(confusion[:, c].sum()),
                     "most_confused_with": names[other] if taken else "", "most_confused_count": taken})
    return rows


def multilabel_rows(tp, fp, fn, class_names: Sequence[str] = ()) -> list[dict]:
    """One row per class of a multi-label task: each class is its own yes/no decision, so there
    is no "taken for another class" column."""
    tp, fp, fn = (np.asarray(v, np.float64) for v in (tp, fp, fn))
    names = _names(class_names, len(tp))
    precision, recall, f1 = class_scores(tp, fp, fn)
    return [{"class": c, "name": name, "support": int(tp[c] + fn[c]), "precision": precision[c],
             "recall": recall[c], "f1": f1[c], "predicted": int(tp[c] + fp[c])} for c, name in enumerate(names)]


def write_per_class(out: Path, record: dict) -> Path:
    """``OUT/per_class.csv`` from a ``val_counts.json`` record, single- or multi-label."""
    names = record.get("class_names", ())
    if "confusion" in record:
        rows, columns = confusion_rows(record["confusion"], names), _COLUMNS
    else:
        rows, columns = multilabel_rows(record["tp"], record["fp"], record["fn"], names), _COLUMNS[:7]
    path = Path(out) / PER_CLASS_FILE
    checkpoint.atomic_write_csv(path, columns, [{k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in row.items()}
                                                for row in rows])
    return path
