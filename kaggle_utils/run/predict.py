"""Prediction, one path: :func:`predict` ``(steps, variables, batches) -> (ids, probabilities)``, and its files.

A run's test split, ``python -m kaggle_utils predict``, a CV's out-of-fold files and ensembles all call it;
``submission.csv`` and ``probabilities.csv`` are two views of its probabilities (:func:`write_predictions`).
An ensemble's :class:`Member` s (runs, checkpoints, a CV folder's folds) each predict at their own crop with
their own steps; only their classes must agree.
"""
import contextlib
import csv
import dataclasses
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import jax
import numpy as np
from flax import linen as nn

from .. import checkpoint, models
from ..config import ConfigError, TrainConfig
from ..data import Source, count_data_items, list_tfrecords, load_dataset
from ..data.convert import convert_test_split
from ..parallel import local_rows
from ..train import StepConfig, Steps, TrainState, inference_state, make_steps, make_task
from .build import build_model, eval_crop
from .data import find_splits, infer_image_size, named_classes, scan_test_ids
from .saved import checkpoint_file, run_config, run_variables
from .thresholds import THRESHOLDS_FILE, decide, min_labels
from .thresholds import read as read_thresholds

Records = Callable[[TrainConfig], tuple[list[str], int]]  # (config) -> (test split's TFRecords, their stored size)


def predict(steps: Steps, variables: dict | TrainState, batches: Iterable[dict], *, prefetch: int = 2
            ) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities ``[N, C]``) of the real examples of global host ``batches``, in order: every process
    feeds its rows of each batch, the step gathers the whole batch's probabilities back onto every device."""
    state = steps.put_state(variables if isinstance(variables, TrainState) else inference_state(variables))
    kept: list[tuple[np.ndarray, np.ndarray]] = []  # (ids, mask) of each batch, in feeding order

    def local(batches):
        for batch in batches:
            kept.append((np.asarray(batch["id"]), np.asarray(batch["mask"], bool)))
            yield local_rows(batch)

    outputs = [steps.predict(state, b) for b in steps.prefetch(local(batches), prefetch)]
    if not outputs:
        return np.array([], dtype=object), np.zeros((0, 0), np.float32)
    probs = [steps.get(o) for o in outputs]  # one sync, after every step is dispatched
    return np.concatenate([i[m] for i, m in kept]), np.concatenate([p[m] for p, (_, m) in zip(probs, kept)])


