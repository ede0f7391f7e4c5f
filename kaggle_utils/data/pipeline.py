"""Data -> host batches: one tf.data pipeline, read -> parse -> decode -> crop -> augment -> batch.

:func:`load_dataset` (TFRecords) and :func:`load_source` (a :class:`~.sources.Source`) give a :class:`HostDataset`
of ``{"image": uint8 [B, H, W, 3], "label": int32 [B] | float32 [B, C] | "id": bytes [B], "mask": bool [B]}``
(uint8: normalised on the device, a quarter of float32's bytes to send). A training read is this JAX process's
share, shuffled, repeated, in full batches; any other read is the whole split in order, its last batch padded
(static shapes) with ``mask`` False. ``fields`` (:class:`~.fields.ExampleFields`) add each record's own values
(a teacher's probabilities, a weight) beside them, and may give a record its label. Parallel and exact: every map
keeps its order (``deterministic=True``) and every random draw comes from a seed given by the element's place in
the stream, never by the thread or worker that ran it, so a seed gives the same batches on 1 core or 64 without
TensorFlow's op determinism.

Size: one concern, the read. Its stages (:class:`ProblemLog`, :class:`HostDataset`, the records, the decode, the
batches) are shared by its two entries, TFRecords and sources, whose example maps differ only in where the bytes,
the label and the fields come from; apart, each entry would be read without the stages it runs.
"""

import math
import os
import threading
import warnings
import weakref
from typing import Iterator

import numpy as np

from . import jpeg
from .augment import augment_batches, per_image_ops, resolve_augment
from .fields import ExampleFields
from .sources import Source
from .tfhost import first_success, host_cores, op_message, records_read, tf, traced
from .tfrecords import (UNDECODABLE, BadRecordError, DataError, RecordProblem, count_data_items, first_problem,
                        list_tfrecords, parse_record, reader_problem, record_filter, record_spec, shard_files,
                        size_problem)
from .transforms import Resize, decode_image

SHUFFLE_BUFFER = 2048  # serialized records (~50-150 kB each at 512x512), not decoded images
_MAX_SKIPPED_KEPT = 100


class ProblemLog:
    """Bad records met by the pipeline's threads: the first kept to raise (``skip=False``), or all counted.
    Raised by the iterator, not inside ``tf.py_function``, where TensorFlow would wrap it in an anonymous error."""

    def __init__(self, skip: bool):
        self.skip, self.num_skipped, self.skipped = skip, 0, []
        self.first_error: BaseException | None = None
        self._lock = threading.Lock()

    def record_error(self, error: BaseException) -> None:
        with self._lock:
            self.first_error = self.first_error or error

    def add(self, item: RecordProblem) -> bool:
        """Counts ``item`` (skipping) or keeps it as the error to raise; ``False``: leave the record out."""
        if not self.skip:
            self.record_error(BadRecordError(f"{item} (pass skip_errors=True to skip bad records)"))
            return False
        with self._lock:
            self.num_skipped += 1
            if len(self.skipped) < _MAX_SKIPPED_KEPT:
                self.skipped.append(item)
        if self.num_skipped == 1:
            warnings.warn(f"skipping bad record {item}; further skips are counted in .num_skipped", RuntimeWarning,
                          stacklevel=1)
        return False

    def keep(self, name, index, problem):
        """In the graph: True for a good record, else the problem goes to :meth:`add`."""

        def report(name, index, problem):
            return self.add(RecordProblem(name.numpy().decode(), int(index), problem.numpy().decode()))

        return tf.cond(tf.equal(problem, ""), lambda: tf.constant(True),
                       lambda: tf.reshape(tf.py_function(report, [name, index, problem], tf.bool), []))

    def batches(self, tf_dataset, explain) -> Iterator:
        """``tf_dataset``'s batches; a recorded error is raised before a batch that lacks its record, and
        ``explain(err)`` for a TensorFlow error (a file that cannot be read)."""
        try:
            for batch in tf_dataset:
                if self.first_error is not None:
                    raise self.first_error
                yield batch
        except tf.errors.OpError as err:
            raise self.first_error or explain(err) from None
        if self.first_error is not None:
            raise self.first_error


