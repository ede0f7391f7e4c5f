"""Augmentation in the input pipeline: per image in TF ops, or per batch in numpy.

``"randaugment"`` / a :class:`RandAugment`: TF ops inside the parallel decode map, from the image's stateless seed,
compiled with XLA; each of ``num_ops`` slots runs one drawn op in a ``tf.switch_case`` (Keras' layer computes them
all), the ops (:mod:`kaggle_utils.randaugment_ops`) the device RandAugment's on TF's primitives. ``"imgaug"``
(:class:`ImgaugRandAugment`) or any numpy callable ``uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]``: once per batch
through ``tf.py_function``, by default in worker processes (one per core) that also decode the JPEGs;
``augment_workers=0`` runs it in the tf.data thread, where the GIL holds it to one core however many there are
(bench/README.md). ``random`` and ``np.random`` are seeded per batch either way. ``"color-jitter"`` /
a :class:`ColorJitter`: timm's default colour jitter, TF ops in the decode map like RandAugment.
"""

import importlib
import sys
import threading
import types
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..randaugment_ops import MAX_MAGNITUDE, check_policy, op_table
from .augment_workers import ProcessPoolAugmenter, apply_seeded, default_worker_count
from .tfhost import tf
from .tfrecords import RecordProblem


# ---------- RandAugment in TF ops
# randaugment_ops' primitives as TF ops (lambdas: TensorFlow is imported on first use)
TF_PRIMITIVES = types.SimpleNamespace(
    float32=lambda x: tf.cast(x, tf.float32), int32=lambda x: tf.cast(x, tf.int32),
    uint8=lambda x: tf.cast(x, tf.uint8) if tf.is_tensor(x) else tf.constant(x, tf.uint8),
    round_to_uint8=lambda x: tf.saturate_cast(x + 0.5, tf.uint8),  # round half up and saturate to 0..255
    arange=lambda n, dtype="int32": tf.range(n, dtype=dtype), zeros=lambda shape: tf.zeros(shape, tf.int32),
    meshgrid=lambda *args, indexing: tf.meshgrid(*args, indexing=indexing),
    reshape=lambda x, shape: tf.reshape(x, shape), stack=lambda xs: tf.stack(xs),
    concat=lambda xs, axis: tf.concat(xs, axis), pad=lambda x, widths: tf.pad(x, widths),
    take=lambda x, index: tf.gather(x, index), take_along_rows=lambda x, index: tf.gather(x, index, batch_dims=1),
    where=lambda c, a, b: tf.where(c, a, b), clip=lambda x, lo, hi: tf.clip_by_value(x, lo, hi),
    maximum=lambda a, b: tf.maximum(a, b), round=lambda x: tf.round(x), abs=lambda x: tf.abs(x),
    cos=lambda x: tf.cos(x), sin=lambda x: tf.sin(x),
    sum=lambda x, axis, keepdims=False: tf.reduce_sum(x, axis=axis, keepdims=keepdims),
    mean=lambda x: tf.reduce_mean(x), min=lambda x, axis: tf.reduce_min(x, axis=axis),
    max=lambda x, axis: tf.reduce_max(x, axis=axis), cumsum=lambda x, axis: tf.cumsum(x, axis=axis),
    histogram=lambda values, size: tf.math.unsorted_segment_sum(tf.ones_like(values), values, size),
    last_nonzero=lambda x: x.shape[1] - 1 - tf.argmax(tf.reverse(tf.cast(x > 0, tf.int32), [1]), axis=1,
                                                      output_type=tf.int32),
    identity_product=lambda x: tf.matmul(x, tf.eye(x.shape[-1])),
    left_shift=lambda a, b: tf.bitwise.left_shift(a, b), bitwise_and=lambda a, b: tf.bitwise.bitwise_and(a, b),
)
RANDAUGMENT_OPS = op_table(TF_PRIMITIVES)


