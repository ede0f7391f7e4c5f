"""``--teacher`` and ``--pseudo-labels``: a finished run's probabilities as per-example fields of a new run.

A teacher is not a new loop: its rows are joined to the run's records by id (:class:`~kaggle_utils.data.ExampleFields`)
and the task reads them (``alpha x teacher + (1 - alpha) x label``, :meth:`~kaggle_utils.train.Task.with_teacher`).
What a teacher is read from, by what the kit writes (the readers sit beside the writers: :func:`.folds.read_oof`,
:func:`.predict.read_probabilities`):

* a CV folder: ``oof.csv`` for the labelled records, each row predicted by the fold model that did not train on it;
  ``test_probabilities.csv`` (the folds' mean) for ``--pseudo-labels``;
* a run folder (a CV's ``fold{k}/`` too): its ``oof.csv`` where it has one, else ``probabilities.csv``;
* a folder ``predict`` wrote (``predict.json`` names its checkpoints): ``probabilities.csv``;
* a CSV: an id column and one column per class (an ``oof.csv`` is read as one).

A teacher's row of a record its own model trained on would teach the student the answer it was given: every row
used for a labelled record is checked against what the teacher's models trained on (a fold's: its CV's
``folds.csv``; a run's: its data's train split), refused naming the records. The teacher's classes must be the
run's. Pseudo-labelled test images join the training records only (never validation, never a fold's held-out part).
"""
import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from ..config import ConfigError, TrainConfig
from ..data import ExampleFields
from ..data.tfrecords import scan_records
from .folds import FOLD_OOF, FOLDS_FILE, read_folds, read_oof
from .data import RunData, find_splits, named_classes, record_names
from .predict import blend_checkpoints, read_probabilities

_FOLD = re.compile(r"fold(\d+)")


@dataclasses.dataclass(frozen=True)
class TeacherRows:
    """Probabilities by id, as a teacher's files hold them, and what its models trained on."""

    file: Path  # the file read
    ids: list[str]
    probs: np.ndarray  # [N, C]
    classes: tuple[str, ...]  # the columns' class names ("0", "1", ...: unnamed)
    multi_label: bool | None  # the teacher's task, where its folder says
    held_out: bool  # every row predicted by a model that did not train on it (an oof.csv)
    trained_on: frozenset | None  # the names of the records its models trained on; None: not known


