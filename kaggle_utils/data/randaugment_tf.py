"""RandAugment in TensorFlow ops, per image inside the pipeline's parallel decode map, compiled with XLA.

Each of ``num_ops`` slots runs one drawn op in a ``tf.switch_case`` (Keras' layer computes them all). Ops and
magnitudes follow imgaug's RandAugment (``m`` in [0, 30]); :mod:`kaggle_utils.device_augment` has them in JAX.
"""

import math
from typing import Callable, Sequence

import numpy as np

from .tfhost import tf

MAX_MAGNITUDE = 30  # imgaug's RandAugment scale: m=30 is the strongest setting
FILL_VALUE = 128  # grey for pixels that geometric ops move in from outside the image
EQUALIZE_FULL_HISTOGRAM_PIXELS = 384 * 384


# Ops: uint8 [H, W, 3] image, level in [-1, 1] (sign = direction). Written for XLA: elementwise float maths it
# fuses, and geometric ops as a nearest-neighbour gather (TF's ImageProjectiveTransform cannot be compiled; nearest
# neighbour is what PIL, so the RandAugment paper and imgaug's pillike ops, use).
def _float(image):
    return tf.cast(image, "float32")


def _uint8(x):
    """Round half up and saturate to 0..255."""
    return tf.saturate_cast(x + 0.5, tf.uint8)


def _blend(degenerate, image, factor):
    """PIL's ImageEnhance: interpolate (factor < 1) or extrapolate (> 1) from ``degenerate``."""
    x = _float(image)
    return _uint8(degenerate + factor * (x - degenerate))


def _enhance_factor(level):
    return tf.clip_by_value(1.0 + 0.9 * level, 0.1, 1.9)  # imgaug: 1 +- 0.9 m/30


def _grayscale(image):
    return tf.reduce_sum(_float(image) * tf.constant([0.299, 0.587, 0.114]), axis=-1, keepdims=True)


def _warp(image, matrix):
    """Nearest-neighbour affine warp: output pixel (x, y) reads input pixel ``matrix @ (x, y, 1)``."""
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
    lo = _float(tf.reduce_min(image, axis=[0, 1]))
    hi = _float(tf.reduce_max(image, axis=[0, 1]))
    scale = tf.where(hi > lo, 255.0 / tf.maximum(hi - lo, 1.0), 1.0)
    offset = tf.where(hi > lo, lo, 0.0)
    return _uint8((_float(image) - offset) * scale)


def equalize(image, level):
    """PIL's per-channel histogram equalisation; above ``EQUALIZE_FULL_HISTOGRAM_PIXELS`` the histogram samples
    every second pixel each way (its scatter-add is XLA's slowest step on CPU; the mapping is the same up to noise)."""
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
    # a product with the identity (exact below 2^24), which XLA does not fuse into the gather, builds the table once
    # instead of once per pixel (bench/README.md)
    lut = tf.cast(tf.matmul(tf.cast(lut, tf.float32), tf.eye(256)), tf.int32)
    return tf.reshape(tf.cast(tf.gather(tf.reshape(lut, [-1]), values), tf.uint8), tf.shape(image))


def solarize(image, level):
    """Invert pixels at or above a threshold that falls from 256 (none) towards 0 (all)."""
    threshold = 256 - tf.cast(tf.abs(level) * 256.0, tf.int32)
    x = tf.cast(image, tf.int32)
    return tf.cast(tf.where(x >= threshold, 255 - x, x), tf.uint8)


def color(image, level):
    """Saturation: blend with the greyscale image."""
    return _blend(_grayscale(image), image, _enhance_factor(level))


def posterize(image, level):
    """Drop up to 6 low bits per channel."""
    dropped = tf.cast(tf.abs(level) * 6.0, tf.int32)
    mask = tf.cast(tf.bitwise.left_shift(255, dropped) % 256, tf.uint8)
    return tf.bitwise.bitwise_and(image, mask)


def contrast(image, level):
    """Blend with the mean grey level."""
    return _blend(tf.reduce_mean(_grayscale(image)), image, _enhance_factor(level))


def brightness(image, level):
    """Blend with black."""
    return _blend(0.0, image, _enhance_factor(level))


def sharpness(image, level):
    """Blend with PIL's 3x3 smoothing filter [[1,1,1],[1,5,1],[1,1,1]]/13, border unchanged: x + (1 - factor) *
    (neighbours - 8x) / 13, in integers over rows flattened to [H, 3W] (XLA vectorises these; bench/README.md)."""
    height, width = image.shape[0], image.shape[1]
    x = tf.reshape(tf.cast(image, tf.int32), [height, 3 * width])
    rows = x[:, :-6] + x[:, 3:-3] + x[:, 6:]
    box = rows[:-2] + rows[1:-1] + rows[2:]
    detail = tf.cast(tf.pad(box - 9 * x[1:-1, 3:-3], [[1, 1], [3, 3]]), tf.float32)
    out = tf.cast(x, tf.float32) + (1.0 - _enhance_factor(level)) / 13.0 * detail
    return tf.reshape(_uint8(out), [height, width, 3])


def _rotate_matrix(level, shape):
    """Rotate about the centre by up to 30 degrees."""
    angle = level * (30.0 * math.pi / 180.0)
    h, w = float(shape[0]), float(shape[1])
    cos, sin = tf.cos(angle), tf.sin(angle)
    cx, cy = (w - 1) / 2.0, (h - 1) / 2.0
    return tf.stack([cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy])


_WARP_MATRICES: dict[str, Callable] = {  # (level, image shape) -> matrix for _warp
    "rotate": _rotate_matrix,
    "shear_x": lambda level, shape: tf.stack([1.0, level * 0.3, 0.0, 0.0, 1.0, 0.0]),  # up to 0.3 (about 17 deg.)
    "shear_y": lambda level, shape: tf.stack([1.0, 0.0, 0.0, level * 0.3, 1.0, 0.0]),
    "translate_x": lambda level, shape: tf.stack([1.0, 0.0, level * 0.33 * shape[1], 0.0, 1.0, 0.0]),  # 33% of size
    "translate_y": lambda level, shape: tf.stack([1.0, 0.0, 0.0, 0.0, 1.0, level * 0.33 * shape[0]]),
}


def _warp_op(name: str) -> Callable:
    return lambda image, level: _warp(image, _WARP_MATRICES[name](level, image.shape))


RANDAUGMENT_OPS: dict[str, Callable] = {
    "identity": identity, "autocontrast": autocontrast, "equalize": equalize, "rotate": _warp_op("rotate"),
    "solarize": solarize, "color": color, "posterize": posterize, "contrast": contrast,
    "brightness": brightness, "sharpness": sharpness, "shear_x": _warp_op("shear_x"), "shear_y": _warp_op("shear_y"),
    "translate_x": _warp_op("translate_x"), "translate_y": _warp_op("translate_y"),
}


class RandAugment:
    """RandAugment(n, m): ``image uint8 [H, W, 3] (static shape), seed [2] -> uint8 [H, W, 3]``; per slot one op
    of ``ops``, a magnitude (``m``, or uniform in ``(low, high)``) on imgaug's 0..30 scale and a random sign;
    ``flip`` first mirrors half the images, as imgaug. ``jit_compile``: XLA, faster on CPU (bench/README.md).
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
        if self._compiled is None:
            self._compiled = tf.function(self._augment, jit_compile=self.jit_compile)
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
