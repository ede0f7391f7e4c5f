"""RandAugment's operations, written once for the input pipeline's TensorFlow and the train step's JAX.

An op is ``(xp, image, level) -> image``: uint8 ``[H, W, 3]`` (static shape), level in [-1, 1] (sign = direction),
``xp`` the backend's primitives (``data.augment`` and ``device_augment.randaugment`` each bind theirs), so the two
run the same steps, round identically and pick the same pixels; this module imports neither stack. Ops and
magnitudes follow imgaug's RandAugment (``m`` in [0, 30]). Written for XLA: elementwise float maths it fuses, and
geometric ops as one nearest-neighbour gather (TF's ImageProjectiveTransform cannot be compiled; nearest neighbour
is what PIL, so the RandAugment paper and imgaug's pillike ops, use).
"""
import functools
import math
import numbers
from typing import Callable, Sequence

MAX_MAGNITUDE = 30  # imgaug's RandAugment scale: m=30 is the strongest setting
FILL_VALUE = 128  # grey for pixels that geometric ops move in from outside the image
EQUALIZE_FULL_HISTOGRAM_PIXELS = 384 * 384
OP_NAMES = ("identity", "autocontrast", "equalize", "rotate", "solarize", "color", "posterize", "contrast",
            "brightness", "sharpness", "shear_x", "shear_y", "translate_x", "translate_y")


def check_policy(what: str, num_ops: int, magnitude, ops: Sequence[str]) -> tuple[float, float]:
    """A policy's magnitude as ``(low, high)``, after refusing settings that are not one (``what``: whose)."""
    low, high = (magnitude, magnitude) if isinstance(magnitude, numbers.Real) else tuple(magnitude)
    if not 0 <= low <= high <= MAX_MAGNITUDE:
        raise ValueError(f"{what}: magnitude must be in [0, {MAX_MAGNITUDE}] (imgaug's scale) with low <= high, "
                         f"got {magnitude}")
    unknown = [name for name in ops if name not in OP_NAMES]
    if unknown or not ops:
        raise ValueError(f"{what}: unknown RandAugment ops {unknown} or none given; choose from {list(OP_NAMES)}")
    if num_ops < 0:
        raise ValueError(f"{what}: num_ops must be >= 0, got {num_ops}")
    return float(low), float(high)


def _blend(xp, degenerate, image, factor):
    """PIL's ImageEnhance: interpolate (factor < 1) or extrapolate (> 1) from ``degenerate``."""
    x = xp.float32(image)
    return xp.round_to_uint8(degenerate + factor * (x - degenerate))


def _enhance_factor(xp, level):
    return xp.clip(1.0 + 0.9 * level, 0.1, 1.9)  # imgaug: 1 +- 0.9 m/30


def _grayscale(xp, image):
    return xp.sum(xp.float32(image) * xp.float32([0.299, 0.587, 0.114]), -1, keepdims=True)


def warp(xp, image, matrix):
    """Nearest-neighbour affine warp: output pixel (x, y) reads input pixel ``matrix @ (x, y, 1)``; one gather of
    whole pixels, RandAugment's one costly step on a TPU (so the device policy runs one warp per slot)."""
    height, width = image.shape[0], image.shape[1]
    ys, xs = xp.meshgrid(xp.arange(height, "float32"), xp.arange(width, "float32"), indexing="ij")
    source_x = xp.round(matrix[0] * xs + matrix[1] * ys + matrix[2])
    source_y = xp.round(matrix[3] * xs + matrix[4] * ys + matrix[5])
    inside = (source_x >= 0) & (source_x <= width - 1) & (source_y >= 0) & (source_y <= height - 1)
    index = xp.int32(xp.clip(source_y, 0, height - 1) * width + xp.clip(source_x, 0, width - 1))
    pixels = xp.reshape(xp.take(xp.reshape(image, [-1, 3]), xp.reshape(index, [-1])), [height, width, 3])
    return xp.where(inside[..., None], pixels, xp.uint8(FILL_VALUE))


def _rotate_matrix(xp, level, shape):
    """Rotate about the centre by up to 30 degrees."""
    angle = level * (30.0 * math.pi / 180.0)
    h, w = float(shape[0]), float(shape[1])
    cos, sin = xp.cos(angle), xp.sin(angle)
    cx, cy = (w - 1) / 2.0, (h - 1) / 2.0
    return xp.stack([cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy])


def warp_matrices(xp) -> dict[str, Callable]:
    """``name -> (level, image shape) -> matrix`` for :func:`warp`, of the geometric ops."""
    return {
        "rotate": functools.partial(_rotate_matrix, xp),
        "shear_x": lambda level, shape: xp.stack([1.0, level * 0.3, 0.0, 0.0, 1.0, 0.0]),  # up to 0.3 (~17 degrees)
        "shear_y": lambda level, shape: xp.stack([1.0, 0.0, 0.0, level * 0.3, 1.0, 0.0]),
        "translate_x": lambda level, shape: xp.stack([1.0, 0.0, level * 0.33 * shape[1], 0.0, 1.0, 0.0]),  # 33% of size
        "translate_y": lambda level, shape: xp.stack([1.0, 0.0, 0.0, 0.0, 1.0, level * 0.33 * shape[0]]),
    }


