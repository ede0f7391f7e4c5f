"""``cross_validate(config, out, folds=K)``: K ordinary runs over one pool of records, and their out-of-fold score.

The pool is the run data's train + val records. Fold k (``OUT/fold{k}/``, a run folder like any other) is
:func:`train` on the other folds' records, chosen by (file, record index) inside ``tf.data``, never by rewriting
the records; its ``oof.csv``, written last, makes it finished, so ``--resume`` skips it. Records are named by
their ``id`` feature when every pool record has a unique one, else by ``split/file#index``.

The folds (``OUT/folds.csv``) and the out-of-fold files are :mod:`.folds`'s: recomputed by ``--resume`` and
``--only-folds`` and refused where they changed.
"""
import contextlib
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
from ..data.convert import source_from_spec
from ..data.tfrecords import scan_records
from ..report import read_metrics
from ..train import Hook, Task
from . import thresholds
from .build import eval_dataset
from .data import RunData, commit_conversion, data_root, open_data, record_names
from .folds import (FOLD_OOF, FOLDS_FILE, FoldGroups, assign_folds, group_file, read_groups, read_oof, settle_folds,
                    write_oof)
from .predict import load_members, load_run, predict, predict_ensemble, prediction_steps, write_predictions
from .resolve import check_config, resolve, run_task
from .saved import checkpoint_file, run_config
from .trainer import RunResult, recorded_model, train

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
                   overwrite: bool = False, progress: bool = True, hooks: Sequence[Hook] = (), task: Task | None = None,
                   tx=None, variables: dict | None = None) -> CVResult:
    """Trains the folds of ``out`` not finished yet (``only_folds``: those of them), then the CV's files.

    ``config`` is every fold's; ``resume`` goes on with a CV folder (else one is refused), ``overwrite`` starts
    it again. ``fold_group``: a column whose groups stay in one fold (its CSV: ``fold_group_file``). ``task``,
    ``tx``, ``variables``: every fold's, as :func:`~kaggle_utils.run.train` takes and records them.
    """
    out = Path(out)
    chosen = _check_args(folds, only_folds, resume, overwrite)
    if resume:  # a model of yours registered by the process that started the CV: found where its folds recorded it
        recorded_model(config, *sorted(out.glob("fold*")))
    config, task = run_task(config, task)
    check_config(config, task)
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
            _, plan = resolve(fold_config, _fold_data(data, pool, chosen[0]), task)
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
            trained[k] = train(fold_config, fold_out, data=fold_data, resume=go_on, task=task, tx=tx,
                               variables=variables, overwrite=overwrite or (resume and not go_on), progress=progress,
                               hooks=hooks)
            _write_fold_oof(fold_out, k, pool, fold_data)
        remaining = tuple(k for k in range(folds) if not (out / f"fold{k}" / FOLD_OOF).is_file())
        scores = None if remaining else _finish(out, folds, pool, data, task)
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
    ids, by_id = record_names(records)
    if not by_id:
        if groups is not None:
            raise ConfigError(f"--fold-group {groups.column}: the records in {data.root} carry no unique 'id' feature "
                              f"to match {groups.path} by (the digits sample has none; records converted by an older "
                              "version of the kit: convert them again)")
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
    write_oof(path, [pool.keys[r] for r in rows], [pool.label_text(r) for r in rows], pool.folds[list(rows)], probs)


def _finish(out: Path, k: int, pool: Pool, data: RunData, task: Task) -> dict:
    """Pooled ``oof.csv`` / ``oof.npy``, ``cv.json``, and the fold models' mean on the test split."""
    row_of = {key: r for r, key in enumerate(pool.keys)}
    probs = None
    for fold in range(k):
        ids, _, fold_probs = read_oof(out / f"fold{fold}" / FOLD_OOF)
        probs = np.zeros((len(pool.keys), fold_probs.shape[1])) if probs is None else probs
        probs[[row_of[i] for i in ids]] = fold_probs
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
