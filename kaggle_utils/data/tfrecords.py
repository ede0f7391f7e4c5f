"""Kaggle's flower TFRecords -> batches of numpy arrays for JAX.

The competition ships ``{train,val,test}/NN-SxS-COUNT.tfrec`` files: ``image`` (JPEG bytes)
with ``class`` (int64) for train/val, ``image`` with ``id`` (bytes) for test. This module
finds those files, counts them, and parses them for :func:`kaggle_utils.data.pipeline.load_dataset`,
which turns them into an iterable of host batches::

    {"image": uint8 [B, H, W, 3], "label": int32 [B] | "id": object (bytes) [B], "mask": bool [B]}

Multi-label records (the kit's own format, written by the converter for a source with several
labels per image) carry ``labels`` (int64 list: the indices of the classes present, at least
one) in place of ``class``; read with ``multi_label_classes=C`` they give ``label`` as float32
multi-hot ``[B, C]``. A list of indices rather than a stored multi-hot row: a record does not
grow with the class count, and the reader still checks every index against ``[0, C)``. A
conversion says which kind its records are (``"multi_label": true`` in its ``class_names.json``),
and a reader of the other kind finds no ``class`` (or no ``labels``) feature and says so.

Writing files in that layout is :mod:`kaggle_utils.data.tfrecord_writer`'s part.

Design choices, and why:

* Images stay uint8 on the host; normalisation happens on the device inside the jitted
  step, so the host sends a quarter of the bytes float32 would need.
* TensorFlow is imported lazily, only here, and told to see no GPU/TPU: tf.data runs on the
  host CPUs and JAX owns the accelerator (see :func:`tensorflow_on_host`). Worker processes
  of :mod:`kaggle_utils.data.augment_workers` import this package without loading TensorFlow.
* Every record travels with its file name and index through the pipeline, so a bad record
  is reported as ``<file>, record <i>: <what is wrong>`` instead of TensorFlow's anonymous
  op error, and ``skip_errors=True`` can drop it and count it. That includes JPEGs whose data
  are corrupt, which decoders turn into garbage without an error (:mod:`.jpeg_check`).
* Evaluation sees every example exactly once: the final partial batch is padded to the full
  batch size (static shapes, no recompilation) and ``mask`` marks the padding.
* Multi-host: each JAX process reads its own subset of the files (:func:`shard_files`).
"""
from __future__ import annotations

import glob as _glob
import os
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .jpeg import DCT_METHOD
from .jpeg_check import jpeg_problem, strict_decoder
from .tfhost import tensorflow_on_host
from .transforms import first_success

__all__ = [
    "BadRecordError",
    "DataError",
    "NoTFRecordsError",
    "RecordProblem",
    "check_tfrecords",
    "count_data_items",
    "count_from_name",
    "count_records",
    "decode_example",
    "list_tfrecords",
    "locate_competition_data",
    "shard_files",
    "tensorflow_on_host",
]

TFRECORD_SUFFIXES = (".tfrec", ".tfrecord", ".tfrecords")
KAGGLE_INPUT_ROOTS = ("/kaggle/input",)
DEFAULT_SHUFFLE_BUFFER = 2048  # serialized records (~50-150 kB each at 512x512), not decoded images
_COUNT_IN_NAME = re.compile(r"-(\d+)\.[A-Za-z]+$")  # NN-512x512-798.tfrec -> 798
_MAX_SKIPPED_KEPT = 100


class DataError(ValueError):
    """Bad input data: the message names the file (and record) and what is wrong.

    ``skippable``: whether ``skip_errors`` (``--skip-errors``) would get past it, so that a
    command line offers that flag only where it is the fix (not for a missing file or column).
    """

    skippable = False


class BadRecordError(DataError):
    """One record or image that does not decode (or is corrupt): ``skip_errors`` leaves such records out."""

    skippable = True


class NoTFRecordsError(DataError, FileNotFoundError):
    """A path, directory or glob that resolves to no TFRecord files."""


