"""Augmentation for the TFRecord pipeline: a TF-native RandAugment and a numpy hook.

Two routes, selected by ``load_dataset(..., augment=...)``:

* ``"randaugment"`` -> :class:`RandAugment`: pure TensorFlow ops on one uint8 image inside
  the parallel decode map, compiled with XLA. For each of ``num_ops`` slots a
  ``tf.switch_case`` runs exactly one randomly drawn operation (Keras' RandAugment layer
  computes all of them for every slot, which is why it crawls inside tf.data). The op set
  and magnitude scale follow imgaug's RandAugment (``m`` in [0, 30]), so ``"randaugment"``
  and ``"imgaug"`` with the same ``n, m`` augment about equally hard.
* any numpy callable ``uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]`` (imgaug, albumentations,
  your own; ``"imgaug"`` is imgaug's ``RandAugment(n=2, m=15)``), run once per batch
  through ``tf.py_function`` as in the seed tutorial. Python under ``tf.py_function`` holds
  the GIL, so parallel map calls alone do not scale (measured: 0.97x from one to two calls).
  :class:`ProcessPoolAugmenter` therefore runs the callable in worker processes (spawned,
  never forked from a process that has TensorFlow's threads running) and passes batches
  through ``multiprocessing.shared_memory``: by default the JPEG bytes, which the worker
  decodes before it augments, and the uint8 result back. The tf.data thread only copies
  bytes in and out and waits, without the GIL, while a worker computes.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import math
import os
import pickle
import queue
import random
import sys
import threading
import traceback
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from typing import Callable, Sequence

import numpy as np

from .imgaug_compat import import_imgaug_augmenters
from .jpeg import decode_jpeg_into
from .jpeg_check import CorruptJpegError
from .tfhost import tensorflow_on_host
from .tfrecords import UNDECODABLE, RecordProblem

__all__ = [
    "AugmentPlan",
    "AugmentWorkerError",
    "ImgaugRandAugment",
    "ProcessPoolAugmenter",
    "RANDAUGMENT_OPS",
    "RandAugment",
    "apply_batch_augment",
    "augment_images",
    "decode_and_augment_batches",
    "default_worker_count",
    "resolve_augment",
    "show_augmented",
]

MAX_MAGNITUDE = 30  # imgaug's RandAugment scale: m=30 is the strongest setting
FILL_VALUE = 128  # grey for pixels that geometric ops move in from outside the image
EQUALIZE_FULL_HISTOGRAM_PIXELS = 384 * 384


# --------------------------------------------------------------------------------------
# TF-native RandAugment ops: uint8 [H, W, 3] image, level in [-1, 1] (sign = direction)
#
# Written for XLA (RandAugment compiles the whole per-image function with jit_compile):
# elementwise float maths that XLA fuses into one pass, and geometric ops as a nearest-
# neighbour gather (TF's ImageProjectiveTransform kernel costs ~15 ms per 512x512 image and
# cannot be compiled). Nearest neighbour is also what PIL, and so the RandAugment paper and
# imgaug's pillike ops, use.
# --------------------------------------------------------------------------------------
def _float(image):
    return tensorflow_on_host().cast(image, "float32")


def _uint8(x):
    """Round half up and saturate to 0..255."""
    tf = tensorflow_on_host()
    return tf.saturate_cast(x + 0.5, tf.uint8)


def _blend(degenerate, image, factor):
    """PIL's ImageEnhance: interpolate (factor < 1) or extrapolate (> 1) from ``degenerate``."""
    x = _float(image)
    return _uint8(degenerate + factor * (x - degenerate))


def _enhance_factor(level):
    tf = tensorflow_on_host()
    return tf.clip_by_value(1.0 + 0.9 * level, 0.1, 1.9)  # imgaug: 1 +- 0.9 m/30


def _grayscale(image):
    tf = tensorflow_on_host()
    return tf.reduce_sum(_float(image) * tf.constant([0.299, 0.587, 0.114]), axis=-1, keepdims=True)


