"""``cross_validate(config, out, folds=K)``: K ordinary runs over one pool of records, and their out-of-fold score.

The pool is the run data's train + val records. Fold k (``OUT/fold{k}/``, a run folder like any other) is
:func:`train` on the other folds' records, chosen by (file, record index) inside ``tf.data``, never by rewriting
the records; its ``oof.csv``, written last, makes it finished, so ``--resume`` skips it. Records are named by
their ``id`` feature when every pool record has a unique one, else by ``split/file#index``.

The folds (``OUT/folds.csv``: stratified by label, seeded, group-aware with ``--fold-group``) are a pure function
of (labels, groups, K, seed): ``--resume`` and ``--only-folds`` recompute them and refuse a change, which would
train fold 1 on examples fold 0 validated on and make the out-of-fold score optimistic without saying so.
Groups (a patient, a video) live in no TFRecord: they are read from a CSV keyed by the run's id column (a CSV
``--source``, or ``--fold-group-file``); every fault of that file is refused, named, before anything is written.

Size: one concern, a CV folder: the folds and the runs over them are written, resumed and scored together
against one assignment, and most of the module is the checks that keep the two consistent.
"""
import contextlib
import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .. import checkpoint
from ..config import ConfigError, TrainConfig
from ..data.convert import iterative_stratification, source_from_spec
from ..data.tfrecords import scan_records
from ..report import read_metrics
from ..train import Hook, Task
from . import thresholds
from .build import checkpoint_file, eval_dataset, make_task, run_config
from .data import RunData, commit_conversion, data_root, open_data
from .predict import load_members, load_run, predict, predict_ensemble, prediction_steps, write_predictions
from .resolve import check_config, resolve
from .trainer import RunResult, train

FOLDS_FILE = "folds.csv"
FOLD_OOF = "oof.csv"  # in fold{k}/: its held-out predictions; present = the fold is finished
CV_FILES = ("oof.csv", "oof.npy", "cv.json", "submission.csv", "test_probabilities.csv", thresholds.THRESHOLDS_FILE)


@dataclasses.dataclass(frozen=True)
class CVResult:
    out: Path
    trained: dict[int, RunResult]  # the folds trained by this call
    scores: dict | None  # cv.json's content; None while some fold is unfinished
    remaining: tuple[int, ...]  # folds not finished yet (e.g. left out by only_folds)


@dataclasses.dataclass(frozen=True)
class Pool:
    """The labelled records of a CV: where each lies, its label, its name in folds.csv, its fold and group."""

    files: np.ndarray
    indices: np.ndarray
    labels: np.ndarray  # int [N], or float32 multi-hot [N, C] (multi-label records)
    keys: np.ndarray
    folds: np.ndarray
    class_names: tuple[str, ...] = ()  # how a multi-label row is written in oof.csv (else: class indices)
    groups: np.ndarray | None = None  # --fold-group's group of each record

    def label_text(self, row: int) -> str:
        """oof.csv's label: the class index, or a multi-label row's classes, space-separated (names if known)."""
        if self.labels.ndim == 1:
            return str(self.labels[row])
        return " ".join(self.class_names[c] if self.class_names else str(c)
                        for c in np.flatnonzero(self.labels[row] > 0.5))

    def pairs(self, rows) -> tuple[tuple[str, int], ...]:
        return tuple((str(self.files[r]), int(self.indices[r])) for r in np.flatnonzero(rows))


