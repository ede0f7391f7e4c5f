"""Prediction: one path from (checkpoints, test images, TTA) to ids and mean class probabilities.

``submission.csv`` (argmax, in the run's columns and class names; for a multi-label run the classes
whose probability exceeds its ``--threshold``, space-separated) and ``probabilities.csv``
(id + one column per class, for blending) are both written from those probabilities, by a run
(:func:`~kaggle_utils.run.train`) and by ``predict`` alike.

An ensemble is a list of :class:`Member` s: any run folders or checkpoints the kit wrote, and
cross-validation folders (``OUT/fold{k}/``, each a run folder: all of its folds). Members may be
different models at different sizes: each predicts with its own steps, reading the test images
at its own crop; only their classes must agree, since their probabilities are averaged column
by column.

The test images are a records folder's ``test/`` split, or a source (an image folder, a CSV of
ids) converted to TFRecords in a temporary folder at each member's image size, as a run on that
source stores its test split: one reading path, the one a run's own submission took.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import tempfile
from pathlib import Path
from typing import Callable, Iterator, Sequence

import jax
import numpy as np

from .. import checkpoint
from ..config import ConfigError, TrainConfig
from .build import eval_transform
from .data import find_splits, infer_image_size, named_classes, scan_test_ids
from .resolve import make_task
from .saved import checkpoint_file, load_run

__all__ = ["Member", "expand_checkpoint", "load_members", "open_test_split", "predict_ensemble", "predict_member",
           "predicted_labels", "write_predictions"]

_FOLD = re.compile(r"fold(\d+)")
# (config) -> (TFRecord files of the test split, the size they are stored at)
Records = Callable[[TrainConfig], tuple[list[str], int]]


@dataclasses.dataclass(frozen=True)
class Member:
    """One model of an ensemble: a checkpoint, its model and variables, its run's config, its share of the mean."""

    path: Path
    model: object
    variables: dict
    config: TrainConfig
    weight: float
    file: Path | None = None  # the checkpoint read: path itself, or the run folder's best (else last) one


def _is_run(folder: Path) -> bool:
    return any((folder / name).is_file() for name in ("best.msgpack", "last.msgpack"))


def expand_checkpoint(path: str | Path) -> list[Path]:
    """A run folder or checkpoint as itself; a CV folder (``fold{k}/`` run folders) as its folds, in k order."""
    path = Path(path)
    if not path.is_dir() or _is_run(path):
        return [path]
    folds = sorted((p for p in path.iterdir() if p.is_dir() and _FOLD.fullmatch(p.name)),
                   key=lambda p: int(_FOLD.fullmatch(p.name).group(1)))
    if not folds:
        raise checkpoint.CheckpointError(f"{path} holds no best.msgpack or last.msgpack, nor fold*/ run folders: "
                                         "not a run or CV folder of the kit")
    return folds


def load_members(checkpoints: Sequence[str | Path], weights: Sequence[float] | None = None) -> list[Member]:
    """Every model of ``checkpoints``, checked to agree on their classes, with weights summing to 1.

    ``weights``: one per entry of ``checkpoints`` (default: equal); the folds of a CV folder
    share its weight equally, so a CV folder counts as one model of the blend.
    """
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
            model, variables, config = load_run(path)
            members.append(Member(path, model, variables, config, weight / len(paths) / sum(weights),
                                  file=checkpoint_file(path)))
    for member in members[1:]:
        _check_same_classes(members[0], member)
    return members


def _check_same_classes(first: Member, other: Member) -> None:
    """Probabilities are averaged by column: refuses members whose columns mean different classes."""
    a, b = first.config.model.num_classes, other.config.model.num_classes
    multi = [m.config.task.task == "multilabel" for m in (first, other)]
    what = None
    if multi[0] != multi[1]:
        what = "one is multi-label (independent sigmoid probabilities), the other not (a softmax over the classes)"
    elif a != b:
        what = f"{a} vs {b} classes"
    else:
        names_a, names_b = named_classes(first.config.data.class_names), named_classes(other.config.data.class_names)
        if names_a != names_b:
            index = next(i for i in range(a) if names_a[i:i + 1] != names_b[i:i + 1])
            show = lambda names: repr(names[index]) if names else "unnamed"  # noqa: E731
            what = f"class {index} is {show(names_a)} vs {show(names_b)}"
    if what:
        raise ConfigError(f"--checkpoint {first.path} and {other.path} disagree ({what}): their probabilities "
                          "cannot be averaged")


