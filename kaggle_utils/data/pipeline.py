"""Data -> host batches: the tf.data pipelines (:func:`load_dataset` for TFRecords, :func:`load_source` for other sources).

Batches are dicts of numpy arrays::

    {"image": uint8 [B, H, W, 3], "label": int32 [B] | "id": object (bytes) [B], "mask": bool [B]}

(``label`` float32 multi-hot ``[B, C]`` for multi-label records or sources.) It sits above both :mod:`~kaggle_utils.data.tfrecords` (reading, parsing and reporting bad
records) and :mod:`~kaggle_utils.data.augment` (what is done to the decoded images), so those
two need not import each other. The design choices are in :mod:`~kaggle_utils.data.tfrecords`.
"""
from __future__ import annotations

import math
import warnings
from typing import Iterator

import numpy as np

from .augment import resolve_augment
from .numpy_augment import apply_batch_augment, decode_and_augment_batches
from . import jpeg_check
from .tfhost import parallel_map, tensorflow_on_host
from .sources import Source
from .tfrecords import (
    DEFAULT_SHUFFLE_BUFFER,
    BadRecordError,
    DataError,
    RecordProblem,
    _decode_without_raising,
    _op_message,
    _ProblemLog,
    check_tfrecords,
    count_data_items,
    decode_example,
    list_tfrecords,
    shard_files,
)
from .selection import check_selection, record_filter
from .transforms import Resize, decode_image, first_success

__all__ = ["HostDataset", "NOT_AN_IMAGE", "SourceDataset", "load_dataset", "load_source"]


# --------------------------------------------------------------------------------------
def _read_records(files: list[str], *, ordered: bool, seed: int | None):
    """(filename, index-in-file, serialized) for every record; file order kept when ordered."""
    tf = tensorflow_on_host()

    def read_file(filename):
        records = tf.data.TFRecordDataset(filename)
        return records.enumerate().map(lambda index, record: (filename, index, record))

    files_ds = tf.data.Dataset.from_tensor_slices(files)
    if ordered:
        return files_ds.flat_map(read_file)
    files_ds = files_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    return files_ds.interleave(read_file, cycle_length=min(len(files), 16),
                               num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)


class HostDataset:
    """Iterable of host batches; iterating again starts a new epoch.

    Attributes: ``filenames`` (this process's files), ``num_examples`` (their count, from the
    file names), ``batch_size`` (per process), ``steps_per_epoch``, ``num_skipped`` and
    ``skipped_records`` (with ``skip_errors=True``), ``tf_dataset`` (the underlying
    ``tf.data.Dataset`` of unpadded batches; it has a ``mask`` only when augmentation workers
    decode the JPEGs, False for a record they could not decode and ``skip_errors`` skipped).
    """

    def __init__(self, tf_dataset, *, filenames, num_examples, batch_size, labeled, repeat,
                 drop_remainder, problems: _ProblemLog, image_size, closers=(), multi_label_classes=None):
        self.tf_dataset = tf_dataset
        self.filenames = list(filenames)
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.labeled = labeled
        self.repeat = repeat
        self.drop_remainder = drop_remainder
        self.image_size = image_size
        self.multi_label_classes = multi_label_classes
        self._problems = problems
        self._closers = list(closers)

    @property
    def steps_per_epoch(self) -> int:
        round_ = math.floor if self.drop_remainder else math.ceil
        return int(round_(self.num_examples / self.batch_size))

    def __len__(self) -> int:
        if self.repeat:
            raise TypeError("a repeating dataset has no length; use .steps_per_epoch")
        return self.steps_per_epoch

    @property
    def num_skipped(self) -> int:
        return self._problems.num_skipped

    @property
    def skipped_records(self) -> list[RecordProblem]:
        """The first 100 skipped records (file, index, problem)."""
        return list(self._problems.skipped)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        tf = tensorflow_on_host()
        skipped_before = self._problems.num_skipped
        delivered = 0
        iterator = iter(self.tf_dataset)
        while True:
            try:
                batch = next(iterator)
            except StopIteration:
                break
            except tf.errors.OpError as err:
                raise self._explain(err) from None
            self._raise_recorded_error()  # before a batch that lacks the bad record is delivered
            host = self._to_host(batch)
            delivered += int(host["mask"].sum())
            yield host
        self._raise_recorded_error()
        self._check_epoch(delivered, self._problems.num_skipped - skipped_before)

    def _raise_recorded_error(self) -> None:
        if self._problems.first_error is not None:
            raise self._problems.first_error

    def _to_host(self, batch) -> dict[str, np.ndarray]:
        host = {key: value.numpy() for key, value in batch.items()}
        size = len(host["image"])
        if "mask" not in host:  # only workers that decode JPEGs mask (records they could not decode)
            host["mask"] = np.ones(size, bool)
        if size < self.batch_size:  # the final partial batch: pad to a static shape
            for key in list(host):
                pad = np.zeros((self.batch_size - size,) + host[key].shape[1:], host[key].dtype)
                if host[key].dtype == object:
                    pad[...] = b""
                host[key] = np.concatenate([host[key], pad])
        return host

    def _check_epoch(self, delivered: int, skipped: int) -> None:
        if skipped:
            warnings.warn(f"skipped {skipped} bad record(s) this epoch; first: {self._problems.skipped[0]} "
                          "(all: .skipped_records)", RuntimeWarning, stacklevel=3)
        if not self.drop_remainder and delivered + skipped != self.num_examples:
            warnings.warn(f"read {delivered + skipped} records but the file names promise {self.num_examples}: "
                          "the counts in the names are wrong, so steps_per_epoch is off", RuntimeWarning, stacklevel=3)

    def _explain(self, err) -> BaseException:
        if self._problems.first_error is not None:
            return self._problems.first_error
        found = check_tfrecords(self.filenames, labeled=self.labeled, image_size=self.image_size, max_problems=1,
                                multi_label_classes=self.multi_label_classes)
        if found:
            return BadRecordError(f"{found[0]} (pass skip_errors=True to skip bad records)")
        return DataError(f"reading {len(self.filenames)} TFRecord file(s) failed: {type(err).__name__}: "
                         f"{_op_message(err)}")

    def close(self) -> None:
        """Stop augmentation workers this dataset started (also done at interpreter exit)."""
        for close in self._closers:
            close()
        self._closers = []


