"""RandAugment's operations in JAX: ``uint8 [H, W, 3] image, level in [-1, 1] -> uint8 [H, W, 3]``.

The TF-native ops of :mod:`kaggle_utils.data.randaugment_tf` step for step (what each op does is said there), so
they round identically and pick the same pixels; jittable with a traced ``level``. The geometric ops are one affine
warp each.
"""
import math
from typing import Callable

import jax
import jax.numpy as jnp
from jax import lax

FILL_VALUE = 128  # grey for pixels that geometric ops move in from outside the image (as the TF ops)
EQUALIZE_FULL_HISTOGRAM_PIXELS = 384 * 384  # above this the TF op subsamples its histogram; so does this one


def _float(image: jax.Array) -> jax.Array:
    return image.astype(jnp.float32)


def _uint8(x: jax.Array) -> jax.Array:
    """Round half up and saturate to 0..255 (TF's ``saturate_cast(x + 0.5, uint8)``)."""
    return jnp.clip(x + 0.5, 0.0, 255.0).astype(jnp.uint8)


def _blend(degenerate, image: jax.Array, factor: jax.Array) -> jax.Array:
    """PIL's ImageEnhance: interpolate (factor < 1) or extrapolate (> 1) from ``degenerate``."""
    x = _float(image)
    return _uint8(degenerate + factor * (x - degenerate))


def _enhance_factor(level: jax.Array) -> jax.Array:
    return jnp.clip(1.0 + 0.9 * level, 0.1, 1.9)


def _grayscale(image: jax.Array) -> jax.Array:
    weights = jnp.asarray([0.299, 0.587, 0.114], jnp.float32)
    return jnp.sum(_float(image) * weights, axis=-1, keepdims=True)


# ------------------------------------------------------------------ geometric ops: one affine warp
def warp(image: jax.Array, matrix: jax.Array) -> jax.Array:
    """Nearest-neighbour affine warp: output pixel (x, y) reads input pixel ``matrix @ (x, y, 1)``; one
    gather of whole pixels, RandAugment's one costly step on a TPU (so a policy runs one warp per slot)."""
    height, width = image.shape[0], image.shape[1]
    ys, xs = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32), jnp.arange(width, dtype=jnp.float32),
                          indexing="ij")
    source_x = jnp.round(matrix[0] * xs + matrix[1] * ys + matrix[2])
    source_y = jnp.round(matrix[3] * xs + matrix[4] * ys + matrix[5])
    inside = (source_x >= 0) & (source_x <= width - 1) & (source_y >= 0) & (source_y <= height - 1)
    index = (jnp.clip(source_y, 0, height - 1) * width + jnp.clip(source_x, 0, width - 1)).astype(jnp.int32)
    pixels = jnp.take(image.reshape(-1, 3), index.reshape(-1), axis=0, mode="clip").reshape(height, width, 3)
    return jnp.where(inside[..., None], pixels, jnp.uint8(FILL_VALUE))


def _rotate_matrix(level: jax.Array, shape) -> jax.Array:
    """Rotate about the centre by up to 30 degrees."""
    angle = level * (30.0 * math.pi / 180.0)
    h, w = float(shape[0]), float(shape[1])
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    cx, cy = (w - 1) / 2.0, (h - 1) / 2.0
    return jnp.stack([cos, -sin, cx - cos * cx + sin * cy, sin, cos, cy - sin * cx - cos * cy])


def _affine(level: jax.Array, scale: float, position: int) -> jax.Array:
    """The identity matrix with ``level * scale`` at ``position`` (a shear or a translation)."""
    identity_matrix = jnp.asarray([1.0, 0.0, 0.0, 0.0, 1.0, 0.0], jnp.float32)
    return identity_matrix.at[position].set(level * scale)


WARP_MATRICES: dict[str, Callable] = {  # (level, image shape) -> matrix for warp
    "rotate": _rotate_matrix,
    "shear_x": lambda level, shape: _affine(level, 0.3, 1),  # up to 0.3 (about 17 degrees)
    "shear_y": lambda level, shape: _affine(level, 0.3, 3),
    "translate_x": lambda level, shape: _affine(level * 0.33, shape[1], 2),  # up to 33% of the size
    "translate_y": lambda level, shape: _affine(level * 0.33, shape[0], 5),
}


def _warp_op(name: str) -> Callable:
    """The op ``name``: a nearest-neighbour warp by its matrix (the TF op's)."""
    return lambda image, level: warp(image, WARP_MATRICES[name](jnp.asarray(level, jnp.float32), image.shape))


# ------------------------------------------------------------------ pixel ops
def identity(image: jax.Array, level) -> jax.Array:
    return image