def _warp(image, matrix):
    """Nearest-neighbour affine warp: output pixel (x, y) reads input pixel ``matrix @ (x, y, 1)``."""
    tf = tensorflow_on_host()
    height, width = image.shape[0], image.shape[1]
    ys, xs = tf.meshgrid(tf.range(height, dtype=tf.float32), tf.range(width, dtype=tf.float32), indexing="ij")
    source_x = tf.round(matrix[0] * xs + matrix[1] * ys + matrix[2])
    source_y = tf.round(matrix[3] * xs + matrix[4] * ys + matrix[5])
    inside = (source_x >= 0) & (source_x <= width - 1) & (source_y >= 0) & (source_y <= height - 1)
    index = tf.cast(tf.clip_by_value(source_y, 0, height - 1) * width + tf.clip_by_value(source_x, 0, width - 1),
                    tf.int32)
    pixels = tf.reshape(tf.gather(tf.reshape(image, [-1, 3]), tf.reshape(index, [-1])), [height, width, 3])
    return tf.where(inside[..., tf.newaxis], pixels, tf.constant(FILL_VALUE, tf.uint8))


def identity(image, level):
    return image


def autocontrast(image, level):
    """Stretch each channel to the full 0..255 range."""
    tf = tensorflow_on_host()
    lo = _float(tf.reduce_min(image, axis=[0, 1]))
    hi = _float(tf.reduce_max(image, axis=[0, 1]))
    scale = tf.where(hi > lo, 255.0 / tf.maximum(hi - lo, 1.0), 1.0)
    offset = tf.where(hi > lo, lo, 0.0)
    return _uint8((_float(image) - offset) * scale)