class RandAugment:
    """RandAugment(n, m): ``image uint8 [H, W, 3] (static shape), seed [2] -> uint8 [H, W, 3]``; per slot one op
    of ``ops``, a magnitude (``m``, or uniform in ``(low, high)``) on imgaug's 0..30 scale and a random sign;
    ``flip`` first mirrors half the images, as imgaug. ``jit_compile``: XLA, faster on CPU (bench/README.md).
    """

    def __init__(self, num_ops: int = 2, magnitude: float | tuple[float, float] = 15, *,
                 ops: Sequence[str] = tuple(RANDAUGMENT_OPS), flip: bool = True, jit_compile: bool = True):
        self.magnitude = check_policy("RandAugment", num_ops, magnitude, ops)
        self.num_ops, self.flip, self.ops, self.jit_compile = num_ops, flip, tuple(ops), jit_compile
        self._compiled = None

    def __repr__(self):
        return (f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, ops={len(self.ops)}, "
                f"flip={self.flip}, jit_compile={self.jit_compile})")

    def __call__(self, image, seed):
        if self._compiled is None:
            self._compiled = tf.function(self._augment, jit_compile=self.jit_compile, autograph=False)
        # drawn outside the compiled function: XLA's stateless RNG gives other numbers than TF's
        draws = tf.random.stateless_uniform([3 * self.num_ops + 1], seed=seed)
        return self._compiled(tf.convert_to_tensor(image), draws)

    def _augment(self, image, draws):
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


# ---------- imgaug
_IMPORT_LOCK = threading.Lock()


class _NumpyWithLegacyAliases(types.ModuleType):
    """NumPy plus ``complex``, the alias NumPy 1.24 removed, for imgaug's own modules."""

    complex = complex

    def __getattr__(self, name):
        return getattr(np, name)


def import_imgaug_augmenters():
    """``imgaug.augmenters`` (``iaa``), imgaug 0.4 working on NumPy 2 without changing NumPy for anyone else:
    ``np.sctypes`` (read at import time) exists only while imgaug's modules execute; ``np.complex`` (read at call
    time by ``imgaug.parameters``) is given to that module alone. ImportError with the install hint where imgaug is
    not installed (Kaggle's TPU image)."""
    with _IMPORT_LOCK:
        if "imgaug.augmenters" not in sys.modules:
            added = not hasattr(np, "sctypes")
            if added:  # the dict NumPy 1.x built, concrete types only
                np.sctypes = {kind: [getattr(np, n) for n in names.split() if hasattr(np, n)] for kind, names in (
                    ("int", "int8 int16 int32 int64"), ("uint", "uint8 uint16 uint32 uint64"),
                    ("float", "float16 float32 float64 longdouble"), ("complex", "complex64 complex128 clongdouble"))}
                np.sctypes["others"] = [bool, object, bytes, str, np.void]
            try:
                importlib.import_module("imgaug.augmenters")
            except ModuleNotFoundError as err:
                if err.name != "imgaug":
                    raise
                raise ImportError("the 'imgaug' augmentation needs the imgaug package (pip install imgaug==0.4.0); "
                                  "or use augment='randaugment', the TensorFlow-native version") from err
            finally:
                if added:
                    del np.sctypes
        parameters = sys.modules["imgaug.parameters"]
        if not isinstance(parameters.np, _NumpyWithLegacyAliases):
            parameters.np = _NumpyWithLegacyAliases("numpy")
        return sys.modules["imgaug.augmenters"]


class ImgaugRandAugment:
    """imgaug's ``RandAugment(n, m)`` as a picklable batch callable, drawing from ``np.random`` (seeded per batch)."""

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
        seed = int(np.random.randint(2**31 - 1))  # before building: imgaug's constructors draw from np.random too
        if self._augmenter is None:
            self._augmenter = import_imgaug_augmenters().RandAugment(n=self.n, m=self.m)
        self._augmenter.seed_(seed)
        return np.asarray(self._augmenter(images=images))


