"""Per-example fields beyond the image and label, joined to the records they belong to: a teacher's probabilities,
a soft label, a sample weight.

:class:`ExampleFields` holds rows of named arrays and the record each row belongs to: a TFRecord's ``(file,
index)`` or a source row's id. The pipeline looks a record up in the parallel map and puts its row's values into
the example beside the image and label, so they travel through batching, padding, sharding, mixing and
micro-batching to the task's loss without any stage naming them. A ``label`` field replaces the label of the rows
``label_rows`` marks (an unlabelled test image trained on with a teacher's targets): such a record is read for its
image only, and every label of the read becomes a float row ``[C]``.
"""
import dataclasses
import os
from typing import Callable, Mapping, Sequence

import numpy as np

from .tfhost import tf


def record_key(file, index) -> str:
    """The key of a TFRecord: its file (absolute) and index, as the pipeline names a record."""
    return f"{os.path.abspath(os.fspath(file))}#{int(index)}"


@dataclasses.dataclass(frozen=True)
class ExampleFields:
    """``values[name][i]`` belongs to the record ``keys[i]`` (:func:`record_key`, or a source's id)."""

    keys: tuple[str, ...]
    values: Mapping[str, np.ndarray]  # name -> [N, ...]
    label_rows: np.ndarray | None = None  # bool [N]: rows whose ``label`` replaces the record's own

    def __post_init__(self):
        n = len(self.keys)
        for name, rows in self.values.items():
            if len(rows) != n:
                raise ValueError(f"field {name!r} has {len(rows)} rows for {n} records")
            if name in ("image", "mask", "id", "record"):
                raise ValueError(f"field {name!r} is one the pipeline makes itself: name it otherwise")
        if len(set(self.keys)) != n:
            raise ValueError("fields name a record twice")
        if (self.label_rows is not None) != ("label" in self.values):
            raise ValueError("a 'label' field needs label_rows (the rows whose label it replaces), and only it")

    @classmethod
    def for_records(cls, records: Sequence[tuple[str, int]], values: Mapping[str, np.ndarray],
                    label_rows: np.ndarray | None = None) -> "ExampleFields":
        """Rows for TFRecords named by ``(file, index)``."""
        return cls(tuple(record_key(f, i) for f, i in records), dict(values), label_rows)

    def moved(self, where: Callable[[str], str]) -> "ExampleFields":
        """The same rows for records whose files moved: ``where(file)`` is a file's new path."""
        keys = tuple(f"{where(file)}#{index}" for file, _, index in (key.rpartition("#") for key in self.keys))
        return dataclasses.replace(self, keys=keys)

    @property
    def gives_labels(self) -> bool:
        return self.label_rows is not None and bool(self.label_rows.any())

    @property
    def label_width(self) -> int | None:
        return int(self.values["label"].shape[1]) if "label" in self.values else None

    def lookup(self, spelled: Mapping[str, str] | None = None):
        """``(key tensor) -> (row found?, {name: value}, label given?)`` in a tf.data map. ``spelled``: a record
        key's file as the reader names it (a TFRecord read gives the file as it was listed)."""
        keys = [k if spelled is None else _respell(k, spelled) for k in self.keys]
        table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys, tf.string), tf.range(len(keys), dtype=tf.int64)), default_value=-1)
        columns = {name: tf.constant(np.asarray(rows)) for name, rows in self.values.items()}
        given = tf.constant(np.zeros(len(keys), bool) if self.label_rows is None else np.asarray(self.label_rows))

        def find(key):
            row = table.lookup(key)
            found, at = row >= 0, tf.maximum(row, 0)
            values = {name: tf.gather(column, at) for name, column in columns.items()}
            return found, values, found & tf.gather(given, at)

        return find


def _respell(key: str, spelled: Mapping[str, str]) -> str:
    file, _, index = key.rpartition("#")
    return f"{spelled.get(file, file)}#{index}"
