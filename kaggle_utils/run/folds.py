"""A CV folder's files: ``folds.csv`` (which fold holds each record) and ``oof.csv`` (each record predicted by the fold
model that did not train on it), written and read here: by :mod:`.cv`, and by a teacher's student (:mod:`.teacher`).

The folds (stratified by label, seeded, group-aware with ``--fold-group``) are a pure function of (labels, groups,
K, seed): ``--resume`` and ``--only-folds`` recompute them and refuse a change, which would train fold 1 on examples
fold 0 validated on and make the out-of-fold score optimistic without saying so. Groups (a patient, a video) live
in no TFRecord: they are read from a CSV keyed by the run's id column (a CSV ``--source``, or ``--fold-group-file``);
every fault of that file is refused, named, before anything is written.
"""
import csv
import dataclasses
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from .. import checkpoint
from ..config import ConfigError, TrainConfig
from ..data.convert import iterative_stratification

FOLDS_FILE = "folds.csv"
FOLD_OOF = "oof.csv"  # in fold{k}/: its held-out predictions; present = the fold is finished


def write_oof(path: Path, ids: Sequence[str], labels: Sequence[str], folds: Sequence[int], probs: np.ndarray) -> None:
    """An ``oof.csv``: id, label, fold, then a probability per class (process 0, atomic)."""
    if jax.process_index() == 0:
        checkpoint.atomic_write_csv(path, ["id", "label", "fold", *range(probs.shape[1])],
                                    ([i, label, int(fold), *map(float, row)]
                                     for i, label, fold, row in zip(ids, labels, folds, probs)))