def cross_validate(config: TrainConfig, out: str | Path, *, folds: int, only_folds: Sequence[int] | None = None,
                   fold_group: str | None = None, fold_group_file: str | Path | None = None, resume: bool = False,
                   overwrite: bool = False, progress: bool = True, hooks: Sequence[Hook] = ()) -> CVResult:
    """Trains the folds of ``out`` not finished yet (``only_folds``: those of them), then the CV's files.

    ``config`` is every fold's; ``resume`` goes on with a CV folder (else one is refused), ``overwrite`` starts
    it again. ``fold_group``: a column whose groups stay in one fold (its CSV: ``fold_group_file``).
    """
    out = Path(out)
    chosen = _check_args(folds, only_folds, resume, overwrite)
    check_config(config)
    if (out / FOLDS_FILE).is_file() and not (resume or overwrite):
        raise ConfigError(f"--out {out} already holds a CV ({out / FOLDS_FILE}): pass --resume to go on with it "
                          "(finished folds are skipped) or --overwrite to start it again")
    groups_at = group_file(config, fold_group, fold_group_file)
    if groups_at is not None and config.data.source is not None:
        _check_source_groups(config, groups_at, fold_group)  # before the source is converted into OUT/data
    main, trained = jax.process_index() == 0, {}
    with data_root(config, out) as root:  # --source converted once into OUT/data, the folds' --data-dir
        data = commit_conversion(open_data(config, root), out)
        fold_config = config if config.data.source is None else config.replace(
            source=None, test_source=None, image_dir=None, test_image_dir=None, tfds_data_dir=None,
            data_dir=str(data.root.resolve()))
        groups = None if groups_at is None else read_groups(groups_at, fold_group, data.columns[0])
        pool = _pool(data, folds, config.seed, groups)
        if chosen:  # what a fold's run would refuse from the data, refused before the CV's own files are written;
            # --batch-per-device auto is searched here once, for every fold
            _, plan = resolve(fold_config, _fold_data(data, pool, chosen[0]))
            if fold_config.data.batch_per_device == "auto":
                fold_config = fold_config.replace(batch_per_device=plan.per_device_batch, memory_budget=None)
        out.mkdir(parents=True, exist_ok=True)
        if main:
            settle_folds(out, list(pool.keys), pool.folds, k=folds, seed=config.seed, overwrite=overwrite,
                         groups=None if groups is None else (groups.column, pool.groups))
            if overwrite:  # every fold is unfinished again (each fold's run is replaced as it is trained)
                for path in [*out.glob(f"fold*/{FOLD_OOF}"), *(out / name for name in CV_FILES)]:
                    path.unlink(missing_ok=True)
        for k in chosen:
            fold_out = out / f"fold{k}"
            if (fold_out / FOLD_OOF).is_file():
                print(f"fold {k}: finished earlier ({fold_out / FOLD_OOF}), skipped")
                continue
            fold_data = _fold_data(data, pool, k)
            go_on = resume and (fold_out / "last.msgpack").is_file()  # else a fold killed before it saved anything
            print(f"fold {k} of {folds}: {fold_data.num_train} training, {int((pool.folds == k).sum())} held-out "
                  f"records -> {fold_out}" + (" (resumed)" if go_on else ""))
            trained[k] = train(fold_config, fold_out, data=fold_data, resume=go_on,
                               overwrite=overwrite or (resume and not go_on), progress=progress, hooks=hooks)
            _write_fold_oof(fold_out, k, pool, fold_data)
        remaining = tuple(k for k in range(folds) if not (out / f"fold{k}" / FOLD_OOF).is_file())
        scores = None if remaining else _finish(out, folds, pool, data, make_task(fold_config))
    return CVResult(out, trained, scores, remaining)


def _check_args(folds: int, only_folds: Sequence[int] | None, resume: bool, overwrite: bool) -> list[int]:
    if folds < 2:
        raise ConfigError(f"--folds {folds}: cross-validation needs at least 2 folds")
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other")
    chosen = list(range(folds)) if only_folds is None else sorted(set(only_folds))
    outside = [k for k in chosen if not 0 <= k < folds]
    if outside:
        raise ConfigError(f"--only-folds {','.join(map(str, only_folds))}: fold {outside[0]} is not in 0..{folds - 1}")
    return chosen


def _check_source_groups(config: TrainConfig, path: Path, column: str) -> None:
    """Every image of ``--source`` has a group in ``path`` (a CSV source's own rows have, each, by its id)."""
    data = config.data
    groups = read_groups(path, column, data.id_column or "id")
    if path.resolve() != Path(data.source).resolve():
        source = source_from_spec(data.source, image_dir=data.image_dir, id_column=groups.id_column,
                                  label_column=data.label_column or "label", tfds_data_dir=data.tfds_data_dir)
        groups.lookup(source.ids, f"images of --source {data.source}")


def _pool(data: RunData, k: int, seed: int, groups: "FoldGroups | None" = None) -> Pool:
    records = scan_records(data.splits["train"] + data.splits["val"])
    labels = records.multi_hot(data.max_label + 1) if data.multi_label else records.labels
    ids = records.ids
    if not (all(ids) and len(set(ids)) == len(ids)):  # no (unique) id feature: named by where they lie
        if groups is not None:
            raise ConfigError(f"--fold-group {groups.column}: the records in {data.root} carry no unique 'id' feature "
                              f"to match {groups.path} by (the digits sample has none; records converted by an older "
                              "version of the kit: convert them again)")
        ids = np.array([f"{Path(f).parent.name}/{Path(f).name}#{i}" for f, i in zip(records.files, records.indices)])
    group_of = None if groups is None else groups.lookup(list(ids), f"records of {data.root}")
    return Pool(records.files, records.indices, labels, ids, assign_folds(labels, k, seed, groups=group_of),
                data.class_names, group_of)


def _fold_data(data: RunData, pool: Pool, k: int) -> RunData:
    """Fold k's view of the pool: trains on the other folds' records, validates on its own, out of the same files."""
    files = data.splits["train"] + data.splits["val"]
    return dataclasses.replace(data, splits={**data.splits, "train": files, "val": files},
                               select={"train": pool.pairs(pool.folds != k), "val": pool.pairs(pool.folds == k)},
                               num_train=int((pool.folds != k).sum()))


