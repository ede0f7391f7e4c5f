"""TFRecords -> host batches: the tf.data pipeline (:func:`load_dataset`, :class:`HostDataset`).

Batches are dicts of numpy arrays::

    {"image": uint8 [B, H, W, 3], "label": int32 [B] | "id": object (bytes) [B], "mask": bool [B]}

It sits above both :mod:`~kaggle_utils.data.tfrecords` (reading, parsing and reporting bad
records) and :mod:`~kaggle_utils.data.augment` (what is done to the decoded images), so those
two need not import each other. The design choices are in :mod:`~kaggle_utils.data.tfrecords`.
"""
from __future__ import annotations

import math
import warnings
from typing import Iterator

import numpy as np

from . import augment as augment_lib
from .tfhost import tensorflow_on_host
from .tfrecords import (
    DEFAULT_SHUFFLE_BUFFER,
    DataError,
    RecordProblem,
    _decode_without_raising,
    _ProblemLog,
    check_tfrecords,
    count_data_items,
    decode_example,
    list_tfrecords,
    shard_files,
)

__all__ = ["HostDataset", "load_dataset"]


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
                 drop_remainder, problems: _ProblemLog, image_size, closers=()):
        self.tf_dataset = tf_dataset
        self.filenames = list(filenames)
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.labeled = labeled
        self.repeat = repeat
        self.drop_remainder = drop_remainder
        self.image_size = image_size
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
            host = self._to_host(batch)
            delivered += int(host["mask"].sum())
            yield host
        self._check_epoch(delivered, self._problems.num_skipped - skipped_before)

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
        found = check_tfrecords(self.filenames, labeled=self.labeled, image_size=self.image_size, max_problems=1)
        if found:
            return DataError(f"{found[0]} (pass skip_errors=True to skip bad records)")
        return DataError(f"reading {len(self.filenames)} TFRecord file(s) failed: {type(err).__name__}: "
                         f"{err.message.strip()}")

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
                 augment_workers: int | None = None) -> HostDataset:
    """TFRecords -> :class:`HostDataset` of host batches (dicts of numpy arrays).

    Args:
      filenames: files, a directory, a glob, or a list of those (see :func:`list_tfrecords`).
      labeled: train/val records (``image`` + ``class`` -> ``label``) or test (``image`` + ``id``).
      image_size: every image must be ``image_size`` x ``image_size``; others are bad records.
      batch_size: per-process batch (the global batch divided by the process count).
      ordered: file order (sorted names) and record order kept, deterministic, no shuffling:
        for evaluation and prediction, so ids line up with predictions.
      augment: None; ``"randaugment"`` (TF-native, per image, fast); ``"imgaug"`` (imgaug's
        RandAugment(2, 15) in worker processes); a :class:`~kaggle_utils.data.augment.RandAugment`;
        any numpy callable ``uint8 [B,H,W,3] -> uint8 [B,H,W,3]`` (run per batch in
        ``augment_workers`` processes; 0 runs it in the tf.data thread); or a
        :class:`~kaggle_utils.data.augment.ProcessPoolAugmenter` you manage yourself.
      shuffle_buffer_size: records in the shuffle buffer (unordered mode only).
      drop_remainder: drop the final partial batch instead of padding and masking it.
      repeat: repeat forever (training); batches then span epochs.
      skip_errors: skip bad records (counted in ``.num_skipped``, with a warning) instead of
        raising :class:`DataError`. A skipped record is left out of its batch, except one
        whose JPEG header reads but whose body an augmentation worker cannot decode: by then
        the batch is formed, so it keeps its slot with ``mask`` 0.
      process_index, process_count: this process's shard of the files; default from JAX.
      seed: seeds shuffling and TF-native augmentation (and the augmentation workers).
      augment_workers: worker processes for numpy callables (default: one per CPU core, up to 16).
    """
    tf = tensorflow_on_host()
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    process_index, process_count = _process_defaults(process_index, process_count)
    files = shard_files(list_tfrecords(filenames), process_index, process_count)
    problems = _ProblemLog(skip=skip_errors)
    plan = augment_lib.resolve_augment(augment, workers=augment_workers, seed=seed)

    records = _read_records(files, ordered=ordered, seed=seed)
    if not ordered:
        records = records.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        records = records.repeat()
    if plan.per_image is not None:  # one stateless seed pair per record
        seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
        records = tf.data.Dataset.zip(records, seeds)
    decode = _decode_without_raising if skip_errors else decode_example
    target_key = "label" if labeled else "id"

    def to_example(filename, index, serialized, image_seed=None):
        image, target, problem = decode(serialized, labeled=labeled, image_size=image_size,
                                        decode_image=not plan.decode_in_workers)
        keep = tf.cond(tf.equal(problem, ""), lambda: tf.constant(True),
                       lambda: tf.reshape(tf.py_function(problems.report, [filename, index, problem], tf.bool), []))
        if plan.per_image is not None:
            image = plan.per_image(image, image_seed)
        if labeled:
            target = tf.cast(target, tf.int32)
        if plan.decode_in_workers:  # JPEG bytes, and where they came from, should a worker fail to decode them
            return {"jpeg": image, "filename": filename, "index": index, target_key: target, "keep": keep}
        return {"image": image, target_key: target, "keep": keep}

    if plan.per_image is not None:
        to_example_fn = lambda record, image_seed: to_example(*record, image_seed)  # noqa: E731
    else:
        to_example_fn = to_example
    examples = records.map(to_example_fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=ordered)
    examples = examples.filter(lambda ex: ex["keep"])  # only with skip_errors can keep be False
    examples = examples.map(lambda ex: {k: v for k, v in ex.items() if k != "keep"})
    batches = examples.batch(batch_size, drop_remainder=drop_remainder)
    if plan.decode_in_workers:
        batches = augment_lib.decode_and_augment_batches(
            batches, plan.per_batch, image_size=image_size, report=problems.add, num_parallel_calls=plan.parallel_calls,
            deterministic=ordered, on_error=problems.record_error)
    elif plan.per_batch is not None:
        batches = augment_lib.apply_batch_augment(batches, plan.per_batch, num_parallel_calls=plan.parallel_calls,
                                                  deterministic=ordered, on_error=problems.record_error)
    batches = batches.prefetch(tf.data.AUTOTUNE)
    options = tf.data.Options()
    options.deterministic = ordered
    options.threading.max_intra_op_parallelism = 1  # parallelism comes from the maps, not inside ops
    batches = batches.with_options(options)
    return HostDataset(batches, filenames=files, num_examples=count_data_items(files), batch_size=batch_size,
                       labeled=labeled, repeat=repeat, drop_remainder=drop_remainder, problems=problems,
                       image_size=image_size, closers=plan.closers)