class HostDataset:
    """Iterable of host batches (iterating again starts a new epoch); ``filenames`` are this process's files (a
    source's description), ``num_examples`` their count (from the file names), ``batch_size`` per process."""

    def __init__(self, tf_dataset, *, filenames, num_examples, batch_size, training, problems: ProblemLog, explain,
                 closers=()):
        self.tf_dataset, self.filenames, self.num_examples = tf_dataset, list(filenames), num_examples
        self.batch_size, self.training = batch_size, training
        self._problems, self._explain, self._closers = problems, explain, list(closers)
        self._epochs = weakref.WeakSet()  # epochs being read, ended before close() stops the workers they call

    @property
    def steps_per_epoch(self) -> int:
        return int((math.floor if self.training else math.ceil)(self.num_examples / self.batch_size))

    def __len__(self) -> int:
        if self.training:
            raise TypeError("a training read repeats: it has no length; use .steps_per_epoch")
        return self.steps_per_epoch

    @property
    def num_skipped(self) -> int:
        return self._problems.num_skipped

    @property
    def skipped_records(self) -> list[RecordProblem]:
        """The first 100 skipped records (file, index, problem)."""
        return list(self._problems.skipped)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        epoch = self._epoch()
        self._epochs.add(epoch)
        return epoch

    def _epoch(self) -> Iterator[dict[str, np.ndarray]]:
        skipped_before, delivered = self._problems.num_skipped, 0
        for batch in self._problems.batches(self.tf_dataset, self._explain):
            host = {key: np.asarray(value) for key, value in batch.items()}  # a read-only view; .numpy() copies
            size = len(host["image"])
            host.setdefault("mask", np.ones(size, bool))
            if size < self.batch_size:  # the last partial batch: padded to a static shape
                for key, value in host.items():
                    pad = np.zeros((self.batch_size - size,) + value.shape[1:], value.dtype)
                    host[key] = np.concatenate([value, np.full_like(pad, b"") if value.dtype == object else pad])
            delivered += int(host["mask"].sum())
            yield host
        skipped = self._problems.num_skipped - skipped_before
        if skipped:
            warnings.warn(f"skipped {skipped} bad record(s) this epoch; first: {self._problems.skipped[0]} (all: "
                          ".skipped_records)", RuntimeWarning, stacklevel=2)
        if delivered + skipped != self.num_examples:
            warnings.warn(f"read {delivered + skipped} records but the file names promise {self.num_examples}: the "
                          "counts in the names are wrong, so steps_per_epoch is off", RuntimeWarning, stacklevel=2)

    def close(self) -> None:
        """Stop augmentation workers this dataset started (also done at interpreter exit)."""
        for epoch in list(self._epochs):
            epoch.close()
        for close in self._closers:
            close()
        self._closers = []


# ---------- The stages
def read_records(files: list[str], *, shuffle_seed: int | None = None):
    """``(file, index in the file, serialized record)`` of every record; shuffled (files, then a buffer) with a seed."""

    def read_file(filename):
        return tf.data.TFRecordDataset(filename).enumerate().map(lambda index, record: (filename, index, record))

    names = tf.data.Dataset.from_tensor_slices(files)
    if shuffle_seed is None:
        return names.flat_map(read_file)
    names = names.shuffle(len(files), seed=shuffle_seed, reshuffle_each_iteration=True)
    records = names.interleave(read_file, cycle_length=min(len(files), 16), num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=True)
    return records.shuffle(SHUFFLE_BUFFER, seed=shuffle_seed, reshuffle_each_iteration=True)


def source_records(source: Source, indices: np.ndarray, *, shuffle_seed: int | None = None):
    """``(name, index, payload)`` of ``indices``: a file path, or a tfds record's image bytes (read in file order,
    so that an index keeps its label, and shuffled in a buffer)."""
    if source.tfds is None:
        records = tf.data.Dataset.from_tensor_slices(indices.astype(np.int64))
        if shuffle_seed is not None:
            records = records.shuffle(len(indices), seed=shuffle_seed, reshuffle_each_iteration=True)
        paths = tf.constant(source.paths)
        return records.map(lambda i: (tf.gather(paths, i), i, tf.gather(paths, i)))
    wanted, name = tf.constant(np.isin(np.arange(source.num_examples), indices)), tf.constant(source.description)
    records = source.tfds["records"].enumerate().filter(lambda i, _: tf.gather(wanted, i))
    records = records.map(lambda i, ex: (name, i, ex["image"]))
    if shuffle_seed is not None:
        records = records.shuffle(SHUFFLE_BUFFER, seed=shuffle_seed, reshuffle_each_iteration=True)
    return records


