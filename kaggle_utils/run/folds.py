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
from ..data.stratify import iterative_stratification

__all__ = ["FOLDS_FILE", "assign_folds", "read_fold_groups", "read_folds", "settle_folds"]

FOLDS_FILE = "folds.csv"


def assign_folds(labels: Sequence[int], k: int, seed: int, groups: Sequence | None = None) -> np.ndarray:
    """The fold (0..k-1) of each example.

    Without ``groups``: each class's examples, shuffled by ``seed``, are dealt round-robin,
    continuing from where the previous class stopped, so every fold holds each class's count
    divided by ``k`` (within 1) and the folds' sizes are within 1 of each other.

    Multi-hot ``labels`` ``[N, C]`` (multi-label): iterative stratification over k equal shares
    (:func:`~kaggle_utils.data.stratify.iterative_stratification`): each class's count in every fold
    close to its count divided by ``k``, rarest classes placed first.

    With ``groups``: whole groups are dealt, so no group is in two folds, each to the fold that
    keeps the classes most evenly spread (scikit-learn's StratifiedGroupKFold rule, in numpy):
    see :func:`_group_folds`.
    """
    labels = np.asarray(labels)
    if k < 2:
        raise ConfigError(f"--folds {k}: cross-validation needs at least 2 folds")
    if len(labels) < k:
        raise ConfigError(f"--folds {k}: only {len(labels)} labelled examples")
    rng = np.random.default_rng(seed)
    folds = np.full(len(labels), -1, np.int64)
    if groups is not None:
        return _group_folds(labels, np.asarray(groups), k, rng)
    if labels.ndim == 2:
        return iterative_stratification(labels, [1.0] * k, seed)
    start = 0
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        folds[members] = (start + np.arange(len(members))) % k
        start = (start + len(members)) % k
    return folds


def _group_folds(labels: np.ndarray, groups: np.ndarray, k: int, rng) -> np.ndarray:
    """Whole groups to folds, keeping each class's share of every fold as even as the groups allow.

    The rule of scikit-learn's StratifiedGroupKFold (shuffled): groups in a seeded order, stably
    sorted so that those whose examples are most concentrated on few classes (the hardest to
    place) come first; each goes to the fold where, with it, the spread over folds of each
    class's share (std of count / class total, averaged over classes) is smallest, a tie to the
    fold with fewer examples. Only whole groups move, so a class held by one large group cannot
    be spread: the balance is the best this greedy rule finds, not a guarantee.
    """
    names, group_of = np.unique(groups, return_inverse=True)
    if len(names) < k:
        raise ConfigError(f"--folds {k}: --fold-group gives only {len(names)} groups; each fold needs one")
    labels = np.asarray(labels)
    hot = labels if labels.ndim == 2 else labels[:, None] == np.unique(labels)[None]  # [N, C] multi-hot / one-hot
    per_group = np.zeros((len(names), hot.shape[1]))
    np.add.at(per_group, group_of, hot.astype(np.float64))
    order = rng.permutation(len(names))
    order = order[np.argsort(-per_group[order].std(axis=1), kind="stable")]
    class_totals = np.maximum(per_group.sum(axis=0), 1.0)  # a multi-hot class nobody has: no share
    in_fold = np.zeros((k, hot.shape[1]))
    fold_of = np.zeros(len(names), np.int64)
    trial = np.eye(k)[:, :, None]  # [candidate fold, fold, 1]: where the group is added in each trial
    for g in order:
        shares = (in_fold[None] + trial * per_group[g]) / class_totals  # [candidate, fold, class]
        spread = shares.std(axis=1).mean(axis=1)
        best = np.flatnonzero(np.isclose(spread, spread.min()))
        fold_of[g] = best[np.argmin(in_fold[best].sum(axis=1))]
        in_fold[fold_of[g]] += per_group[g]
    empty = sorted(set(range(k)) - set(fold_of.tolist()))
    if empty:
        raise ConfigError(f"--folds {k}: --fold-group's {len(names)} groups leave fold {empty[0]} empty "
                          "(a few groups hold most examples); use fewer folds")
    return fold_of[group_of]