def _process_defaults(process_index, process_count):
    if process_index is None or process_count is None:
        import jax

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    return process_index, process_count


def load_dataset(filenames, *, labeled: bool, image_size: int, batch_size: int, ordered: bool = False,
                 augment=None, shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER, drop_remainder: bool = False,
                 repeat: bool = False, skip_errors: bool = False, process_index: int | None = None,
                 process_count: int | None = None, seed: int | None = None,
                 augment_workers: int | None = None, crop=None, keep_corrupt_jpegs: bool = False,
                 select=None, with_records: bool = False, multi_label_classes: int | None = None) -> HostDataset:
    """TFRecords -> :class:`HostDataset` of host batches (dicts of numpy arrays).

    Args:
      filenames: files, a directory, a glob, or a list of those (see :func:`list_tfrecords`).
      labeled: train/val records (``image`` + ``class`` -> ``label``) or test (``image`` + ``id``).
      multi_label_classes: with ``labeled``, the records are multi-label (``image`` + ``labels``, the
        class indices, see :mod:`~kaggle_utils.data.tfrecords`): ``label`` is then float32 multi-hot
        ``[B, C]`` of this many classes ``C``; an index outside ``[0, C)`` is a bad record.
      image_size: every image must be ``image_size`` x ``image_size``; others are bad records.
      batch_size: per-process batch (the global batch divided by the process count).
      ordered: file order (sorted names) and record order kept, deterministic, no shuffling:
        for evaluation and prediction, so ids line up with predictions.
      augment: None; ``"randaugment"`` (TF-native, per image, fast); ``"imgaug"`` (imgaug's
        RandAugment(2, 15) in worker processes); a :class:`~kaggle_utils.data.randaugment_tf.RandAugment`;
        any numpy callable ``uint8 [B,H,W,3] -> uint8 [B,H,W,3]`` (run per batch in
        ``augment_workers`` processes; 0 runs it in the tf.data thread); or a
        :class:`~kaggle_utils.data.augment_workers.ProcessPoolAugmenter` you manage yourself.
      shuffle_buffer_size: records in the shuffle buffer (unordered mode only).
      drop_remainder: drop the final partial batch instead of padding and masking it.
      repeat: repeat forever (training); batches then span epochs.
      skip_errors: skip bad records (counted in ``.num_skipped``, with a warning) instead of
        raising :class:`DataError`; a JPEG with corrupt data is one (:mod:`~kaggle_utils.data.jpeg_check`).
        A skipped record is left out of its batch, except one whose JPEG header reads but whose
        body an augmentation worker cannot decode (or finds corrupt): by then the batch is
        formed, so it keeps its slot with ``mask`` 0.
      process_index, process_count: this process's shard of the files; default from JAX.
      seed: seeds shuffling and TF-native augmentation (and the augmentation workers).
      augment_workers: worker processes for numpy callables (default: one per CPU core, up to 16).
      crop: None (default: images as stored, ``image_size`` square); or a transform of
        :mod:`~kaggle_utils.data.transforms` applied to each decoded image before ``augment``:
        ``RandomResizedCrop(size)`` for training, ``CenterCrop(size, crop_pct)`` for evaluation
        and prediction, ``Resize(size)``; batches are then ``size`` x ``size``. Worker
        augmentation then gets decoded, cropped images (the workers do not decode).
      keep_corrupt_jpegs: a JPEG whose data are corrupt (:mod:`~kaggle_utils.data.jpeg_check`)
        is a bad record, unless this is True: then it is kept as libjpeg recovers it and named
        in a RuntimeWarning, for prediction, where every test image needs its row. Not with
        worker decoding, whose decode is strict.
      select: None (every record), or ``(file, index in the file)`` pairs: only those records are
        read, filtered before parsing (:mod:`~kaggle_utils.data.selection`: a cross-validation
        fold out of the same files); ``num_examples`` counts them.
      with_records: batches also carry ``record`` (bytes ``"file#index"``), to tell which record
        each prediction belongs to when the records carry no ``id`` (out-of-fold predictions).
    """
    tf = tensorflow_on_host()
    _check_batch_size(batch_size)
    process_index, process_count = _process_defaults(process_index, process_count)
    listed = list_tfrecords(filenames)
    files = shard_files(listed, process_index, process_count)
    problems = _ProblemLog(skip=skip_errors)
    seed = concrete_seed(seed)
    plan = resolve_augment(augment, workers=augment_workers, seed=seed)
    decode_in_workers = plan.decode_in_workers and crop is None
    per_image = _per_image_ops(plan.per_image, crop)

    records = _read_records(files, ordered=ordered, seed=seed)
    num_examples = count_data_items(files)
    if select is not None:
        check_selection(listed, select)
        keep_record, num_examples = record_filter(files, select)
        records = records.filter(lambda filename, index, serialized: keep_record(filename, index))
    if not ordered:
        records = records.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        records = records.repeat()
    decode = _decode_without_raising if skip_errors else decode_example
    target_key = "label" if labeled else "id"
    if with_records and decode_in_workers:
        raise ValueError("with_records=True needs TensorFlow to decode (give crop=, or augment in TF)")
    if keep_corrupt_jpegs and decode_in_workers:
        raise ValueError("keep_corrupt_jpegs=True needs TensorFlow to decode (give crop=, or augment in TF)")
    if decode_in_workers:  # their decode is the check
        jpeg_check.check_available()
    check = None if decode_in_workers else jpeg_check.tf_check(files, warn_only=keep_corrupt_jpegs)

    def to_example(filename, index, serialized, image_seed=None):
        check_jpeg = None if check is None else (lambda jpeg: check(filename, index, jpeg))
        image, target, problem = decode(serialized, labeled=labeled, image_size=image_size,
                                        decode_image=not decode_in_workers, check_jpeg=check_jpeg,
                                        multi_label_classes=multi_label_classes)
        keep = _keep_or_report(problems, filename, index, problem)
        if per_image is not None:
            image = per_image(image, image_seed)
        if labeled and multi_label_classes is None:
            target = tf.cast(target, tf.int32)
        if decode_in_workers:  # JPEG bytes, and where they came from, should a worker fail to decode them
            return {"jpeg": image, "filename": filename, "index": index, target_key: target, "keep": keep}
        example = {"image": image, target_key: target, "keep": keep}
        if with_records:
            example["record"] = tf.strings.join([filename, "#", tf.strings.as_string(index)])
        return example

    examples = _map_examples(records, to_example, seeded=per_image is not None, seed=seed, ordered=ordered)
    batches = _batch_examples(examples, batch_size=batch_size, drop_remainder=drop_remainder, ordered=ordered,
                              plan=plan, problems=problems, decode_in_workers=decode_in_workers, image_size=image_size)
    return HostDataset(batches, filenames=files, num_examples=num_examples, batch_size=batch_size,
                       labeled=labeled, repeat=repeat, drop_remainder=drop_remainder, problems=problems,
                       image_size=image_size, closers=plan.closers,
                       multi_label_classes=multi_label_classes if labeled else None)