def decode(encoded, problem, *, name, index, size: int | None = None, check=None, trusted=False):
    """Image bytes -> ``(uint8 [H, W, 3], problem)``: bytes that do not decode, an image other than ``size`` x
    ``size`` (TFRecords) or corrupt JPEG data (``check``, :func:`~.jpeg.tf_check`) become the problem;
    ``trusted`` (a bool tensor): bytes that decoded before (:class:`~.tfhost.RecordMemo`), decoded without guards."""

    def plain():
        image = decode_image(encoded)
        return (image if size is None else tf.reshape(image, [size, size, 3])), problem

    def guarded():
        image, decoded = first_success(decode_image, encoded, tf.zeros([1, 1, 3], tf.uint8))
        found = first_problem(problem, tf.where(decoded, "", UNDECODABLE))
        if size is not None:
            found = first_problem(found, size_problem(tf.shape(image)[:2], size))
            image = tf.cond(tf.equal(found, ""), lambda: tf.reshape(image, [size, size, 3]),
                            lambda: tf.zeros([size, size, 3], tf.uint8))
        if check is not None:
            found = tf.cond(tf.equal(found, ""), lambda: check(name, index, encoded), lambda: found)
        return image, found

    return guarded() if trusted is False else tf.cond(trusted, plain, guarded)


def _host_dataset(records, to_example, *, training: bool, seed: int, batch_size: int, plan, problems: ProblemLog,
                  image_size: int, deterministic: bool, **described) -> HostDataset:
    """Records -> examples (the parallel map, each with a per-image seed) -> batches -> per-batch augmentation."""
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2)
    examples = tf.data.Dataset.zip(records.repeat() if training else records, seeds).map(
        traced(lambda record, image_seed: to_example(*record, image_seed)), num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=deterministic)
    examples = examples.filter(lambda example: example["keep"])
    # copied into batches in parallel (the filter keeps tf.data from fusing the map with the batch, which would)
    batches = examples.batch(batch_size, drop_remainder=training, num_parallel_calls=tf.data.AUTOTUNE,
                             deterministic=True).map(lambda batch: {k: v for k, v in batch.items() if k != "keep"})
    if plan.per_batch is not None:
        batches = augment_batches(batches, plan.per_batch, seed=seed, image_shape=(image_size, image_size, 3),
                                  problems=problems, deterministic=deterministic)
    options = tf.data.Options()
    options.deterministic = deterministic
    options.threading.private_threadpool_size = host_cores()
    options.threading.max_intra_op_parallelism = 1  # parallelism comes from the maps, not from inside ops
    return HostDataset(batches.prefetch(tf.data.AUTOTUNE).with_options(options), batch_size=batch_size,
                       training=training, problems=problems, closers=plan.closers, **described)