def equalize(image, level):
    """PIL's per-channel histogram equalisation, all three channels in one histogram.

    Above ``EQUALIZE_FULL_HISTOGRAM_PIXELS`` the histogram is taken over every second pixel
    in each direction (65536 samples per channel at 512x512): the scatter-add behind a
    histogram is the slowest step in XLA on CPU, and a quarter of the pixels gives the same
    mapping up to sampling noise. Smaller images are equalised exactly as PIL does.
    """
    tf = tensorflow_on_host()
    offsets = tf.constant([0, 256, 512])
    values = tf.reshape(tf.cast(image, tf.int32) + offsets, [-1])
    stride = 2 if image.shape[0] * image.shape[1] > EQUALIZE_FULL_HISTOGRAM_PIXELS else 1
    sampled = tf.reshape(tf.cast(image[::stride, ::stride], tf.int32) + offsets, [-1])
    histogram = tf.reshape(tf.math.unsorted_segment_sum(tf.ones_like(sampled), sampled, 768), [3, 256])
    last_used = 255 - tf.argmax(tf.reverse(tf.cast(histogram > 0, tf.int32), [1]), axis=1, output_type=tf.int32)
    last_count = tf.gather(histogram, last_used, batch_dims=1)
    step = (tf.reduce_sum(histogram, axis=1) - last_count) // 255
    safe_step = tf.maximum(step, 1)[:, tf.newaxis]
    lut = (tf.cumsum(histogram, axis=1) + safe_step // 2) // safe_step
    lut = tf.clip_by_value(tf.concat([tf.zeros([3, 1], tf.int32), lut[:, :-1]], axis=1), 0, 255)
    lut = tf.where(step[:, tf.newaxis] > 0, lut, tf.range(256)[tf.newaxis])  # a flat channel stays as it is
    # XLA fuses the table's computation (reductions over the histogram) into the gather below and
    # redoes it for every pixel: 5.9 ms per 512x512 image. A dot is not fused into its consumers,
    # so a product with the identity (exact: integers below 2^24) makes it build the table once: 2.0 ms.
    lut = tf.cast(tf.matmul(tf.cast(lut, tf.float32), tf.eye(256)), tf.int32)
    return tf.reshape(tf.cast(tf.gather(tf.reshape(lut, [-1]), values), tf.uint8), tf.shape(image))


def rotate(image, level):
    """Rotate about the centre by up to 30 degrees."""
    tf = tensorflow_on_host()
    angle = level * (30.0 * math.pi / 180.0)
    h, w = float(image.shape[0]), float(image.shape[1])
    cos, sin = tf.cos(angle), tf.sin(angle)
    cx, cy = (w - 1) / 2.0, (h - 1) / 2.0
    return _warp(image, tf.stack([cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy]))


def solarize(image, level):
    """Invert pixels at or above a threshold that falls from 256 (none) towards 0 (all)."""
    tf = tensorflow_on_host()
    threshold = 256 - tf.cast(tf.abs(level) * 256.0, tf.int32)
    x = tf.cast(image, tf.int32)
    return tf.cast(tf.where(x >= threshold, 255 - x, x), tf.uint8)


def color(image, level):
    """Saturation: blend with the greyscale image."""
    return _blend(_grayscale(image), image, _enhance_factor(level))


def posterize(image, level):
    """Drop up to 6 low bits per channel."""
    tf = tensorflow_on_host()
    dropped = tf.cast(tf.abs(level) * 6.0, tf.int32)
    mask = tf.cast(tf.bitwise.left_shift(255, dropped) % 256, tf.uint8)
    return tf.bitwise.bitwise_and(image, mask)


def contrast(image, level):
    """Blend with the mean grey level."""
    tf = tensorflow_on_host()
    return _blend(tf.reduce_mean(_grayscale(image)), image, _enhance_factor(level))


def brightness(image, level):
    """Blend with black."""
    return _blend(0.0, image, _enhance_factor(level))


def sharpness(image, level):
    """Blend with PIL's 3x3 smoothing filter [[1,1,1],[1,5,1],[1,1,1]]/13; border pixels unchanged.

    blend = x + (1 - factor) * (smooth - x), and smooth - x = (sum of the 8 neighbours - 8x) / 13.
    Rows are flattened to [H, 3W] so that neighbours are plain offsets of 3 along one axis, and
    the sums are integers (XLA vectorises these, not the float version: 3 ms against 10).
    """
    tf = tensorflow_on_host()
    height, width = image.shape[0], image.shape[1]
    x = tf.reshape(tf.cast(image, tf.int32), [height, 3 * width])
    rows = x[:, :-6] + x[:, 3:-3] + x[:, 6:]
    box = rows[:-2] + rows[1:-1] + rows[2:]
    detail = tf.cast(tf.pad(box - 9 * x[1:-1, 3:-3], [[1, 1], [3, 3]]), tf.float32)
    out = tf.cast(x, tf.float32) + (1.0 - _enhance_factor(level)) / 13.0 * detail
    return tf.reshape(_uint8(out), [height, width, 3])


def shear_x(image, level):
    """Shear by up to 0.3 (about 17 degrees) along x."""
    tf = tensorflow_on_host()
    return _warp(image, tf.stack([1.0, level * 0.3, 0.0, 0.0, 1.0, 0.0]))


def shear_y(image, level):
    tf = tensorflow_on_host()
    return _warp(image, tf.stack([1.0, 0.0, 0.0, level * 0.3, 1.0, 0.0]))


def translate_x(image, level):
    """Shift by up to 33% of the width."""
    tf = tensorflow_on_host()
    return _warp(image, tf.stack([1.0, 0.0, level * 0.33 * image.shape[1], 0.0, 1.0, 0.0]))


def translate_y(image, level):
    tf = tensorflow_on_host()
    return _warp(image, tf.stack([1.0, 0.0, 0.0, 0.0, 1.0, level * 0.33 * image.shape[0]]))


RANDAUGMENT_OPS: dict[str, Callable] = {
    "identity": identity, "autocontrast": autocontrast, "equalize": equalize, "rotate": rotate,
    "solarize": solarize, "color": color, "posterize": posterize, "contrast": contrast,
    "brightness": brightness, "sharpness": sharpness, "shear_x": shear_x, "shear_y": shear_y,
    "translate_x": translate_x, "translate_y": translate_y,
}


class RandAugment:
    """RandAugment(n, m) in TensorFlow ops: ``image uint8 [H, W, 3], seed [2] -> uint8 [H, W, 3]``.

    Per image and per slot: one op drawn uniformly from ``ops``, a magnitude (``m``, or drawn
    uniformly from ``m=(low, high)``) on imgaug's 0..30 scale, and a random sign for ops with
    a direction (rotate, shear, translate, the enhance factors). ``flip=True`` first mirrors
    half the images left-right, as imgaug's RandAugment does. All randomness is stateless,
    from ``seed``, so a seeded pipeline augments reproducibly. The image needs a static shape.

    ``jit_compile=True`` compiles the whole per-image function with XLA (once per image size),
    which fuses the elementwise chains: about 3x faster than TF's op-by-op kernels on CPU.
    """

    def __init__(self, num_ops: int = 2, magnitude: float | tuple[float, float] = 15, *,
                 ops: Sequence[str] = tuple(RANDAUGMENT_OPS), flip: bool = True, jit_compile: bool = True):
        low, high = (magnitude, magnitude) if np.isscalar(magnitude) else magnitude
        if not 0 <= low <= high <= MAX_MAGNITUDE:
            raise ValueError(f"magnitude must be in [0, {MAX_MAGNITUDE}] (imgaug's scale), got {magnitude}")
        unknown = [name for name in ops if name not in RANDAUGMENT_OPS]
        if unknown or not ops:
            raise ValueError(f"unknown RandAugment ops {unknown}; choose from {list(RANDAUGMENT_OPS)}")
        if num_ops < 0:
            raise ValueError(f"num_ops must be >= 0, got {num_ops}")
        self.num_ops, self.magnitude, self.flip = num_ops, (float(low), float(high)), flip
        self.ops, self.jit_compile = tuple(ops), jit_compile
        self._compiled = None

    def __repr__(self):
        return (f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, ops={len(self.ops)}, "
                f"flip={self.flip}, jit_compile={self.jit_compile})")

    def __call__(self, image, seed):
        tf = tensorflow_on_host()
        if self._compiled is None:
            self._compiled = tf.function(self._augment, jit_compile=self.jit_compile)
        # drawn outside the compiled function: XLA's stateless RNG gives other numbers than TF's
        draws = tf.random.stateless_uniform([3 * self.num_ops + 1], seed=seed)
        return self._compiled(tf.convert_to_tensor(image), draws)

    def _augment(self, image, draws):
        tf = tensorflow_on_host()
        if not image.shape.is_fully_defined() or image.shape[-1] != 3 or image.dtype != tf.uint8:
            raise ValueError(f"RandAugment needs uint8 images of a static shape [H, W, 3], got {image.dtype} "
                             f"{image.shape}")
        if self.flip:
            image = tf.cond(draws[-1] < 0.5, lambda: tf.reverse(image, [1]), lambda: image)
        low, high = self.magnitude
        functions = [RANDAUGMENT_OPS[name] for name in self.ops]

        def apply_one_op(slot, image):  # a loop, not unrolled: the ops are traced and compiled once
            which, sign_draw, magnitude_draw = draws[3 * slot], draws[3 * slot + 1], draws[3 * slot + 2]
            index = tf.minimum(tf.cast(which * len(functions), tf.int32), len(functions) - 1)
            sign = tf.where(sign_draw < 0.5, -1.0, 1.0)
            level = sign * (low + magnitude_draw * (high - low)) / MAX_MAGNITUDE
            image = tf.switch_case(index, [lambda fn=fn: fn(image, level) for fn in functions])
            return slot + 1, tf.ensure_shape(image, shape)

        shape = image.shape
        _, image = tf.while_loop(lambda slot, _: slot < self.num_ops, apply_one_op, [tf.constant(0), image],
                                 maximum_iterations=self.num_ops)
        return image


# --------------------------------------------------------------------------------------
# Numpy callables: imgaug's RandAugment, in-process or in worker processes
# --------------------------------------------------------------------------------------
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


class AugmentWorkerError(RuntimeError):
    """The augmentation callable failed (or its worker process died); carries the traceback."""


def default_worker_count() -> int:
    """One worker per CPU core, up to 16.

    The workers decode as well as augment, so the tf.data process needs little CPU of its
    own (~0.7 core-ms per 512x512 image against ~9 in an imgaug RandAugment worker): no core
    is held back for it. Workers only run while the prefetch buffer has room, so they yield to the training
    step once the input is ahead.
    """
    return max(1, min(16, os.cpu_count() or 1))


def _pickle_for_worker(fn) -> bytes:
    """Serialise ``fn`` for a worker: by reference to its module, by value if it lives in ``__main__``.

    Workers never import the parent's ``__main__`` (see :func:`_main_module_hidden`), so
    functions from a notebook cell or a script travel by value, through cloudpickle.
    """
    module = getattr(fn, "__module__", None) or type(fn).__module__
    if module != "__main__":
        try:
            return pickle.dumps(fn)
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
    try:
        import cloudpickle
    except ImportError:
        raise TypeError(
            f"cannot send {fn!r} to augmentation worker processes: it is a lambda or defined in a notebook "
            "cell or script, and cloudpickle is not installed. Define it in an importable .py module, install "
            "cloudpickle, or pass augment_workers=0 to run it in the tf.data thread (slower: the GIL "
            "serialises it).") from None
    return cloudpickle.dumps(fn)


@contextlib.contextmanager
def _main_module_hidden():
    """Start spawned processes without them re-running the parent's main script.

    ``spawn`` (and ``forkserver``) children import the parent's ``__main__`` so that objects
    defined there can be unpickled. For a script that means re-running its top-level code in
    every worker: imports of TensorFlow and JAX, data writing, or the whole training when the
    script has no ``if __name__ == "__main__":`` guard. Here the callable travels by value
    instead (:func:`_pickle_for_worker`), so the children need nothing from ``__main__``.
    multiprocessing finds the main script through ``__spec__`` and ``__file__`` only while it
    starts a process; both are hidden for that moment and restored right after.
    """
    main = sys.modules.get("__main__")
    saved = {key: main.__dict__[key] for key in ("__spec__", "__file__") if main and key in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


def _check_augmented(out, shape, what: str) -> np.ndarray:
    out = np.asarray(out)
    if out.dtype != np.uint8 or out.shape != tuple(shape):
        raise AugmentWorkerError(
            f"{what} returned {out.dtype} {out.shape}; an augmentation must return uint8 of its input's shape "
            f"{tuple(shape)}")
    return out


def _attach(name: str) -> shared_memory.SharedMemory:
    try:  # Python >= 3.13: the creating process alone tracks (and unlinks) the segment
        return shared_memory.SharedMemory(name=name, track=False)
    except TypeError:
        return shared_memory.SharedMemory(name=name)


def _decode_jpegs(buffer, images: np.ndarray, jpeg_ends: list[int]) -> list[tuple[int, str]]:
    """Decode the JPEGs stored after the image area of ``buffer`` into ``images``; list the failures.

    A JPEG that cannot be decoded, or whose data are corrupt, leaves a black image in its place
    and ``(index, problem)`` in the list, for the parent to name by file and record (and to
    raise, or mask and count).
    """
    failures = []
    start = images.nbytes
    for i, end in enumerate(jpeg_ends):
        try:
            decode_jpeg_into(bytes(buffer[start:images.nbytes + end]), images[i])
        except ValueError as err:
            images[i] = 0
            failures.append((i, str(err) if isinstance(err, CorruptJpegError) else f"{UNDECODABLE} ({err})"))
        start = images.nbytes + end
    return failures


def _run_task(fn, attached: dict, slot: int, name: str, shape, jpeg_ends) -> tuple[str | None, list]:
    failures = []
    try:
        if slot not in attached or attached[slot].name.lstrip("/") != name.lstrip("/"):
            if slot in attached:
                attached.pop(slot).close()
            attached[slot] = _attach(name)
        images = np.ndarray(shape, np.uint8, buffer=attached[slot].buf)
        try:
            if jpeg_ends is not None:
                failures = _decode_jpegs(attached[slot].buf, images, jpeg_ends)
            images[...] = _check_augmented(fn(images), shape, repr(fn))
        finally:
            del images
        return None, failures
    except Exception:  # sent back to the parent, raised there with the traceback
        return traceback.format_exc(), failures


def _worker_main(conn, payload: bytes, entropy: int, index: int) -> None:
    """Entry point of an augmentation worker: unpickle the callable, then serve batches."""
    try:
        if importlib.util.find_spec("cv2") is not None:  # processes are the parallelism: one thread each
            import cv2

            cv2.setNumThreads(1)
        fn = pickle.loads(payload)
        first, second = np.random.SeedSequence(entropy, spawn_key=(index,)).generate_state(2)
        random.seed(int(first))
        np.random.seed(int(second))
    except BaseException:
        conn.send(("ready", traceback.format_exc()))
        return
    conn.send(("ready", None))
    attached: dict[int, shared_memory.SharedMemory] = {}
    try:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):  # parent gone
                break
            if task is None:
                break
            task_id, slot, name, shape, jpeg_ends = task
            conn.send((task_id, *_run_task(fn, attached, slot, name, shape, jpeg_ends)))
    finally:
        for shm in attached.values():
            shm.close()


class _Worker:
    """One worker process, its pipe, and a thread that hands replies to waiting callers."""

    def __init__(self, context, payload: bytes, entropy: int, index: int):
        self.index = index
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child_conn, payload, entropy, index),
                                       name=f"augment-worker-{index}", daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = Future()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._dead: str | None = None
        threading.Thread(target=self._read_replies, name=f"augment-replies-{index}", daemon=True).start()

    def _read_replies(self) -> None:
        try:
            _, startup_error = self.conn.recv()
            self.ready.set_result(startup_error)
            while True:
                task_id, error, failures = self.conn.recv()
                with self._lock:
                    future = self._pending.pop(task_id)
                future.set_result((error, failures))
        except (EOFError, OSError):
            self.process.join(timeout=5)
            with self._lock:
                self._dead = f"augmentation worker {self.index} exited (exit code {self.process.exitcode})"
                pending, self._pending = list(self._pending.values()), {}
            if not self.ready.done():
                self.ready.set_result(self._dead)
            for future in pending:
                future.set_result((self._dead, []))

    def submit(self, task_id: int, slot: int, name: str, shape, jpeg_ends: list[int] | None) -> Future:
        """Future of ``(error traceback or None, [(index, why) for each JPEG that failed to decode])``."""
        future = Future()
        with self._lock:
            if self._dead:
                future.set_result((self._dead, []))
                return future
            self._pending[task_id] = future
            self.conn.send((task_id, slot, name, tuple(shape), jpeg_ends))
        return future

    def stop(self) -> None:
        try:
            with self._lock:
                self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.conn.close()


