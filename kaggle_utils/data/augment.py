"""Augmentation for the input pipeline: which route ``load_dataset(..., augment=...)`` takes.

Two routes:

* ``"randaugment"`` or a :class:`~kaggle_utils.data.randaugment_tf.RandAugment`: TensorFlow
  ops on one uint8 image inside the parallel decode map, compiled with XLA
  (:mod:`kaggle_utils.data.randaugment_tf`).
* ``"imgaug"`` (imgaug's ``RandAugment(n=2, m=15)``) or any numpy callable
  ``uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]``, run once per batch through ``tf.py_function``
  (:mod:`kaggle_utils.data.numpy_augment`), by default in worker processes that also decode
  the JPEGs (:mod:`kaggle_utils.data.augment_workers`).

:func:`resolve_augment` turns the argument into an :class:`AugmentPlan`; :func:`augment_images`
and :func:`show_augmented` apply one choice in-process, to look at what it does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .augment_workers import ProcessPoolAugmenter, check_augmented, default_worker_count
from .numpy_augment import ImgaugRandAugment
from .randaugment_tf import RandAugment
from .tfhost import tensorflow_on_host

__all__ = ["AugmentPlan", "augment_images", "resolve_augment", "show_augmented"]


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
        return check_augmented(plan.per_batch(images.copy()), images.shape, repr(plan.per_batch))
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