def _start(batch_size: int, seed: int | None, augment, augment_workers: int | None, skip_errors: bool):
    """(seed, plan, problems) of a read; a fresh seed for None."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    seed = int(np.random.SeedSequence().generate_state(1)[0]) if seed is None else int(seed)
    return seed, resolve_augment(augment, workers=augment_workers), ProblemLog(skip_errors)


def _jax_process():
    import jax  # here, not at the top: the augmentation workers import this package and need no JAX

    return jax.process_index(), jax.process_count()


def _unreadable(files, spec):
    """``explain`` of a read of ``files``: the first record that does not read, as a DataError."""
    return lambda err: DataError(str(reader_problem(files, spec) or f"reading {files} failed: {op_message(err)}"))


# ---------- TFRecords
def load_dataset(files, *, image_size: int, batch_size: int, labeled: bool = True,
                 multi_label_classes: int | None = None, training: bool = False, seed: int | None = None, crop=None,
                 augment=None, augment_workers: int | None = None, skip_errors: bool = False, select=None,
                 with_records: bool = False, deterministic: bool = True, fields: ExampleFields | None = None
                 ) -> HostDataset:
    """TFRecords (files, a directory, a glob, or a list of those) -> :class:`HostDataset`; see the module docstring.

    ``image_size``: the stored side (another size is a bad record). ``labeled``: ``class`` -> ``label``, else
    ``id`` (a test split: a corrupt JPEG is kept with a warning, the submission needs its row);
    ``multi_label_classes``: ``labels`` -> a float32 multi-hot ``label``. ``training``: this process's files,
    shuffled, repeated, full batches. ``seed``: of the shuffles and augmentations (None: a fresh one). ``crop``:
    :mod:`.transforms`; ``augment``, ``augment_workers``: :mod:`.augment`. ``skip_errors``: bad records left out
    and counted. ``select``: the ``(file, index)`` of a CV fold's records. ``with_records``: batches carry
    ``record``, ``b"<file>#<index>"``. ``deterministic=False``: maps hand out elements as they finish (the order,
    and with it the batches of a seed, then vary). ``fields``: each record's row of them joins its example (a record
    without one is a bad record); one whose row gives its ``label`` is read for its image alone (an unlabelled test
    record trained on), and every label of the read is then a float row.
    """
    seed, plan, problems = _start(batch_size, seed, augment, augment_workers, skip_errors)
    listed = list_tfrecords(files)
    files = shard_files(listed, *_jax_process()) if training else listed
    in_workers = plan.decodes_jpegs and crop is None and labeled  # the workers decode (strictly: not a test split)
    records = read_records(files, shuffle_seed=seed if training else None)
    num_examples = count_data_items(files)
    if select is not None:
        keep_record, num_examples = record_filter(listed, files, select)
        records = records.filter(lambda name, index, _: keep_record(name, index))
    check = jpeg.tf_check(files, warn_only=not labeled) if jpeg.check_available() and not in_workers else None
    augment_image = per_image_ops(crop, plan.per_image)
    multi_label_classes = multi_label_classes if labeled else None

    find = None if fields is None else fields.lookup({os.path.abspath(f): f for f in files})
    relabelled = labeled and fields is not None and fields.gives_labels

    # a test split is read without the memo: its corrupt JPEGs pass with a warning, given at every read
    passed = records_read()
    key_of = passed.key_of(files, f"{labeled}|{multi_label_classes}|{image_size}|{in_workers}|{check is not None}"
                                  f"{'|relabelled' if relabelled else ''}") if labeled else None

    def to_example(name, index, serialized, image_seed):
        key = key_of(name, index) if key_of else None
        trusted = passed.known(key) if key_of else False

        def parse(labeled):
            return parse_record(serialized, labeled=labeled, image_size=image_size,
                                multi_label_classes=multi_label_classes, header=False, jpeg_only=in_workers,
                                trusted=trusted)

        if find is None:
            encoded, target, problem = parse(labeled)
        else:
            found, values, given = find(tf.strings.join([name, "#", tf.strings.as_string(index)]))
            encoded, target, problem = tf.cond(given, lambda: parse(None), lambda: parse(labeled)) if relabelled \
                else parse(labeled)
            problem = first_problem(problem, tf.where(found, "", "no row for this record in the fields given"))
        if relabelled:  # float rows: the record's own class one-hot, or the row's label
            own = target if multi_label_classes else tf.one_hot(target, fields.label_width, dtype=tf.float32)
            target = tf.where(given, values["label"], own)
        example = {"label" if labeled else "id": target}
        if find is not None:
            example.update({name: value for name, value in values.items() if name != "label"})
        if in_workers:  # the JPEG for the workers to decode, and where it came from (should one not decode it)
            example.update(jpeg=tf.where(tf.equal(problem, ""), encoded, b""), name=name, index=index)
        else:
            image, problem = decode(encoded, problem, name=name, index=index, size=image_size, check=check,
                                    trusted=trusted)
            example["image"] = augment_image(image, image_seed)
        if key_of:
            problem = passed.remember(key, problem)
        if with_records:
            example["record"] = tf.strings.join([name, "#", tf.strings.as_string(index)])
        return {**example, "keep": problems.keep(name, index, problem)}

    return _host_dataset(records, to_example, training=training, seed=seed, batch_size=batch_size, plan=plan,
                         problems=problems, image_size=crop.size if crop is not None else image_size,
                         deterministic=deterministic, filenames=files, num_examples=num_examples,
                         explain=_unreadable(files, record_spec(labeled, multi_label_classes is not None)))


def scan_labels(files, *, image_size: int, multi_label_classes: int | None = None,
                skip_errors: bool = False) -> np.ndarray:
    """Every label of ``files`` in order, int32 ``[N]`` or float32 ``[N, C]``, parsed in parallel: each record is
    checked as far as its JPEG header goes; data that do not decode are found by the first epoch."""
    files, problems = list_tfrecords(files), ProblemLog(skip_errors)

    def target(name, index, serialized):
        _, label, problem = parse_record(serialized, labeled=True, image_size=image_size,
                                         multi_label_classes=multi_label_classes)
        return label, problems.keep(name, index, problem)

    labels = read_records(files).map(traced(target), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    labels = labels.filter(lambda _, keep: keep).map(lambda label, _: label).batch(4096)
    explain = _unreadable(files, record_spec(True, multi_label_classes is not None))
    found = [batch.numpy() for batch in problems.batches(labels, explain)]
    empty = np.zeros((0,) + (() if multi_label_classes is None else (multi_label_classes,)),
                     np.int32 if multi_label_classes is None else np.float32)
    return np.concatenate(found) if found else empty


def check_tfrecords(files, *, image_size: int, labeled: bool = True,
                    multi_label_classes: int | None = None) -> list[RecordProblem]:
    """Read every record of ``files`` as :func:`load_dataset` does and list what is wrong (empty: all good)."""
    dataset = load_dataset(files, image_size=image_size, batch_size=256, labeled=labeled,
                           multi_label_classes=multi_label_classes, skip_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for _ in dataset:
                pass
        except DataError:  # a file that cannot be read further
            return dataset.skipped_records + [reader_problem(dataset.filenames)]
    return dataset.skipped_records


# ---------- Sources other than TFRecords
def load_source(source: Source, *, batch_size: int, image_size: int | None = None, crop=None, training: bool = False,
                seed: int | None = None, augment=None, augment_workers: int | None = None, skip_errors: bool = False,
                with_ids: bool = False, indices=None, fields: ExampleFields | None = None) -> HostDataset:
    """A :class:`~.sources.Source` -> host batches, as :func:`load_dataset`; ``crop`` defaults to
    ``Resize(image_size)``; ``with_ids`` adds ``id`` to labeled batches. ``indices`` replaces the process's share
    and, outside training, is read in that order (a tfds split in its own). ``fields``: keyed by the source's ids,
    as :func:`load_dataset`'s."""
    if crop is None and image_size is None:
        raise ValueError("give image_size= (images are resized to it) or crop=")
    if crop is not None and image_size is not None and image_size != crop.size:
        raise ValueError(f"image_size={image_size} differs from crop.size={crop.size}; give one of them")
    seed, plan, problems = _start(batch_size, seed, augment, augment_workers, skip_errors)
    crop = crop or Resize(image_size)
    if indices is None:
        indices = source.indices(*_jax_process()) if training else np.arange(source.num_examples)
    indices = np.asarray(indices, np.int64)
    check = jpeg.tf_check(source.paths or (), warn_only=not source.labeled) if jpeg.check_available() else None
    augment_image = per_image_ops(crop, plan.per_image)
    ids, labels = tf.constant(source.ids), None if source.labels is None else tf.constant(source.labels)
    find = None if fields is None else fields.lookup()

    passed = records_read()
    key_of = passed.key_of(source.paths or (), f"source|{check is not None}") if source.labeled else None
    # a test folder is read without the memo, as a test split

    def to_example(name, index, payload, image_seed):
        key = key_of(name, index) if key_of else None
        trusted = passed.known(key) if key_of else False
        if source.paths is None:
            encoded, readable = payload, True
        else:
            encoded, readable = first_success(tf.io.read_file, payload, "") if trusted is False else tf.cond(
                trusted, lambda: (tf.io.read_file(payload), tf.constant(True)),
                lambda: first_success(tf.io.read_file, payload, ""))
        image, problem = decode(encoded, tf.where(readable, "", "the file cannot be read"), name=name, index=index,
                                check=check, trusted=trusted)
        if key_of:
            problem = passed.remember(key, problem)
        example = {"image": augment_image(image, image_seed)}
        if labels is not None:
            example["label"] = tf.gather(labels, index)
        if labels is None or with_ids:
            example["id"] = tf.gather(ids, index)
        if find is not None:
            found, values, given = find(tf.gather(ids, index))
            problem = first_problem(problem, tf.where(found, "", "no row for this image in the fields given"))
            example.update({name: value for name, value in values.items() if name != "label"})
            if labels is not None and fields.gives_labels:
                own = example["label"]
                own = own if own.dtype == tf.float32 else tf.one_hot(own, fields.label_width, dtype=tf.float32)
                example["label"] = tf.where(given, values["label"], own)
        return {**example, "keep": problems.keep(name, index, problem)}

    return _host_dataset(source_records(source, indices, shuffle_seed=seed if training else None), to_example,
                         training=training, seed=seed, batch_size=batch_size, plan=plan, problems=problems,
                         image_size=crop.size, deterministic=True, filenames=[source.description],
                         num_examples=len(indices),
                         explain=lambda err: DataError(f"reading {source.description} failed: {op_message(err)}"))