class _Slot:
    """A shared-memory buffer owned by the parent, used by one call at a time on one worker.

    Layout: the uint8 image batch from offset 0, then (when the worker decodes) the
    batch's JPEG bytes, back to back.
    """

    def __init__(self, worker: _Worker, index: int):
        self.worker, self.index = worker, index
        self.shm: shared_memory.SharedMemory | None = None

    def buffer(self, nbytes: int) -> memoryview:
        if self.shm is None or self.shm.size < nbytes:
            self.release()
            self.shm = shared_memory.SharedMemory(create=True, size=max(1, nbytes))
        return self.shm.buf

    def release(self) -> None:
        if self.shm is not None:
            try:
                self.shm.close()
            except BufferError:  # a caller still holds a view; the mapping goes with the process
                pass
            self.shm.unlink()
            self.shm = None


def _shutdown(workers: list[_Worker], slots: list[_Slot]) -> None:
    for worker in workers:
        worker.stop()
    for slot in slots:
        slot.release()


class ProcessPoolAugmenter:
    """Run a numpy batch augmentation in worker processes, called like the function itself.

    ``pool(images)`` copies the uint8 batch into a shared-memory slot, lets a worker run
    ``fn`` on it in place, and returns a copy of the result. :meth:`decode_and_run` sends
    JPEG bytes instead and the worker decodes them first, to the pipeline's exact pixels
    (:mod:`kaggle_utils.data.jpeg`). Each worker has ``slots_per_worker`` slots, so the
    next batch is already waiting when it finishes one; the tf.data hooks issue that many
    concurrent calls.

    ``decode_jpegs`` says where ``load_dataset`` decodes for this pool. True (default): in
    the workers, so all per-image work scales with them and the training process only
    reads records; this is what a host with few cores per worker wants (2 cores, 512x512:
    with tf.data decoding, the main process took ~25% of the per-image CPU and 2 workers
    reached ~1.4x one, against ~1.7x). False: TensorFlow decodes in its own thread pool and
    the workers only run ``fn``, which can be faster where cores outnumber the workers.

    ``fn`` is pickled to the workers: by reference when it lives in an importable module,
    by value (cloudpickle) when it comes from a notebook cell or the main script. Workers
    are spawned (``start_method="spawn"``, or ``"forkserver"``), never forked, because
    forking a process whose TensorFlow threads hold locks can deadlock the child; they do
    not re-run the main script, so no ``if __name__ == "__main__":`` guard is needed. Each worker seeds ``random`` and ``np.random`` from
    ``seed`` and its index. Close with :meth:`close` or a ``with`` block; worker processes
    are also stopped and shared memory unlinked at interpreter exit.
    """

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray], num_workers: int = 2, *, seed: int | None = None,
                 decode_jpegs: bool = True, slots_per_worker: int = 2, start_method: str = "spawn",
                 startup_timeout: float = 300.0):
        import multiprocessing

        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (use the function directly for 0), got {num_workers}")
        self.fn, self.num_workers, self.decode_jpegs = fn, num_workers, decode_jpegs
        payload = _pickle_for_worker(fn)
        entropy = np.random.SeedSequence(seed).entropy
        context = multiprocessing.get_context(start_method)
        with _main_module_hidden():
            self._workers = [_Worker(context, payload, entropy, i) for i in range(num_workers)]
        self._slots = [_Slot(w, s) for s in range(slots_per_worker) for w in self._workers]
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._slots)
        self._free: queue.Queue[_Slot] = queue.Queue()
        for slot in self._slots:  # interleaved over workers, so load spreads evenly
            self._free.put(slot)
        self._task_ids = itertools.count()
        for worker in self._workers:
            error = worker.ready.result(timeout=startup_timeout)
            if error is not None:
                self.close()
                raise AugmentWorkerError(f"augmentation worker {worker.index} could not start {fn!r}:\n{error}")

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    def __repr__(self):
        return f"ProcessPoolAugmenter({self.fn!r}, num_workers={self.num_workers}, decode_jpegs={self.decode_jpegs})"

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return self.run(images, np.copy)

    def run(self, images: np.ndarray, take: Callable[[np.ndarray], object]):
        """Augment ``images`` in a worker; ``take`` copies the result out of shared memory.

        ``take`` runs before the slot is handed to the next call, so it may read the shared
        buffer directly: the tf.data hook passes ``tf.convert_to_tensor``, whose own copy is
        then the only one (``np.copy`` followed by TF's conversion would copy twice).
        """
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4:
            raise ValueError(f"{self!r} takes a uint8 batch [B, H, W, C], got {images.dtype} {images.shape}")

        def fill(buffer):
            np.ndarray(images.shape, np.uint8, buffer=buffer)[...] = images

        result, _ = self._call(images.shape, images.nbytes, fill, None, take)
        return result

    def decode_and_run(self, jpegs: Sequence[bytes], image_shape: tuple[int, int, int],
                       take: Callable[[np.ndarray], object] = np.copy) -> tuple[object, list[tuple[int, str]]]:
        """Decode ``jpegs`` (each ``image_shape``) in a worker, augment them, return ``(take(images), failures)``.

        ``failures`` lists ``(index, why)`` for each JPEG the worker could not decode; its
        image is black (and augmented with the rest, so the batch keeps its shape).
        """
        shape = (len(jpegs), *image_shape)
        image_bytes = int(np.prod(shape))
        ends = np.cumsum([len(data) for data in jpegs]).tolist()
        encoded_bytes = ends[-1] if ends else 0

        def fill(buffer):
            buffer[image_bytes:image_bytes + encoded_bytes] = b"".join(jpegs)

        return self._call(shape, image_bytes + encoded_bytes, fill, ends, take)

    def _call(self, shape, nbytes: int, fill, jpeg_ends, take):
        if not self._finalizer.alive:
            raise RuntimeError(f"{self!r} is closed")
        slot = self._free.get()
        shared = None
        try:
            buffer = slot.buffer(nbytes)
            fill(buffer)
            future = slot.worker.submit(next(self._task_ids), slot.index, slot.shm.name, shape, jpeg_ends)
            error, failures = future.result()
            if error is not None:
                raise AugmentWorkerError(f"{self.fn!r} failed in augmentation worker {slot.worker.index}:\n{error}")
            shared = np.ndarray(shape, np.uint8, buffer=buffer)
            return take(shared), failures
        finally:
            del shared
            self._free.put(slot)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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
        return _check_augmented(fn(array.copy()), array.shape, repr(fn))

    def augment_batch(batch):
        images = batch["image"]
        out = tf.ensure_shape(tf.py_function(call, [images], tf.uint8), images.shape)
        return {**batch, "image": out}

    return batches.map(augment_batch, num_parallel_calls=num_parallel_calls, deterministic=deterministic)


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

    return batches.map(decode_batch, num_parallel_calls=num_parallel_calls, deterministic=deterministic)


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


