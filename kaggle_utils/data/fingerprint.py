"""What a conversion was made from, so that converted records are reused only for the same input: per source,
digests of its ``files`` (path, size, mtime: a ``stat`` each) and ``content`` (ids, labels, class names, columns),
its example count, and the settings; JSON, in the conversion's ``class_names.json``.
"""

import hashlib
import os
from typing import Iterator

import numpy as np

from .sources import Source
from .tfhost import tf
from .tfrecords import DataError


def _digest(parts: Iterator[str | bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")  # a separator, so that ("ab", "c") and ("a", "bc") differ
    return h.hexdigest()


def _file_stats(source: Source) -> Iterator[str]:
    """Path, size and modification time of each file the source reads (a tfds split: its dataset's files)."""
    if source.tfds is not None:
        gfile = tf.io.gfile
        folder = source.tfds["builder"].data_dir
        for path in sorted(gfile.glob(os.path.join(folder, "*"))):
            stat = gfile.stat(path)
            yield f"{path}|{stat.length}|{stat.mtime_nsec}"
        return
    for path in source.paths:
        try:
            stat = os.stat(path)
        except OSError as err:
            raise DataError(f"{source.description}: cannot read {path}: {err.strerror or err}") from None
        yield f"{path}|{stat.st_size}|{stat.st_mtime_ns}"


def _content(source: Source) -> Iterator[str | bytes]:
    yield from (source.id_column, str(source.label_column), str(source.multi_label))
    yield from source.class_names or ()
    yield "ids"
    yield from source.ids
    if source.labels is not None:
        labels = np.ascontiguousarray(source.labels)
        yield f"labels {labels.dtype.str} {labels.shape}"
        yield labels.tobytes()


def source_fingerprint(source: Source) -> dict:
    """``{"source", "examples", "files", "content"}`` of ``source`` as it is now."""
    return {"source": source.description, "examples": source.num_examples,
            "files": _digest(_file_stats(source)), "content": _digest(_content(source))}


def conversion_fingerprint(train: Source, test: Source | None, **settings) -> dict:
    """Everything a conversion of ``train`` (and ``test``) with ``settings`` (its keyword arguments) depends on."""
    return {"train": source_fingerprint(train), "test": None if test is None else source_fingerprint(test),
            "settings": dict(sorted(settings.items()))}


def _source_change(role: str, old: dict | None, new: dict | None) -> str | None:
    if old == new:
        return None
    if old is None or new is None:
        return f"a {role} source was added: {new['source']}" if old is None else f"the {role} source was dropped"
    if old["source"] != new["source"]:
        return f"the {role} source is another one: {old['source']} -> {new['source']}"
    if old["examples"] != new["examples"]:
        return f"the {role} source's files changed: {old['examples']} -> {new['examples']} images"
    if old["files"] != new["files"]:
        return (f"the {role} source's files changed: as many images ({new['examples']}), but a file was replaced, "
                "renamed or modified")
    return f"the {role} source's ids, labels or class names changed"


def fingerprint_changes(old: dict | None, new: dict) -> list[str]:
    """Why a conversion fingerprinted ``old`` is not one of the input fingerprinted ``new`` (settings named as the
    converter's flags); empty if it is."""
    if not old:
        return ["it records no fingerprint of its input (written by an older version)"]
    changes = [_source_change(role, old.get(role), new.get(role)) for role in ("train", "test")]
    before, after = old.get("settings", {}), new["settings"]
    changes += [f"--{name.replace('_', '-')} changed {before.get(name)} -> {after.get(name)}"
                for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
    return [c for c in changes if c]
