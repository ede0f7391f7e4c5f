"""The numpy route: a batch augmentation ``uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]`` in tf.data.

Any numpy callable (imgaug, albumentations, your own; ``augment="imgaug"`` is
:class:`ImgaugRandAugment`) runs once per batch through ``tf.py_function``, as in the seed
tutorial: in the tf.data thread (:func:`apply_batch_augment`), or in the worker processes of
a :class:`~kaggle_utils.data.augment_workers.ProcessPoolAugmenter`, which can also decode
the batch's JPEGs first (:func:`decode_and_augment_batches`).
"""
from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from .augment_workers import ProcessPoolAugmenter, check_augmented
from .imgaug_compat import import_imgaug_augmenters
from .tfhost import parallel_map, tensorflow_on_host
from .tfrecords import RecordProblem

__all__ = ["ImgaugRandAugment", "apply_batch_augment", "decode_and_augment_batches"]


class ImgaugRandAugment:
    """imgaug's ``RandAugment(n, m)`` as a picklable ``uint8 [B,H,W,3] -> uint8 [B,H,W,3]`` callable.

    The imgaug augmenter is built on first call, in the process that runs it, and seeded
    from that process's ``np.random`` (each augmentation worker seeds its own), so workers do
    not all draw the same augmentations.
    """

    def __init__(self, n: int = 2, m: int = 15):
        self.n, self.m = n, m
        self._augmenter = None

    def __getstate__(self):
        return {"n": self.n, "m": self.m}

    def __setstate__(self, state):  # unpickled in a worker: import imgaug now, before the first batch
        self.__init__(**state)
        import_imgaug_augmenters()

    def __repr__(self):
        return f"ImgaugRandAugment(n={self.n}, m={self.m})"

    def __call__(self, images: np.ndarray) -> np.ndarray:
        if self._augmenter is None:
            iaa = import_imgaug_augmenters()
            self._augmenter = iaa.RandAugment(n=self.n, m=self.m, seed=int(np.random.randint(2**31 - 1)))
        return np.asarray(self._augmenter(images=images))


def apply_batch_augment(batches, fn: Callable[[np.ndarray], np.ndarray], *, num_parallel_calls: int = 1,
                        deterministic: bool | None = None, on_error: Callable[[BaseException], None] | None = None):
    """Map a numpy batch augmentation over ``batches["image"]`` with ``tf.py_function``.

    The static shape is restored after the call (py_function forgets it), so the model's
    jitted step sees the same shapes with or without augmentation. ``on_error`` receives the
    Python exception before TensorFlow wraps it, so the caller can re-raise the original.
    """
    tf = tensorflow_on_host()

    @_errors_passed_to(on_error)
    def call(images):
        array = images.numpy()
        if isinstance(fn, ProcessPoolAugmenter):  # checked in the worker; one copy out of shared memory
            return fn.run(array, _tensor_copy)
        return check_augmented(fn(array.copy()), array.shape, repr(fn))

    def augment_batch(batch):
        images = batch["image"]
        out = tf.ensure_shape(tf.py_function(call, [images], tf.uint8), images.shape)
        return {**batch, "image": out}

    return parallel_map(batches, augment_batch, num_parallel_calls=num_parallel_calls, deterministic=deterministic)


def decode_and_augment_batches(batches, pool: ProcessPoolAugmenter, *, image_size: int,
                               report: Callable[[RecordProblem], object], num_parallel_calls: int = 1,
                               deterministic: bool | None = None,
                               on_error: Callable[[BaseException], None] | None = None):
    """:func:`apply_batch_augment` for batches of JPEG bytes, which ``pool``'s workers decode first.

    ``batches`` carry ``jpeg`` (header already checked), ``filename`` and ``index`` per
    record, which come out as ``image`` and ``mask``. A JPEG that a worker cannot decode
    (a header that parses over a broken body, or corrupt data) goes to ``report`` with its file and record,
    which keeps it as the error to raise or counts it; the record's ``mask`` is False, so
    nothing is lost silently and the batch keeps its static shape.
    """
    tf = tensorflow_on_host()
    image_shape = (image_size, image_size, 3)

    @_errors_passed_to(on_error)
    def call(jpegs, filenames, indices):
        images, failures = pool.decode_and_run(list(jpegs.numpy()), image_shape, _tensor_copy)
        mask = np.ones(len(jpegs), bool)
        for i, why in failures:
            report(RecordProblem(filenames[i].numpy().decode(), int(indices[i]), why))
            mask[i] = False
        return images, mask

    def decode_batch(batch):
        jpegs = batch["jpeg"]
        images, mask = tf.py_function(call, [jpegs, batch["filename"], batch["index"]], [tf.uint8, tf.bool])
        rest = {k: v for k, v in batch.items() if k not in ("jpeg", "filename", "index")}
        return {**rest, "image": tf.ensure_shape(images, jpegs.shape.concatenate(image_shape)),
                "mask": tf.ensure_shape(mask, jpegs.shape)}

    return parallel_map(batches, decode_batch, num_parallel_calls=num_parallel_calls, deterministic=deterministic)


def _errors_passed_to(on_error: Callable[[BaseException], None] | None):
    """Decorator for a ``tf.py_function`` body: ``on_error`` sees its exception before TF wraps it."""
    def decorate(fn):
        @functools.wraps(fn)
        def wrapped(*args):
            try:
                return fn(*args)
            except BaseException as err:
                if on_error is not None:
                    on_error(err)
                raise
        return wrapped
    return decorate


def _tensor_copy(shared: np.ndarray):
    """A tensor holding a copy of ``shared`` (a view of a worker's shared memory, reused after this)."""
    tf = tensorflow_on_host()
    tensor = tf.convert_to_tensor(shared)
    if np.asarray(tensor).ctypes.data == shared.ctypes.data:  # a TF build that aliases numpy memory
        tensor = tf.convert_to_tensor(shared.copy())
    return tensor

