"""Multi-label decisions as Kaggle's winners make them: a threshold per class, learnt on held-out probabilities.

With ``--threshold auto`` (the default) a run learns, after training, each class's threshold on the validation
split's probabilities from its best checkpoint (a CV, on its out-of-fold probabilities): the one that maximises that
class's F1, which maximises the macro F1 the run monitors. Never on the test split: it has no labels, and a
threshold fitted to the rows it scores would flatter them. ``OUT/thresholds.json`` keeps them with the run;
``submission.csv`` and ``predict`` use them, and ``--threshold X`` (train or predict) replaces them all by X.
``--min-labels K`` gives a row with fewer than K classes above their thresholds its K most probable ones (a
competition that scores an empty row as wrong: ``auto`` is 1 where every training image has a class).
"""
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from .. import checkpoint
from ..config import ConfigError, TrainConfig
from ..metrics import multilabel_scores

THRESHOLDS_FILE = "thresholds.json"
CANDIDATES = np.round(np.arange(0.02, 0.99, 0.01), 2)  # the thresholds tried for each class
DEFAULT = 0.5  # a class whose held-out rows give no evidence (no positive, no false positive) keeps it


def learn_thresholds(probs: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per class, the candidate threshold maximising its F1 on ``probs`` ``[N, C]`` against multi-hot ``labels``;
    among equal F1s the middle one (ties span a gap between probabilities: its middle is the least fitted)."""
    probs, truth = np.asarray(probs, np.float64), np.asarray(labels) > 0.5
    if probs.shape != truth.shape or probs.ndim != 2:
        raise ValueError(f"probabilities {probs.shape} and labels {truth.shape} must be the same [N, C]")
    chosen = np.full(probs.shape[1], DEFAULT)
    for c in range(probs.shape[1]):
        predicted = probs[:, c][None, :] > CANDIDATES[:, None]  # [candidates, N]
        tp = (predicted & truth[:, c]).sum(1)
        f1 = 2 * tp / np.maximum(predicted.sum(1) + truth[:, c].sum(), 1)
        if truth[:, c].any():
            best = np.flatnonzero(f1 == f1.max())
            chosen[c] = CANDIDATES[best[len(best) // 2]]
    return chosen


def decide(probs: np.ndarray, thresholds: np.ndarray | float, min_labels: int = 0) -> np.ndarray:
    """bool ``[N, C]``: each class above its threshold; a row with fewer than ``min_labels`` gets its most probable
    classes up to that many."""
    probs = np.asarray(probs, np.float64)
    chosen = probs > np.asarray(thresholds, np.float64)
    short = chosen.sum(1) < min_labels
    if short.any() and min_labels:
        top = np.argsort(-probs[short], axis=1, kind="stable")[:, :min_labels]
        rows = chosen[short]
        np.put_along_axis(rows, top, True, axis=1)
        chosen[short] = rows
    return chosen


def settle(config: TrainConfig, probs: np.ndarray, labels: np.ndarray, class_names: Sequence[str], *,
           learnt_on: str) -> dict:
    """The record of a run's (or a CV's) decisions: thresholds learnt on ``probs`` / ``labels`` (``learnt_on``
    names them) with ``--threshold auto``, else the given one for every class; the scores they give there."""
    task = config.task
    auto = task.threshold == "auto"
    thresholds = learn_thresholds(probs, labels) if auto else np.full(probs.shape[1], float(task.threshold))
    least = min_labels(config)
    names = list(class_names) or [str(c) for c in range(probs.shape[1])]
    return {"thresholds": dict(zip(names, map(float, thresholds))), "min_labels": least,
            "learnt_on": learnt_on if auto else f"given: --threshold {task.threshold}",
            "scores": {"at_0.5": multilabel_scores(decide(probs, DEFAULT), labels),
                       "chosen": multilabel_scores(decide(probs, thresholds, least), labels)}}


def min_labels(config: TrainConfig) -> int:
    """``--min-labels`` as resolved (a run from before it existed: 0, rows could be empty)."""
    return 0 if config.task.min_labels == "auto" else int(config.task.min_labels)


def write(folder: str | Path, record: dict) -> Path:
    path = Path(folder) / THRESHOLDS_FILE
    checkpoint.atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return path


def read(folder: str | Path, class_names: Sequence[str]) -> np.ndarray | None:
    """The per-class thresholds ``folder`` keeps (in ``class_names``' order), or None where it keeps none."""
    path = Path(folder) / THRESHOLDS_FILE
    if not path.is_file():
        return None
    try:
        kept = json.loads(path.read_text())["thresholds"]
        names = list(class_names) or [str(c) for c in range(len(kept))]
        return np.array([float(kept[name]) for name in names])
    except (ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{path} does not hold a threshold per class of {', '.join(class_names)} ({err!r}): "
                          "give --threshold, or train the run again") from None


def describe(record: dict) -> str:
    """One line: the thresholds and what they score where they were learnt."""
    at, chosen = record["scores"]["at_0.5"], record["scores"]["chosen"]
    values = ", ".join(f"{name} {t:.2f}" for name, t in record["thresholds"].items())
    return (f"thresholds ({record['learnt_on']}): {values}; at least {record['min_labels']} class per row; there, "
            f"macro F1 {at['f1']:.4f} -> {chosen['f1']:.4f}, sample F1 {at['samples_f1']:.4f} -> "
            f"{chosen['samples_f1']:.4f} (at 0.5 -> chosen)")