@dataclass(frozen=True)
class ColorJitter:
    """timm's default training colour jitter (``--color-jitter 0.4``, hue off; torchvision's ColorJitter on PIL
    images): brightness, contrast and saturation factors each uniform in ``[max(0, 1 - strength), 1 + strength]``,
    in a random order, each a blend with black, the mean grey or the pixel's grey (ITU-R 601 luma), clipped to
    0..255; ``image uint8 [H, W, 3], seed [2] -> uint8``. timm applies it only when no RandAugment is chosen, so it is
    one ``--augment`` choice."""
    strength: float = 0.4

    def __post_init__(self):
        if not 0 < self.strength <= 1:
            raise ValueError(f"colour jitter strength must be in (0, 1], got {self.strength}")

    def __call__(self, image, seed):
        order_seed, *factor_seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 4))
        low, high = max(0.0, 1 - self.strength), 1 + self.strength
        brightness, contrast, saturation = (tf.random.stateless_uniform([], s, low, high) for s in factor_seeds)
        grey = lambda x: tf.reduce_sum(x * tf.constant([0.299, 0.587, 0.114]), axis=-1, keepdims=True)  # noqa: E731
        blend = lambda x, other, f: tf.clip_by_value(f * x + (1 - f) * other, 0.0, 255.0)  # noqa: E731
        ops = (lambda x: blend(x, 0.0, brightness),
               lambda x: blend(x, tf.reduce_mean(grey(x)), contrast),
               lambda x: blend(x, grey(x), saturation))
        orders = ((0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0))

        def in_order(order):
            def run():
                x = tf.cast(image, tf.float32)
                for k in order:
                    x = ops[k](x)
                return x
            return run

        which = tf.random.stateless_uniform([], order_seed, 0, len(orders), dtype=tf.int32)
        jittered = tf.switch_case(which, [in_order(order) for order in orders])
        return tf.ensure_shape(tf.cast(tf.round(jittered), tf.uint8), image.shape)


@dataclass(frozen=True)
class AugmentPlan:
    per_image: Callable | None = None  # TF (image, seed) -> image, inside the decode map
    per_batch: Callable | None = None  # numpy batch -> batch: a ProcessPoolAugmenter, or run in the tf.data thread
    closers: tuple = ()  # pools made here, closed with the dataset

    @property
    def decodes_jpegs(self) -> bool:
        """Whether the per-batch step's workers decode the JPEGs (tf.data then only parses the records)."""
        return isinstance(self.per_batch, ProcessPoolAugmenter) and self.per_batch.decode_jpegs


def resolve_augment(augment, *, workers: int | None = None) -> AugmentPlan:
    """``load_dataset``'s ``augment`` -> where it runs; ``workers``: processes for a numpy callable (default one per
    core, 0: the tf.data thread). A ProcessPoolAugmenter given is the caller's to close."""
    if augment is None:
        return AugmentPlan()
    if isinstance(augment, str):
        if augment == "randaugment":
            return AugmentPlan(per_image=RandAugment())
        if augment == "color-jitter":
            return AugmentPlan(per_image=ColorJitter())
        if augment != "imgaug":
            raise ValueError(f"augment={augment!r} is not known: use None, 'randaugment', 'imgaug', 'color-jitter', "
                             "a RandAugment, a ColorJitter, a numpy callable uint8 [B,H,W,3] -> uint8 [B,H,W,3], or a "
                             "ProcessPoolAugmenter")
        augment = ImgaugRandAugment()
    if isinstance(augment, (RandAugment, ColorJitter)):
        return AugmentPlan(per_image=augment)
    if isinstance(augment, ProcessPoolAugmenter):
        return AugmentPlan(per_batch=augment)
    if not callable(augment):
        raise TypeError(f"augment must be None, a string, or callable, got {type(augment).__name__}")
    workers = default_worker_count() if workers is None else workers
    if workers == 0:
        return AugmentPlan(per_batch=augment)
    pool = ProcessPoolAugmenter(augment, workers)
    return AugmentPlan(per_batch=pool, closers=(pool.close,))