# --------------------------------------------------------------------------------------
# Finding and counting files
# --------------------------------------------------------------------------------------
def _resolve_one(source: str) -> list[str]:
    tf = tensorflow_on_host()
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
            raise NoTFRecordsError(
                f"directory {source!r} contains no TFRecord files ({', '.join('*' + s for s in TFRECORD_SUFFIXES)})"
                + hint)
        return found
    if gfile.exists(source):
        return [source]
    raise NoTFRecordsError(f"TFRecord path {source!r} does not exist")


def list_tfrecords(source: str | os.PathLike | Iterable[str | os.PathLike]) -> list[str]:
    """Resolve a directory, a glob, a file, or a list of those to a sorted list of files.

    Sorting by path gives every process the same order (sharding depends on it) and gives
    ordered mode the order of Kaggle's ``NN-`` prefixes.
    """
    if isinstance(source, (str, os.PathLike)):
        sources = [os.fspath(source)]
    else:
        sources = [os.fspath(s) for s in source]
    if not sources:
        raise NoTFRecordsError("an empty list of TFRecord files was given")
    files = sorted({f for s in sources for f in _resolve_one(s)})
    return files


def count_from_name(filename: str) -> int | None:
    """The record count Kaggle writes into the name (``00-512x512-798.tfrec`` -> 798), or None."""
    match = _COUNT_IN_NAME.search(os.path.basename(filename))
    return int(match.group(1)) if match else None


def _op_message(err) -> str:
    """A TensorFlow error's text without its annotations (``{{function_node ...}}``, ``[[...]]``, ``[Op:...]``)."""
    text = re.sub(r"\{\{.*?\}\}", " ", err.message)
    text = re.sub(r"\[\[.*?\]\]", " ", text, flags=re.S)
    text = re.sub(r"\[Op:\w+\]( name:\S*)?", " ", text)
    return " ".join(text.split())


def count_records(filename: str) -> int:
    """Count the records of one file by reading it (inside TF, no Python per record)."""
    tf = tensorflow_on_host()
    try:
        return int(tf.data.TFRecordDataset(filename).reduce(np.int64(0), lambda n, _: n + 1))
    except tf.errors.OpError as err:
        raise DataError(f"{filename}: not a readable TFRecord file ({_op_message(err)})") from None


def count_data_items(filenames: str | Sequence[str]) -> int:
    """Number of examples in the files: from the counts in their names, else by counting."""
    files = [filenames] if isinstance(filenames, (str, os.PathLike)) else list(filenames)
    total = 0
    for f in files:
        n = count_from_name(os.fspath(f))
        total += count_records(os.fspath(f)) if n is None else n
    return total


def shard_files(filenames: Sequence[str], process_index: int, process_count: int) -> list[str]:
    """The files JAX process ``process_index`` of ``process_count`` reads (every k-th file).

    Sharding is by file because each TFRecord file is read sequentially; with fewer files
    than processes some process would get nothing, which is an error (write more files).
    """
    files = sorted(filenames)
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} is not in [0, process_count={process_count})")
    if len(files) < process_count:
        raise DataError(
            f"{len(files)} TFRecord file(s) cannot be split over {process_count} processes: each process "
            f"reads whole files, so at least {process_count} files are needed (re-write the data into "
            f"more files, e.g. with write_split(..., num_files={process_count}))")
    return files[process_index::process_count]


def locate_competition_data(image_size: int, roots: Sequence[str] = KAGGLE_INPUT_ROOTS,
                            max_depth: int = 5) -> dict[str, str] | None:
    """Find ``tfrecords-jpeg-SxS/{train,val,test}`` under ``roots``; None when absent.

    Kaggle has mounted the competition data at several places over time
    (``/kaggle/input/tpu-getting-started``, ``/kaggle/input/competitions/...``,
    ``/kaggle/input/datasets/<owner>/<slug>``), so this searches instead of assuming.
    """
    wanted = f"tfrecords-jpeg-{image_size}x{image_size}"
    for root in roots:
        base_depth = root.rstrip(os.sep).count(os.sep)
        for dirpath, dirnames, _ in os.walk(root):
            if os.path.basename(dirpath) == wanted:
                splits = {s: os.path.join(dirpath, s) for s in ("train", "val", "test")}
                if all(os.path.isdir(d) for d in splits.values()):
                    return splits
            if dirpath.count(os.sep) - base_depth >= max_depth:
                dirnames[:] = []
            dirnames.sort()
    return None


