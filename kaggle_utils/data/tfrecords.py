"""Kaggle's flower TFRecords: finding, counting and sharding the files, parsing one record, choosing records by
(file, index), scanning a split's labels and ids, writing them.

``{train,val,test}/NN-SxS-COUNT.tfrec``: ``image`` (JPEG bytes) with ``class`` (int64), or ``labels`` (the kit's
multi-label records: the classes present), or ``id`` (bytes, test). A record's problems are described, not raised,
so that the pipeline names the file and record, or skips and counts it. A shard is written beside its final name
and renamed into place (a crash leaves no half-written shard for a ``*.tfrec`` glob).

Size: one concern, the TFRecord files: every reader and writer of the competition's record format is here, so a
change to a feature (``class``, ``labels``, ``id``) is made in one module.
"""

import contextlib
import glob as _glob
import itertools
import json
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from .tfhost import first_success, op_message, tf

SPLITS = ("train", "val", "test")
TFRECORD_SUFFIXES = (".tfrec", ".tfrecord", ".tfrecords")
KAGGLE_INPUT_ROOTS = ("/kaggle/input",)
FLOWER_NUM_CLASSES = 104
_FLOWER_NAMES_FILE = Path(__file__).with_name("flower_classes.json")
_COUNT_IN_NAME = re.compile(r"-(\d+)\.[A-Za-z]+$")  # NN-512x512-798.tfrec -> 798
UNDECODABLE = "image does not decode (not a complete JPEG, PNG, GIF, BMP or WebP)"
_WORKERS_DECODE_JPEG_ONLY = (
    "augmentation workers decode JPEGs only: re-encode the images as JPEG, or let TensorFlow decode them "
    "(augment='randaugment' or None, or ProcessPoolAugmenter(fn, decode_jpegs=False))")


class DataError(ValueError):
    """Bad input data: the message names the file (and record) and what is wrong; ``skippable``: whether
    ``skip_errors`` gets past it (a command line offers ``--skip-errors`` only where it is the fix)."""

    skippable = False


class BadRecordError(DataError):
    """One record or image that does not decode (or is corrupt)."""

    skippable = True


class NoTFRecordsError(DataError, FileNotFoundError):
    """A path, directory or glob that resolves to no TFRecord files."""


@dataclass(frozen=True)
class RecordProblem:
    filename: str
    index: int
    problem: str

    def __str__(self):
        return f"{self.filename}, record {self.index}: {self.problem}"


# ---------- Finding, counting and sharding files
def _resolve_one(source: str) -> list[str]:
    gfile = tf.io.gfile
    if _glob.has_magic(source):
        found = sorted(gfile.glob(source))
        if not found:
            raise NoTFRecordsError(f"no files match the pattern {source!r}")
        return found
    if gfile.isdir(source):
        found = sorted(p for s in TFRECORD_SUFFIXES for p in gfile.glob(os.path.join(source, "*" + s)))
        if not found:
            subdirs = sorted(d.rstrip("/") for d in gfile.listdir(source) if gfile.isdir(os.path.join(source, d)))
            hint = f" (it has subfolders {', '.join(subdirs)}: pass one of them)" if subdirs else ""
            raise NoTFRecordsError(f"directory {source!r} contains no TFRecord files "
                                   f"({', '.join('*' + s for s in TFRECORD_SUFFIXES)}){hint}")
        return found
    if gfile.exists(source):
        return [source]
    raise NoTFRecordsError(f"TFRecord path {source!r} does not exist")


def list_tfrecords(source: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """A directory, a glob, a file, or a list of those -> sorted files (every process the same order)."""
    sources = [os.fspath(source)] if isinstance(source, (str, os.PathLike)) else [os.fspath(s) for s in source]
    if not sources:
        raise NoTFRecordsError("an empty list of TFRecord files was given")
    return sorted({f for s in sources for f in _resolve_one(s)})


def count_from_name(filename: str) -> int | None:
    """The record count Kaggle writes into the name (``00-512x512-798.tfrec`` -> 798), or None."""
    match = _COUNT_IN_NAME.search(os.path.basename(filename))
    return int(match.group(1)) if match else None


def count_records(filename: str) -> int:
    """Count the records of one file by reading it (inside TF, no Python per record)."""
    try:
        return int(tf.data.TFRecordDataset(filename).reduce(np.int64(0), lambda n, _: n + 1))
    except tf.errors.OpError:
        raise DataError(str(reader_problem([filename]))) from None


def count_data_items(filenames: str | Sequence[str]) -> int:
    """Number of examples in the files: from the counts in their names, else by counting."""
    files = [filenames] if isinstance(filenames, (str, os.PathLike)) else list(filenames)
    return sum(count_records(f) if count_from_name(f) is None else count_from_name(f) for f in map(os.fspath, files))


def shard_files(filenames: Sequence[str], process_index: int, process_count: int) -> list[str]:
    """The files JAX process ``process_index`` of ``process_count`` reads (every k-th): whole files, since a
    TFRecord file is read from its start."""
    files = sorted(filenames)
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, process_count={process_count})")
    if len(files) < process_count:
        raise DataError(
            f"{len(files)} TFRecord file(s) cannot be split over {process_count} processes: each process reads whole "
            f"files, so at least {process_count} files are needed (re-write the data into more files, e.g. with "
            f"write_split(..., num_files={process_count}))")
    return files[process_index::process_count]