def _check_batch_size(batch_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")


def _per_image_ops(augment, crop):
    """``(image, seed) -> image``: ``crop``, then the TF-native ``augment``; None when neither is given.

    Without a crop the augmentation gets the record's seed itself, so seeded runs augment
    as they did before crops existed.
    """
    if crop is None:
        return augment
    tf = tensorflow_on_host()

    def crop_then_augment(image, seed):
        if augment is None:
            return crop(image, seed)
        crop_seed, augment_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        return augment(crop(image, crop_seed), augment_seed)

    return crop_then_augment


def _keep_or_report(problems: _ProblemLog, name, index, problem):
    """True for a good example; else the problem goes to ``problems`` (raises, or False to skip it)."""
    tf = tensorflow_on_host()
    return tf.cond(tf.equal(problem, ""), lambda: tf.constant(True),
                   lambda: tf.reshape(tf.py_function(problems.report, [name, index, problem], tf.bool), []))


def concrete_seed(seed: int | None) -> int:
    """``seed``, or a fresh random one: TF's random ops refuse ``seed=None`` once op determinism is on
    (the job turns it on for exact resume), and a drawn seed keeps "no seed" meaning "different each time".
    """
    return int(np.random.SeedSequence().generate_state(1)[0]) if seed is None else seed


def _map_examples(records, to_example, *, seeded: bool, seed: int | None, ordered: bool):
    """``records.map(to_example)`` in parallel; ``seeded``: each record also gets a stateless seed pair."""
    tf = tensorflow_on_host()
    if not seeded:
        return parallel_map(records, to_example, num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered)
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    return parallel_map(tf.data.Dataset.zip(records, seeds), lambda record, image_seed: to_example(*record, image_seed),
                        num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered)


def _batch_examples(examples, *, batch_size, drop_remainder, ordered, plan, problems, decode_in_workers,
                    image_size):
    """Examples with a ``keep`` flag -> batches, worker augmentation, prefetch, options."""
    tf = tensorflow_on_host()
    examples = examples.filter(lambda ex: ex["keep"])  # only with skip_errors can keep be False
    examples = examples.map(lambda ex: {k: v for k, v in ex.items() if k != "keep"})
    batches = examples.batch(batch_size, drop_remainder=drop_remainder)
    if decode_in_workers:
        batches = decode_and_augment_batches(
            batches, plan.per_batch, image_size=image_size, report=problems.add, num_parallel_calls=plan.parallel_calls,
            deterministic=ordered, on_error=problems.record_error)
    elif plan.per_batch is not None:
        batches = apply_batch_augment(batches, plan.per_batch, num_parallel_calls=plan.parallel_calls,
                                      deterministic=ordered, on_error=problems.record_error)
    batches = batches.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = ordered
    options.threading.max_intra_op_parallelism = 1  # parallelism comes from the maps, not inside ops
    return batches.with_options(options)


# --------------------------------------------------------------------------------------
# Sources other than TFRecords
# --------------------------------------------------------------------------------------
NOT_AN_IMAGE = "not a readable image file (JPEG, PNG, GIF, BMP or WebP)"


class SourceDataset(HostDataset):
    """:class:`HostDataset` of a :class:`~kaggle_utils.data.sources.Source`; ``.source`` has its class names and ids."""

    def __init__(self, tf_dataset, *, source: Source, **kwargs):
        super().__init__(tf_dataset, filenames=[source.description], **kwargs)
        self.source = source

    def _explain(self, err) -> BaseException:
        if self._problems.first_error is not None:
            return self._problems.first_error
        return DataError(f"reading {self.source.description} failed: {type(err).__name__}: {_op_message(err)}")


def _source_transform(image_size: int | None, crop):
    if crop is None:
        if image_size is None:
            raise ValueError("give image_size= (images are resized to it) or crop=")
        return Resize(image_size)
    if image_size is not None and image_size != crop.size:
        raise ValueError(f"image_size={image_size} differs from crop.size={crop.size}; give one of them")
    return crop


def load_source(source: Source, *, batch_size: int, image_size: int | None = None, crop=None,
                ordered: bool = False, augment=None, shuffle_buffer_size: int = DEFAULT_SHUFFLE_BUFFER,
                drop_remainder: bool = False, repeat: bool = False, skip_errors: bool = False,
                process_index: int | None = None, process_count: int | None = None, seed: int | None = None,
                augment_workers: int | None = None, with_ids: bool = False,
                indices=None, keep_corrupt_jpegs: bool = False) -> SourceDataset:
    """A :class:`~kaggle_utils.data.sources.Source` -> host batches, as :func:`load_dataset` gives.

    ``{"image": uint8 [B, S, S, 3], "label": int32 [B] (float32 [B, C] multi-hot for a
    multi-label source) | "id": object (bytes) [B], "mask": bool [B]}``; ``with_ids=True``
    adds ``id`` to labeled batches too (e.g. out-of-fold predictions).

    Each file is read and decoded in the parallel map (any format and mode, see
    :mod:`~kaggle_utils.data.transforms`), then ``crop`` (default ``Resize(image_size)``:
    the whole image squashed to a square) and ``augment``. Process ``k`` of ``n`` reads
    every n-th example; ``indices`` (example numbers) replaces that choice, read in that order in
    ordered mode (files; a tfds split is read in its own order). A file that does not decode, or a
    JPEG with corrupt data (:mod:`~kaggle_utils.data.jpeg_check`), raises :class:`DataError` naming it, or
    with ``skip_errors`` is left out and counted; with ``keep_corrupt_jpegs`` (a test split: the
    submission needs its row) the corrupt JPEG is kept as libjpeg recovers it, with a warning naming it.
    The other arguments are :func:`load_dataset`'s.
    """
    tf = tensorflow_on_host()
    _check_batch_size(batch_size)
    crop = _source_transform(image_size, crop)
    process_index, process_count = _process_defaults(process_index, process_count)
    indices = source.indices(process_index, process_count) if indices is None else np.asarray(indices, np.int64)
    problems = _ProblemLog(skip=skip_errors)
    seed = concrete_seed(seed)
    plan = resolve_augment(augment, workers=augment_workers, seed=seed)
    per_image = _per_image_ops(plan.per_image, crop)

    records = source.records(indices, ordered=ordered, seed=seed, shuffle_buffer_size=shuffle_buffer_size)
    if repeat:
        records = records.repeat()
    ids = tf.constant(source.ids)
    labels = None if source.labels is None else tf.constant(source.labels)
    check = jpeg_check.tf_check(warn_only=keep_corrupt_jpegs)

    def read(payload):  # -> (image, its encoded bytes)
        encoded = tf.io.read_file(payload) if source.paths is not None else payload
        return decode_image(encoded), encoded

    def to_example(name, index, payload, image_seed):
        (image, encoded), ok = first_success(read, payload, (tf.zeros([1, 1, 3], tf.uint8), tf.constant(b"")))
        checked = (lambda: check(name, index, encoded)) if check is not None else (lambda: tf.constant(""))
        keep = _keep_or_report(problems, name, index, tf.cond(ok, checked, lambda: tf.constant(NOT_AN_IMAGE)))
        example = {"image": per_image(image, image_seed), "keep": keep}
        if labels is not None:
            example["label"] = tf.gather(labels, index)
        if labels is None or with_ids:
            example["id"] = tf.gather(ids, index)
        return example

    examples = _map_examples(records, to_example, seeded=True, seed=seed, ordered=ordered)
    batches = _batch_examples(examples, batch_size=batch_size, drop_remainder=drop_remainder, ordered=ordered,
                              plan=plan, problems=problems, decode_in_workers=False, image_size=crop.size)
    return SourceDataset(batches, source=source, num_examples=len(indices), batch_size=batch_size,
                         labeled=source.labeled, repeat=repeat, drop_remainder=drop_remainder, problems=problems,
                         image_size=crop.size, closers=plan.closers)