def _write_fold_oof(fold_out: Path, k: int, pool: Pool, fold_data: RunData) -> None:
    """Fold k's best checkpoint on its held-out records -> ``fold{k}/oof.csv`` (id, label, fold, probabilities)."""
    model, variables, config = load_run(fold_out)
    with contextlib.closing(eval_dataset(config, fold_data, "val", batch_size=config.data.batch_size,
                                         with_records=True)) as batches:
        records, probs = predict(prediction_steps(config, model), variables,
                                 ({"image": b["image"], "id": b["record"], "mask": b["mask"]} for b in batches))
    row_of = {f"{f}#{i}": r for r, (f, i) in enumerate(zip(pool.files, pool.indices))}
    rows = [row_of[r.decode("utf-8")] for r in records]
    if sorted(rows) != list(np.flatnonzero(pool.folds == k)):
        raise ConfigError(f"fold {k}: predicted {len(rows)} of its {int((pool.folds == k).sum())} held-out records "
                          "(unreadable ones skipped?): the out-of-fold file would miss some")
    _write_oof(fold_out / FOLD_OOF, pool, rows, probs)


def _write_oof(path: Path, pool: Pool, rows: Sequence[int], probs: np.ndarray) -> None:
    if jax.process_index() == 0:
        checkpoint.atomic_write_csv(path, ["id", "label", "fold", *range(probs.shape[1])],
                                    ([pool.keys[r], pool.label_text(r), pool.folds[r], *map(float, row)]
                                     for r, row in zip(rows, probs)))


def _finish(out: Path, k: int, pool: Pool, data: RunData, task: Task) -> dict:
    """Pooled ``oof.csv`` / ``oof.npy``, ``cv.json``, and the fold models' mean on the test split."""
    row_of = {key: r for r, key in enumerate(pool.keys)}
    probs = None
    for fold in range(k):  # each fold's oof.csv: id, label, fold, then the probabilities
        with open(out / f"fold{fold}" / FOLD_OOF, newline="") as f:
            rows = list(csv.reader(f))[1:]
        probs = np.zeros((len(pool.keys), len(rows[0]) - 3)) if probs is None else probs
        probs[[row_of[r[0]] for r in rows]] = [[float(v) for v in r[3:]] for r in rows]
    scores = cv_scores(out, k, pool.labels, pool.folds, probs, task)
    decisions = _oof_thresholds(out, pool, probs, data)
    if jax.process_index() == 0:
        _write_oof(out / "oof.csv", pool, range(len(pool.keys)), probs)
        buffer = io.BytesIO()
        np.save(buffer, probs)
        checkpoint.atomic_write_bytes(out / "oof.npy", buffer.getvalue())
        checkpoint.atomic_write_text(out / "cv.json", json.dumps(scores, indent=2) + "\n")
    if data.splits["test"]:
        members = load_members([out / f"fold{f}" for f in range(k)])
        ids, test_probs = predict_ensemble(members, lambda config: (data.splits["test"], data.stored_size),
                                           batch_size=members[0].config.data.batch_size,
                                           mode=members[0].config.loop.mode)
        write_predictions(out, ids, test_probs, members[0].config, probabilities_name="test_probabilities.csv",
                          thresholds=decisions)
    return scores


def _oof_thresholds(out: Path, pool: Pool, probs: np.ndarray, data: RunData) -> np.ndarray | None:
    """A multi-label CV's thresholds, learnt on its out-of-fold probabilities (``OUT/thresholds.json``): the folds'
    mean on the test split is submitted with them. None for other tasks."""
    config = run_config(checkpoint_file(out / "fold0"))  # resolved: --min-labels chosen from the data
    if config.task.task != "multilabel":
        return None
    labels = np.pad(pool.labels, ((0, 0), (0, probs.shape[1] - pool.labels.shape[1])))
    record = thresholds.settle(config, probs, labels, config.data.class_names, learnt_on="out-of-fold probabilities")
    if jax.process_index() == 0:
        thresholds.write(out, record)
        print(thresholds.describe(record))
    return np.array(list(record["thresholds"].values()))


def cv_scores(out: Path, k: int, labels: np.ndarray, folds: np.ndarray, probs: np.ndarray, task: Task) -> dict:
    """Each fold's best row and held-out scores, their mean and sample std (ddof 1, as ``report`` prints it),
    and the pooled out-of-fold scores: the task's own metrics of the saved probabilities."""
    if labels.ndim == 2:  # multi-hot rows: --num-classes may be wider than the classes found
        labels = np.pad(labels, ((0, 0), (0, probs.shape[1] - labels.shape[1])))

    def score(rows: np.ndarray) -> dict:
        logits = task.logits(jnp.asarray(probs[rows], jnp.float32))
        sums = task.metric_sums(logits, jnp.asarray(labels[rows]), jnp.ones(int(rows.sum()), bool), full=True)
        return {**task.finish(jax.device_get(sums)), "examples": int(rows.sum())}

    per_fold = [{"fold": f, "best": read_metrics(out / f"fold{f}").get("best"), **score(folds == f)}
                for f in range(k)]
    names = [name for name in per_fold[0] if name not in ("fold", "best", "examples")]
    summary = {name: {"mean": float(np.mean([p[name] for p in per_fold])),
                      "std": float(np.std([p[name] for p in per_fold], ddof=1))} for name in names}
    return {"folds": per_fold, "fold_mean_std": summary, "oof": score(np.ones(len(labels), bool))}


# --------------------------------------------------------------------------- the folds


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