def locate_competition_data(image_size: int, roots: Sequence[str] = KAGGLE_INPUT_ROOTS,
                            max_depth: int = 5) -> dict[str, str] | None:
    """``tfrecords-jpeg-SxS/{train,val,test}`` under ``roots`` (Kaggle has mounted it at several places); or None."""
    wanted = f"tfrecords-jpeg-{image_size}x{image_size}"
    for root in roots:
        base_depth = root.rstrip(os.sep).count(os.sep)
        for dirpath, dirnames, _ in os.walk(root):
            if os.path.basename(dirpath) == wanted:
                splits = {s: os.path.join(dirpath, s) for s in SPLITS}
                if all(os.path.isdir(d) for d in splits.values()):
                    return splits
            if dirpath.count(os.sep) - base_depth >= max_depth:
                dirnames[:] = []
            dirnames.sort()
    return None


def reader_problem(files: Sequence[str], spec: dict | None = None) -> RecordProblem | None:
    """The first record of ``files`` that cannot be read (or parsed with ``spec``), read eagerly: what explains a
    TensorFlow error that names no file; None if every record reads."""
    for filename in files:
        index = 0
        try:
            for serialized in tf.data.TFRecordDataset(filename):
                if spec is not None:
                    try:
                        tf.io.parse_single_example(serialized, spec)
                    except tf.errors.OpError as err:
                        return RecordProblem(filename, index, f"{malformed(spec)} ({op_message(err)})")
                index += 1
        except tf.errors.OpError as err:
            with tf.io.gfile.GFile(filename, "rb") as f:
                gzip = f.read(2) == b"\x1f\x8b"
            return RecordProblem(filename, index, "a gzip-compressed file, which TFRecord readers here do not "
                                 "decompress: gunzip it first" if gzip else
                                 f"not a readable TFRecord file ({op_message(err)})")
    return None


# ---------- Parsing one record, every problem described rather than raised
def record_spec(labeled: bool | None, multi_label: bool = False) -> dict:
    """The features a record is parsed for: ``image`` and ``class`` / ``labels`` / ``id`` (``labeled=None``: the
    image alone, its label given from elsewhere)."""
    if labeled is None:
        return {"image": tf.io.VarLenFeature(tf.string)}
    target = ("labels" if multi_label else "class", tf.int64) if labeled else ("id", tf.string)
    return {"image": tf.io.VarLenFeature(tf.string), target[0]: tf.io.VarLenFeature(target[1])}


def malformed(spec: dict) -> str:
    types = ", ".join(f"{key}: {'bytes' if f.dtype.name == 'string' else f.dtype.name}" for key, f in spec.items())
    return f"record is not a tf.train.Example with the expected feature types ({types})"


def _count_problem(name: str, count, what: str):
    return tf.where(tf.equal(count, 1), "", tf.where(tf.equal(count, 0), f"missing feature '{name}'",
                                                     tf.strings.format("feature '{}' has {} values, expected one "
                                                                       + what, (name, count))))


def first_problem(*problems):
    """The first non-empty problem string (a tensor), or ``""``."""
    found = problems[-1]
    for problem in reversed(problems[:-1]):
        found = tf.where(tf.equal(problem, ""), found, problem)
    return found


def size_problem(height_width, size: int):
    """``""`` for an image of ``size`` x ``size``, else what is wrong."""
    return tf.where(tf.reduce_all(tf.equal(height_width, [size, size])), "", tf.strings.format(
        "image is {}x{} (height x width), expected {}x{}", (height_width[0], height_width[1], size, size)))


