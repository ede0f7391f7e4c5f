"""Predict an unlabeled split in file order; write ``submission.csv`` and ``probabilities.csv`` from the result.

Every process reads the whole split in order and keeps its own rows of each global batch
(:func:`~kaggle_utils.parallel.local_rows`); the predict step gathers the probabilities of
the whole global batch back onto every device. So the ids of a batch (known to every process)
line up with its predictions, and process 0 can write the file alone.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from . import checkpoint
from .parallel import local_rows
from .train.state import TrainState, inference_state
from .train.steps import Steps

__all__ = ["predict", "predict_records", "write_probabilities", "write_submission"]


def predict(steps: Steps, variables: dict | TrainState, batches: Iterable[dict], *, prefetch: int = 2
            ) -> tuple[np.ndarray, np.ndarray]:
    """(ids, probabilities ``[N, C]``) of the real examples of global host ``batches``, in order."""
    state = variables if isinstance(variables, TrainState) else inference_state(variables)
    state = steps.put_state(state)
    kept: list[tuple[np.ndarray, np.ndarray]] = []  # (ids, mask) of each batch, in feeding order

    def local(batches):
        for batch in batches:
            kept.append((np.asarray(batch["id"]), np.asarray(batch["mask"], bool)))
            yield local_rows(batch)

    outputs = [steps.predict(state, b) for b in steps.prefetch(local(batches), prefetch)]
    if not outputs:
        return np.array([], dtype=object), np.zeros((0, 0), np.float32)
    probs = [steps.get(o) for o in outputs]  # one sync, after every step is dispatched
    ids = np.concatenate([i[m] for i, m in kept])
    return ids, np.concatenate([p[m] for p, (_, m) in zip(probs, kept)])


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, (bytes, np.bytes_)) else str(value)


def write_submission(path: str | Path, ids: Sequence, labels: Sequence, *,
                     columns: tuple[str, str] = ("id", "label"), class_names: Sequence[str] = ()) -> Path:
    """Atomic CSV in the competition's ``columns``, one row per id in the given order.

    With ``class_names`` the label column holds each class's name (a CSV source's own labels),
    otherwise its index (the flower competition). A label that is a sequence of classes (a
    multi-label prediction) is written as their names or indices separated by spaces, empty when
    it has none: the convention of multi-label competitions (e.g. Planet's tags).
    """
    if len(ids) != len(labels):
        raise ValueError(f"{len(ids)} ids but {len(labels)} labels")
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(list(columns))
    name = (lambda i: class_names[int(i)]) if class_names else int  # noqa: E731

    def label_text(label):
        return " ".join(str(name(c)) for c in label) if np.ndim(label) == 1 else name(label)

    writer.writerows((_text(i), label_text(label)) for i, label in zip(ids, labels))
    checkpoint.atomic_write_text(path, text.getvalue())
    return Path(path)


def write_probabilities(path: str | Path, ids: Sequence, probs: np.ndarray, *, id_column: str = "id",
                        class_names: Sequence[str] = ()) -> Path:
    """Atomic CSV: ``id_column`` then one column per class (its name, else its index), a row per id: for blending.

    Each value is the shortest decimal that reads back as the same float32.
    """
    probs = np.asarray(probs, np.float32)
    if probs.ndim != 2 or len(ids) != len(probs):
        raise ValueError(f"{len(ids)} ids but probabilities of shape {probs.shape}")
    names = list(class_names) or [str(i) for i in range(probs.shape[1])]
    if len(names) != probs.shape[1]:
        raise ValueError(f"{len(names)} class names for {probs.shape[1]} probability columns")
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow([id_column, *names])
    writer.writerows([_text(i), *map(str, row)] for i, row in zip(ids, probs))
    checkpoint.atomic_write_text(path, text.getvalue())
    return Path(path)


def predict_records(steps: Steps, variables: dict | TrainState, filenames, *, image_size: int, batch_size: int,
                    crop=None) -> tuple[list[str], np.ndarray]:
    """(ids, probabilities ``[N, C]``) of the TFRecords ``filenames`` (a test split), in file order.

    ``batch_size`` is the global batch. The number of predicted rows is checked against
    ``count_data_items`` (the counts in the file names) and ids must be unique, so a
    submission never silently misses or repeats an image. A test JPEG whose data are corrupt is
    predicted as libjpeg recovers it, with a warning naming its file and record: the submission
    needs its row.
    """
    from .data import count_data_items, list_tfrecords, load_dataset  # TensorFlow lives there

    files = list_tfrecords(filenames)
    expected = count_data_items(files)
    dataset = load_dataset(files, labeled=False, image_size=image_size, batch_size=batch_size, crop=crop)
    ids, probs = predict(steps, variables, dataset)
    if len(ids) != expected:
        raise ValueError(f"predicted {len(ids)} test images but the file names of {len(files)} file(s) "
                         f"promise {expected}: refusing to write an incomplete submission")
    texts = [_text(i) for i in ids]
    if len(set(texts)) != len(texts):
        dupes = sorted({t for t in texts if texts.count(t) > 1})[:5]
        raise ValueError(f"test ids repeat (e.g. {dupes}): refusing to write an ambiguous submission")
    return texts, probs