# --------------------------------------------------------------------------------------
# Parsing one record, with every problem described rather than raised
# --------------------------------------------------------------------------------------
def _target_feature(labeled: bool, multi_label: bool = False):
    tf = tensorflow_on_host()
    if not labeled:
        return "id", tf.string
    return ("labels" if multi_label else "class"), tf.int64


def _count_problem(tf, name: str, count, what: str):
    return tf.where(tf.equal(count, 0), tf.constant(f"missing feature '{name}'"),
                    tf.strings.format("feature '{}' has {} values, expected one " + what, (name, count)))


def _parse_features(serialized, labeled: bool, multi_label: bool = False):
    """All values of ``image`` and of ``class``/``labels``/``id`` (missing -> empty); raises only on a malformed record."""
    tf = tensorflow_on_host()
    key, dtype = _target_feature(labeled, multi_label)
    parsed = tf.io.parse_single_example(serialized, {
        "image": tf.io.VarLenFeature(tf.string), key: tf.io.VarLenFeature(dtype)})
    return parsed["image"].values, parsed[key].values


def _malformed(labeled: bool, multi_label: bool = False) -> str:
    key, dtype = _target_feature(labeled, multi_label)
    return f"record is not a tf.train.Example with the expected feature types (image: bytes, {key}: {dtype.name})"


UNDECODABLE = "image bytes are not a decodable JPEG"
_WORKERS_DECODE_JPEG_ONLY = (
    "augmentation workers decode JPEGs only: re-encode the images as JPEG, or let TensorFlow decode them "
    "(augment='randaugment' or None, or ProcessPoolAugmenter(fn, decode_jpegs=False))")


def decode_example(serialized, *, labeled: bool, image_size: int, decode_image: bool = True, check_jpeg=None,
                   multi_label_classes: int | None = None):
    """Parse + decode one serialized record inside a tf.data map.

    Returns ``(image uint8 [S, S, 3], target, problem)``: ``target`` is the int64 class,
    the float32 multi-hot row ``[C]`` of a multi-label record (``multi_label_classes=C``), or
    the id string, ``problem`` an empty string for a good record, else a description
    ("missing feature 'class'", "image is 331x331, expected 512x512"). Structural problems
    do not raise, so the caller can name the file and decide to skip; a JPEG that cannot
    be decoded still raises (TF has no non-raising decode), see :func:`load_dataset`.

    ``decode_image=False`` returns the JPEG bytes (a scalar string) in place of the image,
    after checking its size from the header: for augmentation workers that decode
    themselves (:func:`kaggle_utils.data.jpeg.decode_jpeg_into`, the same pixels).

    ``check_jpeg``: None, or ``jpeg -> problem`` (string tensors, ``""``: fine) run on the
    bytes of a decoded image that fits, e.g. corrupt data that the decoder let through
    (:mod:`~kaggle_utils.data.jpeg_check`).
    """
    tf = tensorflow_on_host()
    multi = labeled and multi_label_classes is not None
    key, dtype = _target_feature(labeled, multi)
    jpeg, target = _parse_features(serialized, labeled, multi)
    n_image, n_target = tf.size(jpeg), tf.size(target)
    if multi:
        target, target_ok, target_problem = _multi_hot(target, multi_label_classes)
    else:
        target_ok, target_problem = tf.equal(n_target, 1), _count_problem(tf, key, n_target, "value")
        target = tf.concat([target[:1], tf.constant([-1 if labeled else b""], dtype)], 0)[0]
    has_image = tf.equal(n_image, 1)
    jpeg = tf.concat([jpeg[:1], [b""]], 0)[0]
    if decode_image:
        image = tf.cond(has_image, lambda: tf.io.decode_jpeg(jpeg, channels=3, dct_method=DCT_METHOD),
                        lambda: tf.zeros([0, 0, 3], tf.uint8))
        height_width = tf.shape(image)[:2]
        is_jpeg = tf.constant(True)  # TF's decode_jpeg also decodes PNG, GIF and BMP
    else:
        is_jpeg = tf.equal(tf.strings.substr(jpeg, 0, 2), b"\xff\xd8")
        height_width = tf.cond(has_image & is_jpeg, lambda: tf.io.extract_jpeg_shape(jpeg)[:2],
                               lambda: tf.zeros([2], tf.int32))
    size_ok = tf.reduce_all(tf.equal(height_width, [image_size, image_size]))
    fits = has_image & is_jpeg & target_ok & size_ok
    if decode_image:
        image = tf.cond(fits, lambda: tf.reshape(image, [image_size, image_size, 3]),
                        lambda: tf.zeros([image_size, image_size, 3], tf.uint8))
    else:
        image = tf.where(fits, jpeg, b"")

    def describe():
        size_problem = tf.strings.format(
            "image is {}x{} (height x width), expected {}x{}",
            (height_width[0], height_width[1], image_size, image_size))
        kind = tf.where(tf.equal(tf.strings.substr(jpeg, 0, 4), b"\x89PNG"), "a PNG", "not a JPEG")
        format_problem = tf.strings.join(["image bytes are ", kind, "; " + _WORKERS_DECODE_JPEG_ONLY])
        return tf.where(~has_image, _count_problem(tf, "image", n_image, "JPEG"),
                        tf.where(~is_jpeg, format_problem, tf.where(target_ok, size_problem, target_problem)))

    checked = (lambda: check_jpeg(jpeg)) if check_jpeg is not None and decode_image else (lambda: tf.constant(""))
    problem = tf.cond(fits, checked, describe)
    return image, target, problem