def parse_record(serialized, *, labeled: bool | None, image_size: int, multi_label_classes: int | None = None,
                 header: bool = True, jpeg_only: bool = False, trusted=False):
    """One serialized record -> ``(image bytes, target, problem)`` in a tf.data map, decoding nothing.

    ``target``: the int32 class, a float32 multi-hot ``[C]`` (``multi_label_classes=C``) or the id (``labeled=None``:
    the image alone, the target a placeholder of the labelled kind: -1, or zeros ``[C]``); ``problem``: ``""`` or
    what is wrong; ``header``: check the JPEG header and size too; ``jpeg_only``: refuse non-JPEG bytes; ``trusted``:
    a bool tensor, true for a record read in full before (:class:`~.tfhost.RecordMemo`): parsed without guards.
    """
    multi = labeled is not False and multi_label_classes is not None
    spec = record_spec(labeled, multi)
    key = list(spec)[1] if labeled is not None else None
    dtype = spec[key].dtype if key else tf.int64

    def parse(s):
        parsed = tf.io.parse_single_example(s, spec)
        return parsed["image"].values, parsed[key].values if key else tf.zeros([0], tf.int64)

    def content(images, values):
        """(the image bytes, the target, what is wrong with the target)"""
        encoded = tf.concat([images[:1], [b""]], 0)[0]
        if labeled is None:
            placeholder = tf.zeros([multi_label_classes], tf.float32) if multi else tf.constant(-1, tf.int32)
            return encoded, placeholder, tf.constant("")
        if multi:
            return (encoded, *_multi_hot(values, multi_label_classes))
        target = tf.concat([values[:1], tf.constant([-1 if labeled else b""], dtype)], 0)[0]
        return encoded, tf.cast(target, tf.int32) if labeled else target, _count_problem(key, tf.size(values), "value")

    def plain():
        encoded, target, _ = content(*parse(serialized))
        return encoded, target, tf.constant("")

    def guarded():
        (images, values), parsed = first_success(parse, serialized, (tf.zeros([0], tf.string), tf.zeros([0], dtype)))
        encoded, target, target_problem = content(images, values)
        problems = [tf.where(parsed, "", malformed(spec)), _count_problem("image", tf.size(images), "image"),
                    target_problem]
        if header or jpeg_only:
            is_jpeg = tf.equal(tf.strings.substr(encoded, 0, 2), b"\xff\xd8")
            height_width, has_header = first_success(lambda jpeg: tf.image.extract_jpeg_shape(jpeg)[:2], encoded,
                                                     tf.zeros([2], tf.int32))
            kind = tf.where(tf.equal(tf.strings.substr(encoded, 0, 4), b"\x89PNG"), "a PNG", "not a JPEG")
            problems.append(tf.where(~is_jpeg, tf.strings.join(["image bytes are ", kind, "; "
                                                                 + _WORKERS_DECODE_JPEG_ONLY]) if jpeg_only else "",
                                     tf.where(has_header, size_problem(height_width, image_size), UNDECODABLE)))
        return encoded, target, first_problem(*problems)

    return guarded() if trusted is False else tf.cond(trusted, plain, guarded)


def _multi_hot(indices, num_classes: int):
    """A multi-label record's class indices -> (float32 multi-hot ``[C]``, what is wrong or ``""``)."""
    inside = (indices >= 0) & (indices < num_classes)
    row = tf.minimum(tf.reduce_sum(tf.one_hot(tf.boolean_mask(indices, inside), num_classes, dtype=tf.float32), 0), 1.0)
    outside = tf.concat([tf.boolean_mask(indices, ~inside), tf.zeros([1], indices.dtype)], 0)[0]
    problem = tf.where(tf.equal(tf.size(indices), 0), "missing feature 'labels' (a multi-label record names at "
                       "least one class)", tf.where(tf.reduce_all(inside), "", tf.strings.format(
                           "feature 'labels' holds class {}, outside the " + str(num_classes) + " classes [0, "
                           + str(num_classes) + ")", outside)))
    return row, problem


# ---------- Records by (file, index): a CV fold's records without a copy of the data per fold (not every labelled
# record has an ``id``); a split's labels and ids (:func:`scan_records`), no image decoded
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


@dataclass(frozen=True)
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