# --------------------------------------------------------------------------------------
# Choosing a route from load_dataset's `augment` argument
# --------------------------------------------------------------------------------------
@dataclass
class AugmentPlan:
    per_image: Callable | None = None  # TF (image, seed) -> image, inside the decode map
    per_batch: Callable | None = None  # numpy batch -> batch, through tf.py_function
    parallel_calls: int = 1
    closers: tuple = field(default_factory=tuple)

    @property
    def decode_in_workers(self) -> bool:
        """per_batch is a ProcessPoolAugmenter whose workers also decode the JPEGs."""
        return isinstance(self.per_batch, ProcessPoolAugmenter) and self.per_batch.decode_jpegs


def resolve_augment(augment, *, workers: int | None = None, seed: int | None = None) -> AugmentPlan:
    """Turn ``load_dataset``'s ``augment`` argument into where and how augmentation runs."""
    if augment is None:
        return AugmentPlan()
    if isinstance(augment, str):
        if augment == "randaugment":
            return AugmentPlan(per_image=RandAugment())
        if augment != "imgaug":
            raise ValueError(f"augment={augment!r} is not known: use None, 'randaugment', 'imgaug', a RandAugment, "
                             "a numpy callable uint8 [B,H,W,3] -> uint8 [B,H,W,3], or a ProcessPoolAugmenter")
        augment = ImgaugRandAugment()
    if isinstance(augment, RandAugment):
        return AugmentPlan(per_image=augment)
    if isinstance(augment, ProcessPoolAugmenter):  # the caller owns (and closes) it
        return AugmentPlan(per_batch=augment, parallel_calls=augment.num_slots)
    if not callable(augment):
        raise TypeError(f"augment must be None, a string, or callable, got {type(augment).__name__}")
    workers = default_worker_count() if workers is None else workers
    if workers == 0:
        return AugmentPlan(per_batch=augment, parallel_calls=1)  # in-thread: more calls only fight for the GIL
    pool = ProcessPoolAugmenter(augment, workers, seed=seed)
    return AugmentPlan(per_batch=pool, parallel_calls=pool.num_slots, closers=(pool.close,))