def _multi_hot(indices, num_classes: int):
    """A multi-label record's class indices -> (float32 multi-hot ``[C]``, whether they are usable, what is wrong)."""
    tf = tensorflow_on_host()
    inside = (indices >= 0) & (indices < num_classes)
    usable = (tf.size(indices) > 0) & tf.reduce_all(inside)
    hits = tf.one_hot(tf.boolean_mask(indices, inside), num_classes, dtype=tf.float32)
    row = tf.minimum(tf.reduce_sum(hits, 0), 1.0)
    outside = tf.concat([tf.boolean_mask(indices, ~inside), tf.zeros([1], indices.dtype)], 0)[0]
    problem = tf.where(tf.equal(tf.size(indices), 0),
                       tf.constant("missing feature 'labels' (a multi-label record names at least one class)"),
                       tf.strings.format("feature 'labels' holds class {}, outside the " + str(num_classes)
                                         + " classes [0, " + str(num_classes) + ")", outside))
    return row, usable, problem


def _decode_without_raising(serialized, *, labeled: bool, image_size: int, decode_image: bool = True,
                            check_jpeg=None, multi_label_classes: int | None = None):
    """:func:`decode_example` that also turns undecodable JPEGs / unparsable records into a problem.

    Each record goes through :func:`~kaggle_utils.data.transforms.first_success` (a try/except
    for tf.data); it adds a cost to every record (bench/README.md), so it is used only with
    ``skip_errors=True``.
    """
    tf = tensorflow_on_host()
    multi = labeled and multi_label_classes is not None
    _, dtype = _target_feature(labeled, multi)

    def attempt(parse_fn, fallback):
        return first_success(parse_fn, serialized, fallback)

    no_image = tf.zeros([image_size, image_size, 3], tf.uint8) if decode_image else tf.constant(b"")
    no_target = tf.zeros([multi_label_classes], tf.float32) if multi else tf.constant(-1 if labeled else b"", dtype)
    (image, target, problem), decoded = attempt(
        lambda s: decode_example(s, labeled=labeled, image_size=image_size, decode_image=decode_image,
                                 check_jpeg=check_jpeg, multi_label_classes=multi_label_classes),
        (no_image, no_target, tf.constant("")))

    def explain_failure():
        _, parsed = attempt(lambda s: tf.size(_parse_features(s, labeled, multi)[0]), tf.constant(0))
        return tf.where(parsed, tf.constant(UNDECODABLE), tf.constant(_malformed(labeled, multi)))

    problem = tf.cond(decoded, lambda: problem, explain_failure)
    return image, target, problem