@contextlib.contextmanager
def open_test_split(*, data_dir: str | Path | None = None, source=None) -> Iterator[Records]:
    """``records(config) -> (files, stored size)``: a records folder's ``test/`` split, or ``source`` converted.

    ``source`` (an unlabeled :class:`~kaggle_utils.data.Source`) is converted once per image size,
    into a temporary folder removed on exit, at the run's ``--image-size``: where a run on that
    source stored its test split.
    """
    if (data_dir is None) == (source is None):
        raise ConfigError("give the test images as --data-dir (TFRecords with a test/ split) or as --test-source "
                          "(an image folder or a CSV of ids), one of them")
    if data_dir is not None:
        files = find_splits(data_dir, need_labels=False)["test"]
        scan_test_ids(files)
        stored = infer_image_size(files)
        yield lambda config: (files, stored or config.model.image_size)
        return
    from ..data.convert import convert_test_split

    with tempfile.TemporaryDirectory(prefix="kaggle_utils_test_") as tmp:
        converted: dict[int, list[str]] = {}

        def records(config: TrainConfig):
            size = config.model.image_size
            if size not in converted:
                converted[size] = convert_test_split(source, Path(tmp) / str(size), image_size=size)
            return converted[size], size

        yield records


def predict_member(steps, variables, files: list[str], config: TrainConfig, *, batch_size: int,
                   stored_size: int) -> tuple[list[str], np.ndarray]:
    """(ids, probabilities) of a test split as ``config`` evaluates it: its crop of images stored at ``stored_size``."""
    from ..inference import predict_records

    return predict_records(steps, variables, files, image_size=stored_size, batch_size=batch_size,
                           crop=eval_transform(config, stored_size))


def _prediction_steps(config: TrainConfig, model, *, tta: bool, mode: str):
    from ..models import registered
    from ..train import StepConfig, make_steps

    cfg = registered(config.model.name)
    step_config = StepConfig(num_classes=config.model.num_classes, mean=tuple(cfg.mean), std=tuple(cfg.std),
                             task=make_task(config), tta_flip=tta)
    return make_steps(model, None, step_config, mode=mode)


def predict_ensemble(members: Sequence[Member], records: Records, *, batch_size: int, tta: bool | None = None,
                     mode: str = "jit") -> tuple[list[str], np.ndarray]:
    """(ids, the members' probabilities averaged with their weights); ``tta=None``: each run's own ``--tta``.

    Members of one model and task (the folds of a CV folder) share compiled steps.
    """
    ids, total, compiled = None, None, {}
    for member in members:
        flip = member.config.task.tta if tta is None else tta
        key = (member.config.model, member.config.task, flip)
        if key not in compiled:
            compiled[key] = _prediction_steps(member.config, member.model, tta=flip, mode=mode)
        files, stored = records(member.config)
        member_ids, probs = predict_member(compiled[key], member.variables, files, member.config,
                                           batch_size=batch_size, stored_size=stored)
        if ids is not None and member_ids != ids:
            raise ValueError(f"{member.path} predicted the test images in another order than {members[0].path}")
        ids, total = member_ids, member.weight * probs + (0 if total is None else total)
    return ids, total


def predicted_labels(probs: np.ndarray, config: TrainConfig) -> list:
    """Each row's class (argmax), or for a multi-label run its classes above ``config``'s threshold (possibly none)."""
    if config.task.task == "multilabel":
        return [np.flatnonzero(row > config.task.threshold) for row in probs]
    return list(probs.argmax(-1))


def write_predictions(out_dir: str | Path, ids: Sequence[str], probs: np.ndarray, config: TrainConfig
                      ) -> tuple[Path, Path]:
    """``submission.csv`` and ``probabilities.csv`` in ``config``'s columns and class names (process 0).

    The submission's label is the argmax, or for ``--task multilabel`` every class whose probability
    exceeds ``--threshold`` (:func:`predicted_labels`).
    """
    from ..inference import write_probabilities, write_submission

    out_dir = Path(out_dir)
    data = config.data
    id_column, label_column = data.id_column or "id", data.label_column or "label"
    submission, probabilities = out_dir / "submission.csv", out_dir / "probabilities.csv"
    if jax.process_index() == 0:
        write_submission(submission, ids, predicted_labels(probs, config), columns=(id_column, label_column),
                         class_names=data.class_names)
        write_probabilities(probabilities, ids, probs, id_column=id_column, class_names=data.class_names)
    return submission, probabilities
