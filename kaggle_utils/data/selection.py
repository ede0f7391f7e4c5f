"""Some records of TFRecord files, by (file, index), for CV folds without a copy of the data per fold (not every
labelled record has an ``id``); and a split's labels and ids (:func:`scan_records`), no image decoded.
"""

import dataclasses
import os
from typing import Iterable

import numpy as np

from .tfhost import op_message, tf
from .tfrecords import DataError, reader_problem


def _norm(name) -> str:
    return os.path.abspath(os.fspath(name))


def record_filter(listed: list[str], files: list[str], select: Iterable[tuple[str, int]]):
    """``(predicate(filename, index) -> bool tensor, how many selected records lie in files)``: ``files`` are this
    process's shard of ``listed``; a selection naming a file not listed is refused (a typo would read nothing)."""
    select = list(select)
    known = {_norm(f) for f in listed}
    unknown = sorted({os.fspath(f) for f, _ in select if _norm(f) not in known})
    if unknown:
        raise ValueError(f"select names {len(unknown)} file(s) not among the files read, e.g. {unknown[0]}")
    by_path = {_norm(f): f for f in files}
    keys = sorted({f"{by_path[_norm(f)]}#{int(i)}" for f, i in select if _norm(f) in by_path})
    if not keys:
        return (lambda filename, index: tf.constant(False)), 0
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.ones(len(keys), tf.int32)), default_value=0)

    def keep(filename, index):
        return table.lookup(tf.strings.join([filename, "#", tf.strings.as_string(index)])) > 0

    return keep, len(keys)


@dataclasses.dataclass(frozen=True)
class RecordIndex:
    """Every record of some files, in file order: where it is, its label, and its ``id`` feature ('' if none)."""

    files: np.ndarray  # str [N]
    indices: np.ndarray  # int64 [N]
    labels: np.ndarray  # int64 [N] (-1: no class feature)
    ids: np.ndarray  # str [N]
    label_sets: tuple = ()  # per record, the int64 class indices of its ``labels`` feature (multi-label records)

    def __len__(self) -> int:
        return len(self.indices)

    def pairs(self, rows=None) -> list[tuple[str, int]]:
        rows = range(len(self)) if rows is None else rows
        return [(str(self.files[r]), int(self.indices[r])) for r in rows]

    @property
    def multi_label(self) -> bool:
        """Multi-label records: none has a ``class``, each names its classes in ``labels``."""
        return bool(len(self)) and bool(np.all(self.labels < 0)) and all(len(s) for s in self.label_sets)

    def multi_hot(self, num_classes: int) -> np.ndarray:
        """float32 ``[N, num_classes]`` of ``label_sets`` (indices outside the range are the reader's to refuse)."""
        rows = np.zeros((len(self), num_classes), np.float32)
        for r, found in enumerate(self.label_sets):
            rows[r, found[(found >= 0) & (found < num_classes)]] = 1.0
        return rows


def scan_records(files: list[str]) -> RecordIndex:
    """Labels (``class``, or a multi-label record's ``labels``) and ids of every record of ``files`` (sorted)."""
    spec = {"class": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
            "id": tf.io.FixedLenFeature([], tf.string, default_value=""),
            "labels": tf.io.VarLenFeature(tf.int64)}
    names, indices, labels, ids, label_sets = [], [], [], [], []
    for name in sorted(files):
        start = 0
        try:
            chunks = [tf.io.parse_example(chunk, spec) for chunk in tf.data.TFRecordDataset(name).batch(4096)]
        except tf.errors.OpError as err:  # a file that does not read, or a feature of another type: which record
            raise DataError(str(reader_problem([name], spec) or f"{name}: {op_message(err)}")) from None
        for parsed in chunks:
            n = int(parsed["class"].shape[0])
            names += [name] * n
            indices.append(np.arange(start, start + n))
            labels.append(parsed["class"].numpy())
            ids += [v.decode("utf-8") for v in parsed["id"].numpy()]
            ragged = tf.RaggedTensor.from_sparse(parsed["labels"])
            label_sets += np.split(ragged.values.numpy(), ragged.row_splits.numpy()[1:-1])
            start += n
    cat = (lambda parts, dtype: np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype))
    return RecordIndex(np.array(names, dtype=str), cat(indices, np.int64), cat(labels, np.int64),
                       np.array(ids, dtype=str), tuple(label_sets))