# --------------------------------------------------------------------------------------
# Reporting bad records
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RecordProblem:
    filename: str
    index: int
    problem: str

    def __str__(self):
        return f"{self.filename}, record {self.index}: {self.problem}"


class _ProblemLog:
    """Collects bad records (called from tf.data threads) and the first error to re-raise.

    ``skip=False``: the first bad record becomes a :class:`DataError` that the iterator raises
    (:meth:`HostDataset.__iter__`). It is not raised inside the ``tf.py_function``: TF would
    wrap it in an anonymous op error and log the whole Python traceback first.
    ``skip=True``: bad records are counted, the first few kept, a warning is issued once.
    """

    def __init__(self, skip: bool):
        self.skip = skip
        self.num_skipped = 0
        self.skipped: list[RecordProblem] = []
        self.first_error: BaseException | None = None
        self._lock = threading.Lock()

    def record_error(self, error: BaseException) -> None:
        with self._lock:
            if self.first_error is None:
                self.first_error = error

    def report(self, filename, index, problem) -> bool:
        """tf.py_function hook: ``False`` (drop the record); see :meth:`add`."""
        return self.add(RecordProblem(filename.numpy().decode(), int(index.numpy()), problem.numpy().decode()))

    def add(self, item: RecordProblem) -> bool:
        """Counts ``item`` (skipping) or keeps it as the error to raise; ``False``: leave the record out."""
        if not self.skip:
            self.record_error(BadRecordError(f"{item} (pass skip_errors=True to skip bad records)"))
            return False
        with self._lock:
            self.num_skipped += 1
            if len(self.skipped) < _MAX_SKIPPED_KEPT:
                self.skipped.append(item)
            first = self.num_skipped == 1
        if first:
            warnings.warn(f"skipping bad record {item}; further skips are counted in .num_skipped",
                          RuntimeWarning, stacklevel=1)
        return False


# --------------------------------------------------------------------------------------
# Checking files outside the pipeline (used to explain TF errors that carry no file name)
# --------------------------------------------------------------------------------------
def check_tfrecords(filenames: Sequence[str], *, labeled: bool, image_size: int,
                    max_problems: int | None = None, multi_label_classes: int | None = None) -> list[RecordProblem]:
    """Read every record of ``filenames`` eagerly and list what is wrong (empty: all good).

    Slow (one record at a time) but exact; :func:`load_dataset` calls it when TensorFlow
    fails with an error that does not say which file was at fault.
    """
    tf = tensorflow_on_host()
    problems: list[RecordProblem] = []
    for filename in filenames:
        index = 0  # of the record being read: the reader fails on the first one it cannot read
        try:
            for serialized in tf.data.TFRecordDataset(filename):
                problem = _check_record(serialized, labeled=labeled, image_size=image_size,
                                        multi_label_classes=multi_label_classes)
                if problem:
                    problems.append(RecordProblem(filename, index, problem))
                if max_problems is not None and len(problems) >= max_problems:
                    return problems
                index += 1
        except tf.errors.OpError as err:  # raised by the reader: the file itself is damaged
            problems.append(RecordProblem(filename, index, f"not a readable TFRecord file ({_op_message(err)})"))
            if max_problems is not None and len(problems) >= max_problems:
                return problems
    return problems


def _check_record(serialized, *, labeled: bool, image_size: int, multi_label_classes: int | None = None) -> str:
    tf = tensorflow_on_host()
    multi = labeled and multi_label_classes is not None
    try:
        _parse_features(serialized, labeled, multi)
    except tf.errors.OpError as err:
        return f"{_malformed(labeled, multi)} ({_op_message(err)})"
    check = (lambda jpeg: tf.constant(jpeg_problem(jpeg.numpy()))) if strict_decoder() is not None else None
    try:
        return decode_example(serialized, labeled=labeled, image_size=image_size, check_jpeg=check,
                              multi_label_classes=multi_label_classes)[2].numpy().decode()
    except tf.errors.OpError as err:
        return f"{UNDECODABLE} ({_op_message(err)})"