def _run_record(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None


def trained_names(run: Path) -> frozenset | None:
    """The records a run folder's model trained on, named as :func:`~.data.record_names` names them: a CV fold's,
    by its CV's ``folds.csv``; another run's, its data's train split (None where that data is not here)."""
    fold = _FOLD.fullmatch(run.name)
    if fold and (run.parent / FOLDS_FILE).is_file():
        folds, _ = read_folds(run.parent)
        return frozenset(str(name) for name, k in folds.items() if k != int(fold.group(1)))
    record = _run_record(run)
    data_dir = record and record.get("config", {}).get("data", {}).get("data_dir")
    try:
        splits = find_splits(data_dir)
    except (ConfigError, TypeError):  # not here (a Kaggle session's input, the embedded sample's temporary folder)
        return None
    pool = scan_records(splits["train"] + splits["val"])
    names, _ = record_names(pool)
    return frozenset(map(str, names[np.isin(pool.files, splits["train"])]))


def _folder_facts(folder: Path) -> tuple[tuple[str, ...], bool | None]:
    """(class names, multi-label?) a teacher folder's run records; ((), None) where it records none."""
    record = _run_record(folder) or next(filter(None, map(_run_record, sorted(folder.glob("fold*")))), None)
    if record is None:
        return (), None
    config = TrainConfig.from_dict(record["config"])
    return named_classes(config.data.class_names), config.task.task == "multilabel"


def read_teacher(path: str | Path, *, test: bool, flag: str) -> TeacherRows:
    """The rows ``path`` holds for the run's labelled records (``test=False``) or its test images."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        if (path / FOLDS_FILE).is_file():  # a CV folder
            names = ["test_probabilities.csv"] if test else [FOLD_OOF]
        else:  # a run folder (a CV's fold has its own oof.csv) or a folder predict wrote
            names = ["probabilities.csv"] if test else [FOLD_OOF, "probabilities.csv"]
        file = next((path / name for name in names if (path / name).is_file()), None)
        if file is None:
            raise ConfigError(f"{flag} {path}: holds no {' or '.join(names)} (a CV, run or predict folder of the kit, "
                              "finished, or a probabilities CSV)")
    elif path.is_file():
        file = path
    else:
        raise ConfigError(f"{flag} {path} does not exist")
    classes, multi_label = _folder_facts(folder)
    if file.name == FOLD_OOF:
        ids, _, probs = read_oof(file)
        return TeacherRows(file, ids, probs, classes or tuple(map(str, range(probs.shape[1]))), multi_label, True,
                           None)
    ids, columns, probs = read_probabilities(file)
    runs = blend_checkpoints(folder)
    runs = [Path(p).parent for p in runs] if runs is not None else [folder] if _run_record(folder) else []
    trained = [trained_names(run) for run in runs]
    known = frozenset().union(*trained) if runs and all(t is not None for t in trained) else None
    return TeacherRows(file, ids, probs, tuple(columns), multi_label, False, known)


def _check_classes(rows: TeacherRows, config: TrainConfig, data: RunData, flag: str) -> None:
    """Refuses a teacher whose columns are not the run's classes, or whose rows are not probabilities of its task."""
    classes = config.model.num_classes or data.max_label + 1
    ours = named_classes(data.class_names)
    theirs = named_classes(rows.classes)
    multi = config.task.task == "multilabel"
    problem = (f"{rows.probs.shape[1]} classes, the run {classes}" if rows.probs.shape[1] != classes else
               f"classes {', '.join(theirs[:4])}..., the run's {', '.join(ours[:4])}..." if ours and theirs and
               theirs != ours else
               "multi-label probabilities for a run of one class per image" if rows.multi_label is True and not multi
               else "one class per image, for a multi-label run" if rows.multi_label is False and multi else "")
    probs = rows.probs
    if not problem and not (np.isfinite(probs).all() and probs.min(initial=0) >= 0 and probs.max(initial=0) <= 1):
        problem = "values that are not probabilities (outside [0, 1])"
    if not problem and not multi and len(probs) and np.abs(probs.sum(1) - 1).max() > 1e-3:
        problem = "rows that do not sum to 1 (a multi-label teacher's sigmoid probabilities?)"
    if problem:
        raise ConfigError(f"{flag} {rows.file}: its probabilities are of {problem}: a teacher must predict the run's "
                          "own classes")


def _named_rows(rows: TeacherRows, names, flag: str, what: str) -> np.ndarray:
    """The teacher's row of each of ``names``, refused where it has none."""
    row_of = {name: r for r, name in enumerate(rows.ids)}
    missing = [name for name in names if name not in row_of]
    if missing:
        raise ConfigError(f"{flag} {rows.file} has no row for {len(missing)} of the run's {len(names)} {what} (e.g. "
                          f"{', '.join(map(repr, missing[:3]))}): a CV folder's oof.csv holds every labelled record")
    return np.array([row_of[name] for name in names], np.int64)


def teach(config: TrainConfig, data: RunData) -> RunData:
    """``data`` with the training records' teacher fields (``--teacher``) and the pseudo-labelled test images
    (``--pseudo-labels``) among them, and a note of both; ``data`` itself without either."""
    distill = config.distill
    if (distill.teacher is None and distill.pseudo_labels is None) or data.fields is not None:
        return data
    classes = config.model.num_classes or data.max_label + 1
    pool = scan_records(list(dict.fromkeys(data.splits["train"] + data.splits["val"])))  # a CV fold reads both
    names = [str(name) for name in record_names(pool)[0]]
    chosen = set(data.select["train"]) if "train" in data.select else None
    in_train = set(data.splits["train"])
    rows = [r for r, pair in enumerate(pool.pairs()) if (pair in chosen if chosen is not None else
                                                         pair[0] in in_train)]
    pairs, values, note = [pool.pairs()[r] for r in rows], {}, {}
    if distill.teacher is not None:
        teacher = read_teacher(distill.teacher, test=False, flag="--teacher")
        _check_classes(teacher, config, data, "--teacher")
        taught = [names[r] for r in rows]
        found = _named_rows(teacher, taught, "--teacher", "training records")
        seen = sorted(set(taught) & teacher.trained_on) if not teacher.held_out and teacher.trained_on else []
        if seen:
            raise ConfigError(f"--teacher {teacher.file}: its model(s) trained on {len(seen)} of this run's training "
                              f"records ({', '.join(map(repr, seen[:5]))}{', ...' if len(seen) > 5 else ''}): their "
                              "rows would teach the answers they were given; use out-of-fold rows (a CV folder)")
        values["teacher"] = teacher.probs[found].astype(np.float32)
        note["teacher"] = {"file": str(teacher.file), "rows": len(found), "alpha": distill.distill_alpha,
                           "temperature": distill.distill_temperature,
                           "rows_are": "out-of-fold" if teacher.held_out else
                           "of models that did not train on them" if teacher.trained_on is not None else
                           "of models whose training records are not known (a CSV)"}
    splits, label_rows = dict(data.splits), None
    if distill.pseudo_labels is not None:
        pseudo_pairs, soft, hard, note["pseudo_labels"] = _pseudo(config, data, classes)
        pairs += pseudo_pairs
        label_rows = np.arange(len(pairs)) >= len(rows)
        own = np.zeros((len(rows), classes), np.float32)
        values["label"] = np.concatenate([own, soft if distill.pseudo_targets == "soft" else hard])
        if "teacher" in values:  # a pseudo-labelled image's teacher is the pseudo source: target = its row
            values["teacher"] = np.concatenate([values["teacher"], soft])
        splits["train"] = list(dict.fromkeys(data.splits["train"] + data.splits["test"]))
    fields = ExampleFields.for_records(pairs, values, label_rows)
    return dataclasses.replace(data, splits=splits, select={**data.select, "train": tuple(pairs)}, fields=fields,
                               num_train=len(pairs), teaching=note)


def _pseudo(config: TrainConfig, data: RunData, classes: int) -> tuple[list, np.ndarray, np.ndarray, dict]:
    """The test images the pseudo-label source is sure of: their records, soft and hard targets, the note."""
    distill = config.distill
    if not data.splits["test"]:
        raise ConfigError(f"--pseudo-labels {distill.pseudo_labels}: the run has no test split to pseudo-label")
    source = read_teacher(distill.pseudo_labels, test=True, flag="--pseudo-labels")
    _check_classes(source, config, data, "--pseudo-labels")
    test = scan_records(data.splits["test"])
    row_of = {name: r for r, name in enumerate(source.ids)}
    known = [r for r, name in enumerate(map(str, test.ids)) if name in row_of]
    if not known:
        raise ConfigError(f"--pseudo-labels {source.file}: none of its {len(source.ids)} ids is a test image of the "
                          f"run (e.g. {source.ids[:1]} vs {list(test.ids[:1])})")
    probs = source.probs[[row_of[str(test.ids[r])] for r in known]].astype(np.float32)
    multi = config.task.task == "multilabel"
    sure = (np.maximum(probs, 1 - probs).min(1) if multi else probs.max(1)) >= distill.pseudo_threshold
    probs = probs[sure]
    hard = (probs > config.task.threshold if multi else np.eye(classes)[probs.argmax(1)]).astype(np.float32)
    counts = hard.sum(0).astype(int) if len(hard) else np.zeros(classes, int)
    names = named_classes(data.class_names) or tuple(map(str, range(classes)))
    note = {"file": str(source.file), "threshold": distill.pseudo_threshold, "targets": distill.pseudo_targets,
            "images": int(sure.sum()), "of": len(test), "per_class": {names[c]: int(n) for c, n in enumerate(counts)}}
    pairs = [test.pairs()[known[r]] for r in np.flatnonzero(sure)]
    return pairs, probs, hard, note


def describe(teaching: dict | None) -> str:
    """The plan line's part about the teacher and the pseudo-labels."""
    if not teaching:
        return ""
    parts = []
    if "teacher" in teaching:
        t = teaching["teacher"]
        parts.append(f"teacher {t['file']}: {t['rows']} rows {t['rows_are']}, alpha {t['alpha']:g}, "
                     f"temperature {t['temperature']:g}")
    if "pseudo_labels" in teaching:
        p = teaching["pseudo_labels"]
        classes = ", ".join(f"{name} {n}" for name, n in p["per_class"].items() if n)
        parts.append(f"pseudo-labels {p['file']}: {p['images']} of {p['of']} test images at p >= {p['threshold']:g} "
                     f"({p['targets']} targets; per class: {classes or 'none'})")
    return "; " + "; ".join(parts)