def _read_rows(out: str | Path) -> list[list[str]] | None:
    """The rows of ``OUT/folds.csv`` (header first), checked to be the kit's; None when there is none."""
    path = Path(out) / FOLDS_FILE
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    if not rows or rows[0][:2] != ["id", "fold"] or len(rows[0]) > 3:
        raise ConfigError(f"{path} is not a folds file of the kit (expected the header id,fold or id,fold,GROUP); "
                          "remove it or choose another --out")
    if any(len(row) != len(rows[0]) for row in rows[1:]):
        raise ConfigError(f"{path} has a row with another number of columns than its header; remove it or choose "
                          "another --out")
    return rows


def read_folds(out: str | Path) -> dict[str, int] | None:
    """``{id: fold}`` of ``OUT/folds.csv``, or None when there is none."""
    rows = _read_rows(out)
    if rows is None:
        return None
    try:
        return {row[0]: int(row[1]) for row in rows[1:]}
    except ValueError:
        raise ConfigError(f"{Path(out) / FOLDS_FILE} has a row without an integer fold; remove it or choose another "
                          "--out") from None


def read_fold_groups(out: str | Path) -> tuple[str, dict[str, str]] | None:
    """``(column, {id: group})`` of a grouped ``OUT/folds.csv`` (its third column); None when it has none."""
    rows = _read_rows(out)
    if rows is None or len(rows[0]) < 3:
        return None
    return rows[0][2], {row[0]: row[2] for row in rows[1:]}


def settle_folds(out: str | Path, ids: Sequence[str], folds: np.ndarray, *, k: int, seed: int,
                 groups: tuple[str, Sequence[str]] | None = None, overwrite: bool = False) -> None:
    """Writes ``OUT/folds.csv`` the first time; afterwards refuses an assignment or a grouping that differs from it.

    ``groups``: ``(column, the group of each id)`` of a ``--fold-group`` CV, kept as the file's
    third column (headed by the column's name), so that the grouping is checked as the folds are.
    """
    path = Path(out) / FOLDS_FILE
    recorded = None if overwrite else read_folds(out)
    if recorded is None:
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(["id", "fold", *([groups[0]] if groups else [])])
        writer.writerows(zip(ids, map(int, folds), *([groups[1]] if groups else [])))
        atomic_write_text(path, text.getvalue())
        return
    grouped = (groups[0], dict(zip(ids, map(str, groups[1])))) if groups else None
    difference = (_group_difference(read_fold_groups(out), grouped)
                  or _difference(recorded, dict(zip(ids, map(int, folds)))))
    if difference:
        grouping = f" --fold-group {groups[0]}" if groups else ""
        raise ConfigError(f"{path} was made for other folds than --folds {k} --seed {seed}{grouping} give now "
                          f"({difference}): the folds of one CV folder must not change; use the settings it was made "
                          "with, or another --out (or --overwrite to start the whole CV again)")


def _group_difference(recorded: tuple[str, dict[str, str]] | None, now: tuple[str, dict[str, str]] | None) -> str:
    """How the grouping differs, in words ('' when it does not): with or without groups, the column, the ids' groups."""
    if recorded is None or now is None:
        if recorded is None and now is None:
            return ""
        return (f"made without --fold-group, grouped by {now[0]} now" if recorded is None
                else f"grouped by {recorded[0]} then, without --fold-group now")
    if recorded[0] != now[0]:
        return f"grouped by {recorded[0]} then, by {now[0]} now"
    changed = sorted(i for i in set(recorded[1]) & set(now[1]) if recorded[1][i] != now[1][i])
    if changed:
        return (f"{len(changed)} id(s) in another {now[0]} group, e.g. {changed[0]}: {recorded[1][changed[0]]!r} "
                f"then, {now[1][changed[0]]!r} now")
    return ""


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