def labelled_probabilities(steps: Steps, variables: dict, batches: Iterable[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(probabilities, labels) of a labelled split's host ``batches`` (the whole split on every process), in order:
    what a multi-label run learns its thresholds on."""
    labels = []

    def numbered(batches):
        for batch in batches:
            labels.append(np.asarray(batch["label"])[np.asarray(batch["mask"], bool)])
            yield {"image": batch["image"], "id": np.arange(len(batch["mask"])), "mask": batch["mask"]}

    _, probs = predict(steps, variables, numbered(batches))
    return probs, np.concatenate(labels) if labels else np.zeros((0, probs.shape[-1]), np.float32)


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def predict_split(steps: Steps, variables: dict, files: list[str], config: TrainConfig, *, batch_size: int,
                  stored_size: int) -> tuple[list[str], np.ndarray]:
    """(ids, probabilities) of an unlabeled split's TFRecords at ``config``'s evaluation crop, in file order.

    Checked complete (the file names' counts) and unique, so a submission never misses or repeats an image;
    a corrupt test JPEG is predicted as libjpeg recovers it, with a warning: the submission needs its row.
    """
    files = list_tfrecords(files)
    with contextlib.closing(load_dataset(files, labeled=False, image_size=stored_size, batch_size=batch_size,
                                         crop=eval_crop(config, stored_size))) as dataset:
        ids, probs = predict(steps, variables, dataset)
    expected, texts = count_data_items(files), [_text(i) for i in ids]
    if len(texts) != expected:
        raise ValueError(f"predicted {len(texts)} test images but the file names of {len(files)} file(s) "
                         f"promise {expected}: refusing to write an incomplete submission")
    if len(set(texts)) != len(texts):
        dupes = sorted({t for t in texts if texts.count(t) > 1})[:5]
        raise ValueError(f"test ids repeat (e.g. {dupes}): refusing to write an ambiguous submission")
    return texts, probs


def load_run(path: str | Path, *, accept_changed: bool = False) -> tuple[nn.Module, dict, TrainConfig]:
    """``(model, variables, config)`` of a run folder (its best checkpoint) or one of its checkpoints: the evaluation
    variables (EMA weights where kept), checked leaf by leaf against the model the config builds; a file changed since
    its manifest was written only with ``accept_changed``."""
    file = checkpoint_file(Path(path))
    config = run_config(file)
    model = build_model(config)
    return model, run_variables(file, model, config, accept_changed=accept_changed), config


def prediction_steps(config: TrainConfig, model: nn.Module, *, tta: bool | None = None, mode: str | None = None
                     ) -> Steps:
    """The predict and evaluate steps of a saved run's model (``tta``, ``mode``: default the run's own)."""
    cfg = models.registered(config.model.name)
    step_config = StepConfig(num_classes=config.model.num_classes, mean=tuple(cfg.mean), std=tuple(cfg.std),
                             task=make_task(config.task), tta_flip=config.task.tta if tta is None else tta)
    return make_steps(model, None, step_config, mode=mode or config.loop.mode)


# --------------------------------------------------------------------------- ensembles


@dataclasses.dataclass(frozen=True)
class Member:
    """One model of an ensemble: a checkpoint, its model and variables, its run's config, its share of the mean."""

    path: Path
    model: nn.Module
    variables: dict
    config: TrainConfig
    weight: float
    file: Path | None = None  # the checkpoint read: path itself, or the run folder's best (else last) one


_FOLD = re.compile(r"fold(\d+)")


def expand_checkpoint(path: str | Path) -> list[Path]:
    """A run folder or checkpoint as itself; a CV folder (``fold{k}/`` run folders) as its folds, in k order."""
    path = Path(path)
    if not path.is_dir() or any((path / name).is_file() for name in ("best.msgpack", "last.msgpack")):
        return [path]
    folds = sorted((p for p in path.iterdir() if p.is_dir() and _FOLD.fullmatch(p.name)),
                   key=lambda p: int(_FOLD.fullmatch(p.name).group(1)))
    if not folds:
        raise checkpoint.CheckpointError(f"{path} holds no best.msgpack or last.msgpack, nor fold*/ run folders: "
                                         "not a run or CV folder of the kit")
    return folds


def load_members(checkpoints: Sequence[str | Path], weights: Sequence[float] | None = None, *,
                 accept_changed: bool = False) -> list[Member]:
    """Every model of ``checkpoints``, checked to agree on their classes, with ``weights`` (one per entry, default
    equal; a CV folder's folds share its weight) normalised to sum to 1; ``accept_changed``: :func:`load_run`'s."""
    if not checkpoints:
        raise ConfigError("give at least one --checkpoint")
    weights = [1.0] * len(checkpoints) if weights is None else list(weights)
    if len(weights) != len(checkpoints):
        raise ConfigError(f"--weights-per-checkpoint gives {len(weights)} weight(s) for {len(checkpoints)} "
                          "--checkpoint(s): give one per --checkpoint")
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise ConfigError(f"--weights-per-checkpoint {','.join(map(str, weights))}: weights must be finite, >= 0, "
                          "and not all 0")
    members = []
    for given, weight in zip(checkpoints, weights):
        paths = expand_checkpoint(given)
        for path in paths:
            try:
                model, variables, config = load_run(path, accept_changed=accept_changed)
            except checkpoint.ChangedCheckpointError as err:
                raise checkpoint.ChangedCheckpointError(f"{err}; --accept-changed-checkpoint uses it knowingly"
                                                        ) from None
            members.append(Member(path, model, variables, config, weight / len(paths) / sum(weights),
                                  file=checkpoint_file(path)))
    for member in members[1:]:
        _check_same_classes(members[0], member)
    return members


def _check_same_classes(first: Member, other: Member) -> None:
    """Probabilities are averaged by column: refuses members whose columns mean different classes."""
    a, b = first.config, other.config
    names = named_classes(a.data.class_names), named_classes(b.data.class_names)
    index = next((i for i in range(a.model.num_classes) if names[0][i:i + 1] != names[1][i:i + 1]), 0)
    show = lambda names: repr(names[index]) if index < len(names) else "unnamed"  # noqa: E731
    what = next((what for differs, what in (
        ((a.task.task == "multilabel") != (b.task.task == "multilabel"),
         "one is multi-label (independent sigmoid probabilities), the other not (a softmax over the classes)"),
        (a.model.num_classes != b.model.num_classes, f"{a.model.num_classes} vs {b.model.num_classes} classes"),
        (names[0] != names[1], f"class {index} is {show(names[0])} vs {show(names[1])}")) if differs), None)
    if what:
        raise ConfigError(f"--checkpoint {first.path} and {other.path} disagree ({what}): their probabilities "
                          "cannot be averaged")


def ensemble_thresholds(checkpoints: Sequence[str | Path], members: Sequence[Member],
                        weights: Sequence[float] | None = None) -> tuple[np.ndarray, str]:
    """A multi-label ensemble's thresholds and where they come from: each ``--checkpoint``'s own (a run's, learnt on
    its validation split; a CV folder's, on its out-of-fold probabilities; else its ``--threshold``), averaged with
    the ``weights``."""
    config, kept = members[0].config, []
    for given in checkpoints:
        folder = Path(given) if Path(given).is_dir() else Path(given).parent
        found = read_thresholds(folder, config.data.class_names)
        if found is None:
            own = run_config(checkpoint_file(expand_checkpoint(given)[0])).task.threshold
            if own == "auto":
                raise ConfigError(f"--checkpoint {given}: its run learns its thresholds after training, but "
                                  f"{folder / THRESHOLDS_FILE} is missing (the run did not finish?): give --threshold")
            found = np.full(config.model.num_classes, float(own))
        kept.append(found)
    share = np.asarray(weights if weights is not None else [1.0] * len(kept), np.float64)
    mean = np.tensordot(share / share.sum(), np.stack(kept), axes=1)
    where = "the run's own" if len(kept) == 1 else f"the mean of the {len(kept)} checkpoints' own"
    return mean, f"{where} ({', '.join(f'{t:.2f}' for t in mean)})"


@contextlib.contextmanager
def open_test_split(*, data_dir: str | Path | None = None, source: Source | None = None) -> Iterator[Records]:
    """``records(config) -> (files, stored size)``: a records folder's ``test/`` split, or ``source`` converted
    (once per stored size, as a run on it stored its own: ``--store-size``; a run from before it: ``--image-size``)
    into a temporary folder."""
    if (data_dir is None) == (source is None):
        raise ConfigError("give the test images as --data-dir (TFRecords with a test/ split) or as --test-source "
                          "(an image folder or a CSV of ids), one of them")
    if data_dir is not None:
        files = find_splits(data_dir, need_labels=False)["test"]
        scan_test_ids(files)
        stored = infer_image_size(files)
        yield lambda config: (files, stored or config.model.image_size)
        return
    with tempfile.TemporaryDirectory(prefix="kaggle_utils_test_") as tmp:
        converted: dict[int, list[str]] = {}

        def records(config: TrainConfig) -> tuple[list[str], int]:
            size = config.model.image_size if config.data.store_size == "auto" else config.data.store_size
            if size not in converted:
                converted[size] = convert_test_split(source, Path(tmp) / str(size), image_size=size)
            return converted[size], size

        yield records


def predict_ensemble(members: Sequence[Member], records: Records, *, batch_size: int, tta: bool | None = None,
                     mode: str = "jit") -> tuple[list[str], np.ndarray]:
    """(ids, the members' weighted mean probabilities); ``tta=None``: each run's own ``--tta``. Members of one model
    and task (a CV folder's folds) share compiled steps."""
    ids, total, compiled = None, None, {}
    for member in members:
        flip = member.config.task.tta if tta is None else tta
        key = (member.config.model, member.config.task, flip)
        if key not in compiled:
            compiled[key] = prediction_steps(member.config, member.model, tta=flip, mode=mode)
        files, stored = records(member.config)
        member_ids, probs = predict_split(compiled[key], member.variables, files, member.config,
                                          batch_size=batch_size, stored_size=stored)
        if ids is not None and member_ids != ids:
            raise ValueError(f"{member.path} predicted the test images in another order than {members[0].path}")
        ids, total = member_ids, member.weight * probs + (0 if total is None else total)
    return ids, total


# --------------------------------------------------------------------------- the files: views of the probabilities


def read_probabilities(path: str | Path) -> tuple[list[str], list[str], np.ndarray]:
    """``(ids, class columns, probabilities [N, C])`` of a ``probabilities.csv`` (:func:`write_predictions`'s, or any
    CSV of an id and a column per class): a teacher's rows (``--teacher``, ``--pseudo-labels``)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            header, *rows = list(csv.reader(f)) or [[]]
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror})") from None
    if len(header) < 2 or any(len(row) != len(header) for row in rows):
        raise ConfigError(f"{path} is not a probabilities CSV: an id column, then one column per class, in every row")
    try:
        probs = np.array([[float(v) for v in row[1:]] for row in rows], np.float64).reshape(len(rows), len(header) - 1)
    except ValueError:
        raise ConfigError(f"{path}: a row whose class columns are not all numbers") from None
    return [row[0] for row in rows], header[1:], probs


BLEND_RECORD = "predict.json"  # beside a predict's files: the checkpoints they came from


def write_blend_record(out_dir: str | Path, members: Sequence[Member]) -> Path:
    """``predict.json``: the checkpoints a prediction averaged and their weights, so that its probabilities as a
    teacher say which records their models trained on."""
    path = Path(out_dir) / BLEND_RECORD
    if jax.process_index() == 0:
        record = {"checkpoints": [str(Path(m.file or m.path).resolve()) for m in members],
                  "weights": [m.weight for m in members]}
        checkpoint.atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    return path


def blend_checkpoints(folder: str | Path) -> list[Path] | None:
    """The checkpoints :func:`write_blend_record` recorded in ``folder`` (None: no record)."""
    try:
        return [Path(p) for p in json.loads((Path(folder) / BLEND_RECORD).read_text())["checkpoints"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write_predictions(out_dir: str | Path, ids: Sequence[str], probs: np.ndarray, config: TrainConfig,
                      *, probabilities_name: str = "probabilities.csv", thresholds: np.ndarray | None = None
                      ) -> tuple[Path, Path]:
    """``submission.csv`` and ``probabilities.csv`` in ``config``'s columns and class names (process 0, atomic).

    The label is the argmax (a class name, else its index); for ``--task multilabel`` every class above its
    threshold (``thresholds``, one per class, else ``--threshold``), at least ``--min-labels`` of them,
    space-separated. ``probabilities.csv``: the id, then a column per class (for blending).
    """
    out_dir, data = Path(out_dir), config.data
    probs = np.asarray(probs, np.float32)
    if probs.ndim != 2 or len(ids) != len(probs):
        raise ValueError(f"{len(ids)} ids but probabilities of shape {probs.shape}")
    names = list(data.class_names) or [str(i) for i in range(probs.shape[1])]
    if len(names) != probs.shape[1]:
        raise ValueError(f"{len(names)} class names for {probs.shape[1]} probability columns")
    id_column = data.id_column or "id"
    if config.task.task == "multilabel":
        if thresholds is None and config.task.threshold == "auto":
            raise ValueError("--threshold auto: give the thresholds learnt on the validation split (thresholds.json)")
        chosen = decide(probs, config.task.threshold if thresholds is None else thresholds, min_labels(config))
        labels = [" ".join(names[c] for c in np.flatnonzero(row)) for row in chosen]
    else:
        labels = [names[c] for c in probs.argmax(-1)]
    submission, probabilities = out_dir / "submission.csv", out_dir / probabilities_name
    if jax.process_index() == 0:
        checkpoint.atomic_write_csv(submission, [id_column, data.label_column or "label"], zip(map(_text, ids), labels))
        checkpoint.atomic_write_csv(probabilities, [id_column, *names],
                                    ([_text(i), *map(str, row)] for i, row in zip(ids, probs)))
    return submission, probabilities