def identity(xp, image, level):
    return image


def autocontrast(xp, image, level):
    """Stretch each channel to the full 0..255 range."""
    lo = xp.float32(xp.min(image, [0, 1]))
    hi = xp.float32(xp.max(image, [0, 1]))
    scale = xp.where(hi > lo, 255.0 / xp.maximum(hi - lo, 1.0), 1.0)
    offset = xp.where(hi > lo, lo, 0.0)
    return xp.round_to_uint8((xp.float32(image) - offset) * scale)


def equalize(xp, image, level):
    """PIL's per-channel histogram equalisation; above ``EQUALIZE_FULL_HISTOGRAM_PIXELS`` the histogram samples
    every second pixel each way (its scatter-add is XLA's slowest step on CPU; the mapping is the same up to noise)."""
    offsets = xp.int32([0, 256, 512])
    values = xp.reshape(xp.int32(image) + offsets, [-1])
    stride = 2 if image.shape[0] * image.shape[1] > EQUALIZE_FULL_HISTOGRAM_PIXELS else 1
    sampled = xp.reshape(xp.int32(image[::stride, ::stride]) + offsets, [-1])
    histogram = xp.reshape(xp.histogram(sampled, 768), [3, 256])
    last_used = xp.last_nonzero(histogram)
    last_count = xp.take_along_rows(histogram, last_used)
    step = (xp.sum(histogram, 1) - last_count) // 255
    safe_step = xp.maximum(step, 1)[:, None]
    lut = (xp.cumsum(histogram, 1) + safe_step // 2) // safe_step
    lut = xp.clip(xp.concat([xp.zeros([3, 1]), lut[:, :-1]], 1), 0, 255)
    lut = xp.where(step[:, None] > 0, lut, xp.arange(256)[None])  # a flat channel stays as it is
    # a product with the identity (exact below 2^24), which XLA does not fuse into the gather, builds the table once
    # instead of once per pixel (bench/README.md)
    lut = xp.int32(xp.identity_product(xp.float32(lut)))
    return xp.reshape(xp.uint8(xp.take(xp.reshape(lut, [-1]), values)), image.shape)


def solarize(xp, image, level):
    """Invert pixels at or above a threshold that falls from 256 (none) towards 0 (all)."""
    threshold = 256 - xp.int32(xp.abs(level) * 256.0)
    x = xp.int32(image)
    return xp.uint8(xp.where(x >= threshold, 255 - x, x))


def color(xp, image, level):
    """Saturation: blend with the greyscale image."""
    return _blend(xp, _grayscale(xp, image), image, _enhance_factor(xp, level))


def posterize(xp, image, level):
    """Drop up to 6 low bits per channel."""
    dropped = xp.int32(xp.abs(level) * 6.0)
    return xp.bitwise_and(image, xp.uint8(xp.left_shift(255, dropped) % 256))


def contrast(xp, image, level):
    """Blend with the mean grey level."""
    return _blend(xp, xp.mean(_grayscale(xp, image)), image, _enhance_factor(xp, level))


def brightness(xp, image, level):
    """Blend with black."""
    return _blend(xp, 0.0, image, _enhance_factor(xp, level))


def sharpness(xp, image, level):
    """Blend with PIL's 3x3 smoothing filter [[1,1,1],[1,5,1],[1,1,1]]/13, border unchanged: x + (1 - factor) *
    (neighbours - 8x) / 13, in integers over rows flattened to [H, 3W] (XLA vectorises these; bench/README.md)."""
    height, width = image.shape[0], image.shape[1]
    x = xp.reshape(xp.int32(image), [height, 3 * width])
    rows = x[:, :-6] + x[:, 3:-3] + x[:, 6:]
    box = rows[:-2] + rows[1:-1] + rows[2:]
    detail = xp.float32(xp.pad(box - 9 * x[1:-1, 3:-3], [[1, 1], [3, 3]]))
    out = xp.float32(x) + (1.0 - _enhance_factor(xp, level)) / 13.0 * detail
    return xp.reshape(xp.round_to_uint8(out), [height, width, 3])


def op_table(xp) -> dict[str, Callable]:
    """``name -> (image, level) -> image`` on the backend ``xp``, in the policy's order."""
    matrices = warp_matrices(xp)

    def warp_op(name):
        return lambda image, level: warp(xp, image, matrices[name](xp.float32(level), image.shape))

    pixel = {fn.__name__: functools.partial(fn, xp) for fn in (
        identity, autocontrast, equalize, solarize, color, posterize, contrast, brightness, sharpness)}
    return {name: pixel[name] if name in pixel else warp_op(name) for name in OP_NAMES}