def autocontrast(image: jax.Array, level) -> jax.Array:
    lo = _float(jnp.min(image, axis=(0, 1)))
    hi = _float(jnp.max(image, axis=(0, 1)))
    scale = jnp.where(hi > lo, 255.0 / jnp.maximum(hi - lo, 1.0), 1.0)
    offset = jnp.where(hi > lo, lo, 0.0)
    return _uint8((_float(image) - offset) * scale)


def equalize(image: jax.Array, level) -> jax.Array:
    """PIL's per-channel histogram equalisation, as the TF op (same subsampling above 384x384). The table
    goes through a product with the identity: XLA fuses no dot into its consumers, so it is built once,
    not once per pixel of the lookup."""
    offsets = jnp.asarray([0, 256, 512], jnp.int32)
    values = (image.astype(jnp.int32) + offsets).reshape(-1)
    stride = 2 if image.shape[0] * image.shape[1] > EQUALIZE_FULL_HISTOGRAM_PIXELS else 1
    sampled = (image[::stride, ::stride].astype(jnp.int32) + offsets).reshape(-1)
    histogram = jnp.zeros(768, jnp.int32).at[sampled].add(1, mode="drop").reshape(3, 256)
    last_used = 255 - jnp.argmax(histogram[:, ::-1] > 0, axis=1)
    last_count = jnp.take_along_axis(histogram, last_used[:, None], axis=1)[:, 0]
    step = (jnp.sum(histogram, axis=1) - last_count) // 255
    safe_step = jnp.maximum(step, 1)[:, None]
    lut = (jnp.cumsum(histogram, axis=1) + safe_step // 2) // safe_step
    lut = jnp.clip(jnp.concatenate([jnp.zeros((3, 1), jnp.int32), lut[:, :-1]], axis=1), 0, 255)
    lut = jnp.where(step[:, None] > 0, lut, jnp.arange(256, dtype=jnp.int32)[None])  # a flat channel stays
    lut = jnp.dot(lut.astype(jnp.float32), jnp.eye(256, dtype=jnp.float32),
                  precision=lax.Precision.HIGHEST).astype(jnp.int32)  # exact: integers below 2^24
    return jnp.take(lut.reshape(-1), values, mode="clip").astype(jnp.uint8).reshape(image.shape)


def solarize(image: jax.Array, level) -> jax.Array:
    threshold = 256 - (jnp.abs(level) * 256.0).astype(jnp.int32)
    x = image.astype(jnp.int32)
    return jnp.where(x >= threshold, 255 - x, x).astype(jnp.uint8)


def color(image: jax.Array, level) -> jax.Array:
    return _blend(_grayscale(image), image, _enhance_factor(level))


def posterize(image: jax.Array, level) -> jax.Array:
    dropped = (jnp.abs(level) * 6.0).astype(jnp.int32)
    mask = (jnp.left_shift(jnp.int32(255), dropped) % 256).astype(jnp.uint8)
    return image & mask


def contrast(image: jax.Array, level) -> jax.Array:
    return _blend(jnp.mean(_grayscale(image)), image, _enhance_factor(level))


def brightness(image: jax.Array, level) -> jax.Array:
    return _blend(0.0, image, _enhance_factor(level))


def sharpness(image: jax.Array, level) -> jax.Array:
    """Blend with PIL's 3x3 smoothing filter [[1,1,1],[1,5,1],[1,1,1]]/13, border pixels unchanged; integer
    box sums over the image as [H, 3W] (neighbours 3 apart), as the TF op: shifted adds, one fused pass."""
    height, width = image.shape[0], image.shape[1]
    x = image.astype(jnp.int32).reshape(height, 3 * width)
    rows = x[:, :-6] + x[:, 3:-3] + x[:, 6:]
    box = rows[:-2] + rows[1:-1] + rows[2:]
    detail = jnp.pad(box - 9 * x[1:-1, 3:-3], ((1, 1), (3, 3))).astype(jnp.float32)
    out = x.astype(jnp.float32) + (1.0 - _enhance_factor(level)) / 13.0 * detail
    return _uint8(out).reshape(height, width, 3)


RANDAUGMENT_OPS: dict[str, Callable] = {  # the TF op table's names and order
    "identity": identity, "autocontrast": autocontrast, "equalize": equalize, "rotate": _warp_op("rotate"),
    "solarize": solarize, "color": color, "posterize": posterize, "contrast": contrast,
    "brightness": brightness, "sharpness": sharpness, "shear_x": _warp_op("shear_x"), "shear_y": _warp_op("shear_y"),
    "translate_x": _warp_op("translate_x"), "translate_y": _warp_op("translate_y"),
}
