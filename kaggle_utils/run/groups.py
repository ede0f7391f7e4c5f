"""``--fold-group COLUMN``: the group of each record of a CV's pool, read from a CSV keyed by the run's id column.

Why a CSV: a TFRecord holds an image, its class and an id (the competition's records, and the
kit's conversions of a ``--source``), but none of the other columns a group lives in (a
patient, a photographer, a video of the competition's ``train.csv``). So the groups are read
from a CSV when the folds are made, and matched to the records by id:

* with a CSV ``--source``, from that CSV's ``COLUMN`` (every row has an id, so every record a group);
* with TFRecords (``--data-dir``) or another source (class folders, ``tfds:``), from
  ``--fold-group-file CSV``: the run's id column (``--id-column``, else the one a converted
  records folder records, else ``id``) and ``COLUMN``; it may also replace a CSV source's own.

Everything is checked before anything is written: the file, both columns, an empty or
conflicting group, and records whose id the file lacks (named, a few of them).
"""
from __future__ import annotations

import csv
import dataclasses
from pathlib import Path
from typing import Sequence

import numpy as np

from ..config import ConfigError, TrainConfig

__all__ = ["FoldGroups", "group_file", "read_groups"]


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