def read_oof(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(ids, folds, probabilities [N, C])`` of an ``oof.csv`` (a fold's or the CV's), as :func:`write_oof` wrote
    it: each row predicted by the model of its fold, which did not train on it (a teacher's rows, ``--teacher``)."""
    with open(path, newline="") as f:
        header, *rows = list(csv.reader(f)) or [[]]
    if header[:3] != ["id", "label", "fold"] or len(header) < 4:
        raise ConfigError(f"{path} is not an out-of-fold file of the kit (its header: id,label,fold,0,1,...)")
    try:
        folds = np.array([int(row[2]) for row in rows], np.int64)
        probs = np.array([[float(v) for v in row[3:]] for row in rows], np.float64).reshape(len(rows), len(header) - 3)
    except ValueError:
        raise ConfigError(f"{path}: a row without a fold number or a probability per class") from None
    return [row[0] for row in rows], folds, probs



def assign_folds(labels: Sequence[int], k: int, seed: int, groups: Sequence | None = None) -> np.ndarray:
    """The fold (0..k-1) of each example: each class's examples, shuffled by ``seed``, dealt round-robin from
    where the previous class stopped (every fold holds each class's count / k, within 1); multi-hot ``labels``
    by iterative stratification; with ``groups``, whole groups (:func:`_group_folds`)."""
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
    """Whole groups to folds by scikit-learn's StratifiedGroupKFold rule (shuffled): the groups most concentrated
    on few classes first, each to the fold where the spread of each class's share over the folds is smallest
    (a tie: the fold with fewer examples). A greedy balance, not a guarantee: a large group is not split.
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


def read_folds(out: str | Path) -> tuple[dict[str, int], tuple[str, dict[str, str]] | None] | None:
    """``({id: fold}, (column, {id: group}) where the file is grouped, else None)`` of ``OUT/folds.csv``, checked to
    be the kit's; None when there is none."""
    path = Path(out) / FOLDS_FILE
    if not path.is_file():
        return None
    with path.open(newline="") as f:
        header, *rows = list(csv.reader(f)) or [[]]
    if header[:2] != ["id", "fold"] or len(header) > 3:
        raise ConfigError(f"{path} is not a folds file of the kit (expected the header id,fold or id,fold,GROUP); "
                          "remove it or choose another --out")
    if any(len(row) != len(header) for row in rows):
        raise ConfigError(f"{path} has a row with another number of columns than its header; remove it or choose "
                          "another --out")
    try:
        folds = {row[0]: int(row[1]) for row in rows}
    except ValueError:
        raise ConfigError(f"{path} has a row without an integer fold; remove it or choose another --out") from None
    return folds, (header[2], {row[0]: row[2] for row in rows}) if len(header) == 3 else None


def settle_folds(out: str | Path, ids: Sequence[str], folds: np.ndarray, *, k: int, seed: int,
                 groups: tuple[str, Sequence[str]] | None = None, overwrite: bool = False) -> None:
    """Writes ``OUT/folds.csv`` the first time; afterwards refuses folds or a grouping that differ from it.
    ``groups``: ``(column, each id's group)``, kept as a third column so the grouping is checked too."""
    path = Path(out) / FOLDS_FILE
    recorded = None if overwrite else read_folds(out)
    if recorded is None:
        checkpoint.atomic_write_csv(path, ["id", "fold", *([groups[0]] if groups else [])],
                                    zip(ids, map(int, folds), *([groups[1]] if groups else [])))
        return
    grouped = (groups[0], dict(zip(ids, map(str, groups[1])))) if groups else None
    difference = _difference(recorded, (dict(zip(ids, map(int, folds))), grouped))
    if difference:
        grouping = f" --fold-group {groups[0]}" if groups else ""
        raise ConfigError(f"{path} was made for other folds than --folds {k} --seed {seed}{grouping} give now "
                          f"({difference}): the folds of one CV folder must not change; use the settings it was made "
                          "with, or another --out (or --overwrite to start the whole CV again)")


def _difference(recorded: tuple[dict[str, int], tuple[str, dict[str, str]] | None],
                now: tuple[dict[str, int], tuple[str, dict[str, str]] | None]) -> str:
    """What differs between two ``({id: fold}, grouping)`` assignments, in words ('' when nothing does): the grouping
    (with or without groups, the column, the ids' groups) first, else the ids and their folds."""
    (folds_then, grouped_then), (folds_now, grouped_now) = recorded, now
    if grouped_then is None or grouped_now is None:
        if grouped_then is not grouped_now:
            return (f"made without --fold-group, grouped by {grouped_now[0]} now" if grouped_then is None
                    else f"grouped by {grouped_then[0]} then, without --fold-group now")
    elif grouped_then[0] != grouped_now[0]:
        return f"grouped by {grouped_then[0]} then, by {grouped_now[0]} now"
    elif moved := _moved(grouped_then[1], grouped_now[1], f"{grouped_now[0]} group", repr):
        return moved
    k_then, k_now = max(folds_then.values(), default=-1) + 1, max(folds_now.values(), default=-1) + 1
    gone, new = sorted(set(folds_then) - set(folds_now)), sorted(set(folds_now) - set(folds_then))
    parts = [f"{k_then} folds then, {k_now} now" if k_then != k_now else "",
             f"{len(gone)} id(s) no longer in the data, e.g. {gone[0]}" if gone else "",
             f"{len(new)} id(s) not in the file, e.g. {new[0]}" if new else "",
             _moved(folds_then, folds_now, "fold", lambda fold: f"fold {fold}")]
    return "; ".join(filter(None, parts))


def _moved(recorded: dict, now: dict, where: str, show=str) -> str:
    """How many ids of both are in another ``where`` now, the first of them shown ('' when none is)."""
    moved = sorted(i for i in set(recorded) & set(now) if recorded[i] != now[i])
    return (f"{len(moved)} id(s) in another {where}, e.g. {moved[0]}: {show(recorded[moved[0]])} then, "
            f"{show(now[moved[0]])} now") if moved else ""


# --------------------------------------------------------------------------- --fold-group


@dataclasses.dataclass(frozen=True)
class FoldGroups:
    """``{id: group}`` of one CSV column, and where it was read (for the messages)."""

    column: str
    path: Path
    id_column: str
    of: dict[str, str]

    def lookup(self, ids: Sequence[str], where: str) -> np.ndarray:
        """The group of each id; refuses ids the file has no row for (``where``: what the ids are)."""
        missing = sorted(str(i) for i in ids if i not in self.of)
        if missing:
            shown = ", ".join(map(repr, missing[:3])) + (", ..." if len(missing) > 3 else "")
            raise ConfigError(f"--fold-group {self.column}: {len(missing)} of the {len(ids)} {where} have no row in "
                              f"{self.path} (matched by its {self.id_column!r} column), e.g. {shown}: every record "
                              "needs a group")
        return np.array([self.of[i] for i in ids], dtype=object)


def group_file(config: TrainConfig, column: str | None, path: str | None) -> Path | None:
    """The CSV ``--fold-group`` is read from: ``--fold-group-file``, else a CSV ``--source``; None without a group."""
    if column is None:
        if path is not None:
            raise ConfigError(f"--fold-group-file {path} needs --fold-group COLUMN: the column of the groups")
        return None
    if path is not None:
        return Path(path)
    source = config.data.source
    if source is not None and source.lower().endswith(".csv"):
        return Path(source)
    where = f"--source {source}" if source else f"--data-dir {config.data.data_dir or '(the digits sample)'}"
    raise ConfigError(f"--fold-group {column}: {where} has no columns to read groups from; give "
                      f"--fold-group-file CSV (a CSV with the run's id column and {column})")


def read_groups(path: Path, column: str, id_column: str) -> FoldGroups:
    """``{id: group}`` of ``path``'s ``column``, refusing a missing file or column, an empty group, a repeated id."""
    if not path.is_file():
        raise ConfigError(f"--fold-group {column}: {path} does not exist")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        absent = [c for c in (id_column, column) if c not in header]
        if absent:
            raise ConfigError(f"--fold-group {column}: {path} has no column {' or '.join(map(repr, absent))} "
                              f"(columns: {', '.join(header)}); the groups are matched to the records by the run's "
                              "id column (--id-column)")
        of: dict[str, str] = {}
        for row in reader:
            key, group = row[id_column], (row[column] or "").strip()
            if not group:
                raise ConfigError(f"--fold-group {column}: {path}, line {reader.line_num}: no {column} value for id "
                                  f"{key!r}")
            if of.setdefault(key, group) != group:
                raise ConfigError(f"--fold-group {column}: {path}, line {reader.line_num}: id {key!r} is given "
                                  f"groups {of[key]!r} and {group!r}")
    return FoldGroups(column, path, id_column, of)