# --------------------------------------------------------------------------------------
# Looking at augmentations
# --------------------------------------------------------------------------------------
def augment_images(images: np.ndarray, augment="randaugment", *, seed: int = 0) -> np.ndarray:
    """Apply one ``augment`` choice (as ``load_dataset`` takes it) to a uint8 batch, in-process."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"augment_images takes a uint8 batch [B, H, W, 3], got {images.dtype} {images.shape}")
    plan = resolve_augment(augment, workers=0, seed=seed)
    if plan.per_image is not None:
        tf = tensorflow_on_host()
        seeds = tf.random.experimental.stateless_split(tf.constant([seed, 0], tf.int64), len(images))
        data = tf.data.Dataset.from_tensor_slices((images, seeds)).map(plan.per_image)
        return np.stack(list(data.as_numpy_iterator()))
    if plan.per_batch is not None:
        np.random.seed(seed)
        return _check_augmented(plan.per_batch(images.copy()), images.shape, repr(plan.per_batch))
    return images.copy()


def show_augmented(images: np.ndarray, augment="randaugment", *, num_variants: int = 4, seed: int = 0,
                   titles: Sequence[str] | None = None, cell_size: float = 2.0):
    """A matplotlib grid: each row one image, first column the original, then augmented variants."""
    import matplotlib.pyplot as plt

    images = np.asarray(images)
    repeated = np.repeat(images, num_variants, axis=0)
    variants = augment_images(repeated, augment, seed=seed).reshape((len(images), num_variants) + images.shape[1:])
    columns = num_variants + 1
    fig, axes = plt.subplots(len(images), columns, figsize=(cell_size * columns, cell_size * len(images)),
                             squeeze=False)
    for row, image in enumerate(images):
        for col in range(columns):
            axes[row, col].imshow(image if col == 0 else variants[row, col - 1])
            axes[row, col].axis("off")
        axes[row, 0].set_title(titles[row] if titles is not None else "original", fontsize=9)
    fig.suptitle(f"augment={augment!r}", fontsize=10)
    fig.tight_layout()
    return fig
