"""Fold assignment for cross-validation: stratified by label, seeded, optionally group-aware; kept in ``OUT/folds.csv``.

The assignment is a pure function of (labels, groups, K, seed), so ``--resume`` and later
``--only-folds`` calls recompute it and check it against ``folds.csv`` rather than trusting
either alone: a changed seed, K or pool of examples would otherwise train fold 1 on examples
that fold 0 already validated on, and the out-of-fold score would be optimistic without
saying so. A difference is refused, naming it.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

import numpy as np

from ..checkpoint import atomic_write_text
from ..config import ConfigError

__all__ = ["FOLDS_FILE", "assign_folds", "read_folds", "settle_folds"]

FOLDS_FILE = "folds.csv"


def assign_folds(labels: Sequence[int], k: int, seed: int, groups: Sequence | None = None) -> np.ndarray:
    """The fold (0..k-1) of each example.

    Without ``groups``: each class's examples, shuffled by ``seed``, are dealt round-robin,
    continuing from where the previous class stopped, so every fold holds each class's count
    divided by ``k`` (within 1) and the folds' sizes are within 1 of each other.

    Multi-hot ``labels`` ``[N, C]`` (multi-label): iterative stratification over k equal shares
    (:func:`~kaggle_utils.data.stratify.iterative_stratification`): each class's count in every fold
    close to its count divided by ``k``, rarest classes placed first.

    With ``groups``: whole groups are dealt (largest first, ties in a seeded order) to the fold
    holding the fewest examples so far: no group in two folds, sizes as even as the groups allow;
    the class balance is then only what the groups allow (StratifiedGroupKFold would trade size for it).
    """
    labels = np.asarray(labels)
    if k < 2:
        raise ConfigError(f"--folds {k}: cross-validation needs at least 2 folds")
    if len(labels) < k:
        raise ConfigError(f"--folds {k}: only {len(labels)} labelled examples")
    rng = np.random.default_rng(seed)
    folds = np.full(len(labels), -1, np.int64)
    if groups is not None:
        return _group_folds(np.asarray(groups), k, rng)
    if labels.ndim == 2:
        from ..data.stratify import iterative_stratification

        return iterative_stratification(labels, [1.0] * k, seed)
    start = 0
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        folds[members] = (start + np.arange(len(members))) % k
        start = (start + len(members)) % k
    return folds


def _group_folds(groups: np.ndarray, k: int, rng) -> np.ndarray:
    names, inverse, counts = np.unique(groups, return_inverse=True, return_counts=True)
    if len(names) < k:
        raise ConfigError(f"--folds {k}: --fold-group gives only {len(names)} groups; each fold needs one")
    order = rng.permutation(len(names))
    order = order[np.argsort(-counts[order], kind="stable")]
    sizes, fold_of = np.zeros(k, np.int64), np.zeros(len(names), np.int64)
    for g in order:
        fold_of[g] = int(np.argmin(sizes))
        sizes[fold_of[g]] += counts[g]
    return fold_of[inverse]


def read_folds(out: str | Path) -> dict[str, int] | None:
    """``{id: fold}`` of ``OUT/folds.csv``, or None when there is none."""
    path = Path(out) / FOLDS_FILE
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0] != ["id", "fold"]:
        raise ConfigError(f"{path} is not a folds file of the kit (expected the header id,fold); remove it or "
                          "choose another --out")
    try:
        return {row[0]: int(row[1]) for row in rows[1:]}
    except (IndexError, ValueError):
        raise ConfigError(f"{path} has a row without an integer fold; remove it or choose another --out") from None


def settle_folds(out: str | Path, ids: Sequence[str], folds: np.ndarray, *, k: int, seed: int,
                 overwrite: bool = False) -> None:
    """Writes ``OUT/folds.csv`` the first time; afterwards refuses an assignment that differs from it."""
    path = Path(out) / FOLDS_FILE
    recorded = None if overwrite else read_folds(out)
    if recorded is None:
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(["id", "fold"])
        writer.writerows(zip(ids, map(int, folds)))
        atomic_write_text(path, text.getvalue())
        return
    difference = _difference(recorded, dict(zip(ids, map(int, folds))))
    if difference:
        raise ConfigError(f"{path} was made for other folds than --folds {k} --seed {seed} give now ({difference}): "
                          "the folds of one CV folder must not change; use the settings it was made with, or "
                          "another --out (or --overwrite to start the whole CV again)")


def _difference(recorded: dict[str, int], now: dict[str, int]) -> str:
    """What differs between two assignments, in words ('' when nothing does)."""
    parts = []
    k_then, k_now = max(recorded.values(), default=-1) + 1, max(now.values(), default=-1) + 1
    if k_then != k_now:
        parts.append(f"{k_then} folds then, {k_now} now")
    gone, new = sorted(set(recorded) - set(now)), sorted(set(now) - set(recorded))
    if gone:
        parts.append(f"{len(gone)} id(s) no longer in the data, e.g. {gone[0]}")
    if new:
        parts.append(f"{len(new)} id(s) not in the file, e.g. {new[0]}")
    moved = sorted(i for i in set(recorded) & set(now) if recorded[i] != now[i])
    if moved:
        parts.append(f"{len(moved)} id(s) in another fold, e.g. {moved[0]}: fold {recorded[moved[0]]} then, "
                     f"{now[moved[0]]} now")
    return "; ".join(parts)