# ---------- Writing records and shards
@contextlib.contextmanager
def atomic_output_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary path beside ``path`` (``.NAME.*.partial``), renamed onto ``path`` on success."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def encode_jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    """uint8 [H, W, 3] -> JPEG bytes (TensorFlow's libjpeg, as the competition files)."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"encode_jpeg needs a uint8 [H, W, 3] image, got {image.dtype} {image.shape}")
    return tf.io.encode_jpeg(image, quality=quality).numpy()


def serialize_example(image_jpeg: bytes, *, label: int | None = None, labels: Sequence[int] | None = None,
                      id: bytes | str | None = None) -> bytes:
    """One ``tf.train.Example`` in the competition's format: image + class or labels (multi-label) (+ id), or
    image + id (test records)."""
    if label is not None and labels is not None:
        raise ValueError("give label= (single-label) or labels= (multi-label), not both")
    if label is None and labels is None and id is None:
        raise ValueError("give label= or labels= (train/val records, with id= where known) or id= (test records)")
    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_jpeg]))}
    if labels is not None:
        if not len(labels):
            raise ValueError("a multi-label example needs at least one class in labels=")
        feature["labels"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(c) for c in labels]))
    elif label is not None:
        feature["class"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))
    if id is not None:
        id_bytes = id.encode("utf-8") if isinstance(id, str) else bytes(id)
        feature["id"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[id_bytes]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecord(path: str | os.PathLike, records: Iterable[bytes]) -> int:
    """Write serialized records with ``tf.io.TFRecordWriter``, atomically; returns the count."""
    count = 0
    with atomic_output_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for count, record in enumerate(records, 1):
            writer.write(record)
    return count


def shard_name(index: int, image_size: int, count: int) -> str:
    """Kaggle's file name: ``NN-SxS-COUNT.tfrec`` (the count lets readers skip counting)."""
    return f"{index:02d}-{image_size}x{image_size}-{count}.tfrec"


def write_split(split_dir: str | os.PathLike, images: np.ndarray, *, labels: Sequence[int] | np.ndarray | None = None,
                ids: Sequence[bytes | str] | None = None, num_files: int = 1, quality: int = 95) -> list[str]:
    """Square uint8 images [N, S, S, 3] as ``num_files`` shards (all but the last of ``ceil(N / num_files)``);
    ``labels``: class indices ``[N]`` or multi-hot rows ``[N, C]`` (multi-label records)."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[1] != images.shape[2] or images.shape[3] != 3:
        raise ValueError(f"write_split needs square uint8 images [N, S, S, 3], got {images.shape}")
    targets = labels if labels is not None else ids
    if (labels is None) == (ids is None) or len(targets) != len(images):
        raise ValueError("give labels= or ids= (one of them), one per image")
    if not 1 <= num_files <= max(1, len(images)):
        raise ValueError(f"num_files={num_files} must be between 1 and the number of images ({len(images)})")
    labels, ids = ([None] * len(images) if x is None else x for x in (labels, ids))
    return write_shards(split_dir, zip(images, labels, ids), count=len(images), num_files=num_files,
                        image_size=images.shape[1], quality=quality)


def write_shards(split_dir, examples: Iterable[tuple], *, count: int, num_files: int, image_size: int,
                 quality: int) -> list[str]:
    """``count`` examples ``(image, label, id)`` as ``num_files`` shards (all but the last of ``ceil(count /
    num_files)``) in Kaggle's names; ``label``: an int, a multi-hot row (its classes: ``labels``), or None (test)."""
    def record(image, label, id):
        row = None if label is None else np.asarray(label)
        target = {} if row is None else {"labels": np.flatnonzero(row > 0.5)} if row.ndim == 1 else {"label": int(row)}
        return serialize_example(encode_jpeg(image, quality), **target, id=id)

    paths, records = [], itertools.starmap(record, examples)
    while chunk := list(itertools.islice(records, math.ceil(count / num_files))):
        paths.append(os.path.join(os.fspath(split_dir), shard_name(len(paths), image_size, len(chunk))))
        write_tfrecord(paths[-1], chunk)
    return paths


def flower_class_names(*, strip: bool = True) -> list[str]:
    """The competition's 104 class names by id, from its tutorial's list (``flower_classes.json``); ``strip=False``:
    verbatim (ids 87 and 90 end in a space)."""
    names = json.loads(_FLOWER_NAMES_FILE.read_text())
    if len(names) != FLOWER_NUM_CLASSES:
        raise ValueError(f"{_FLOWER_NAMES_FILE} lists {len(names)} names, expected {FLOWER_NUM_CLASSES}")
    return [n.strip() for n in names] if strip else names