def per_image_ops(crop, augment):
    """``(image, seed) -> image``: ``crop``, then the TF-native ``augment``, each on its own part of the seed."""
    if crop is None or augment is None:
        return crop or augment or (lambda image, seed: image)

    def crop_then_augment(image, seed):
        crop_seed, augment_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        return augment(crop(image, crop_seed), augment_seed)

    return crop_then_augment


def augment_batches(batches, fn, *, seed: int, image_shape, problems, deterministic: bool = True):
    """``fn`` on each batch's ``image`` (or its ``jpeg`` bytes, which a pool's workers decode) through
    ``tf.py_function``, a seed per batch. ``problems`` gets a JPEG that did not decode (``mask`` False) and any
    exception of ``fn`` before TensorFlow wraps it."""
    pool = fn if isinstance(fn, ProcessPoolAugmenter) else None

    def call(data, names, indices, batch_seed):
        try:
            batch_seed, data = int(batch_seed), data.numpy()
            if pool is not None:
                shape = None if data.dtype == np.uint8 else image_shape
                images, failures = pool.run(list(data) if shape else data, seed=batch_seed, image_shape=shape,
                                            take=_tensor_copy)
            else:
                images, failures = apply_seeded(fn, data.copy(), batch_seed), []
        except BaseException as err:
            problems.record_error(err)
            raise
        mask = np.ones(len(data), bool)
        for i, why in failures:
            problems.add(RecordProblem(names[i].numpy().decode(), int(indices[i]), why))
            mask[i] = False
        return images, mask

    def augment(batch, batch_seed):
        batch = dict(batch)
        data = batch.pop("jpeg") if "jpeg" in batch else batch["image"]
        names, indices = batch.pop("name", tf.zeros([0], tf.string)), batch.pop("index", tf.zeros([0], tf.int64))
        images, mask = tf.py_function(call, [data, names, indices, batch_seed], [tf.uint8, tf.bool])
        return {**batch, "image": tf.ensure_shape(images, data.shape[:1].concatenate(image_shape)),
                "mask": tf.ensure_shape(mask, data.shape[:1])}

    seeds = tf.data.Dataset.random(seed=seed + 1, rerandomize_each_iteration=True)
    return tf.data.Dataset.zip(batches, seeds).map(augment, num_parallel_calls=pool.num_slots if pool else 1,
                                                   deterministic=deterministic)


def _tensor_copy(shared: np.ndarray):
    """A tensor holding a copy of ``shared`` (a view of a worker's shared memory, reused after this)."""
    tensor = tf.convert_to_tensor(shared)
    if np.asarray(tensor).ctypes.data == shared.ctypes.data:  # a TF build that aliases numpy memory
        tensor = tf.convert_to_tensor(shared.copy())
    return tensor


# ---------- Looking at augmentations
def augment_images(images: np.ndarray, augment="randaugment", *, seed: int = 0) -> np.ndarray:
    """Apply one ``augment`` choice (as ``load_dataset`` takes it) to a uint8 batch, in-process."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 4:
        raise ValueError(f"augment_images takes a uint8 batch [B, H, W, 3], got {images.dtype} {images.shape}")
    plan = resolve_augment(augment, workers=0)
    if plan.per_image is not None:
        seeds = tf.random.experimental.stateless_split(tf.constant([seed, 0], tf.int64), len(images))
        data = tf.data.Dataset.from_tensor_slices((images, seeds)).map(plan.per_image)
        return np.stack(list(data.as_numpy_iterator()))
    if plan.per_batch is not None:
        return apply_seeded(plan.per_batch, images.copy(), seed)
    return images.copy()


def show_augmented(images: np.ndarray, augment="randaugment", *, num_variants: int = 4, seed: int = 0,
                   titles: Sequence[str] | None = None, cell_size: float = 2.0):
    """A matplotlib grid: each row one image, first column the original, then augmented variants."""
    import matplotlib.pyplot as plt  # only here: drawing is no part of the pipeline

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
