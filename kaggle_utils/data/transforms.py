"""Image transforms in TensorFlow ops, for the parallel tf.data map: decode any file, resize, crop.

:func:`decode_image` ignores EXIF orientation, as TF, torchvision's ``read_image`` and PIL's ``Image.open`` do.
Each transform is ``(image, seed) -> uint8 [size, size, 3]``, randomness stateless from the per-image seed;
resizes are antialiased as PIL's, so an eval crop matches timm's PIL transform within a grey level.
"""

import math
from dataclasses import dataclass

from ..registry import INTERPOLATIONS, TRAIN_CROPS
from .jpeg import DCT_METHOD
from .tfhost import tf

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_RRC_ATTEMPTS = 10  # torchvision / timm try 10 random boxes before falling back to a centre crop


def decode_image(encoded):
    """JPEG, PNG (16-bit rounded), GIF, BMP or WebP bytes of any mode -> uint8 [H, W, 3]; raises on bytes that are
    no image."""

    def decode_png16():  # every PNG, so 16-bit ones keep their full range until the rounding
        wide = tf.io.decode_png(encoded, channels=3, dtype=tf.uint16)
        return tf.cast(tf.round(tf.cast(wide, tf.float32) / 257.0), tf.uint8)

    def decode_other():  # GIF (first frame), BMP, WebP
        return tf.io.decode_image(encoded, channels=3, dtype=tf.uint8, expand_animations=False)

    is_png = tf.equal(tf.strings.substr(encoded, 0, len(_PNG_SIGNATURE)), _PNG_SIGNATURE)
    image = tf.case([(tf.io.is_jpeg(encoded), lambda: tf.io.decode_jpeg(encoded, channels=3, dct_method=DCT_METHOD)),
                     (is_png, decode_png16)], default=decode_other)
    return tf.ensure_shape(image, [None, None, 3])


def _check_size_and_interpolation(transform) -> None:
    if not isinstance(transform.size, int) or transform.size < 1:
        raise ValueError(f"size must be a positive int, got {transform.size!r}")
    if transform.interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {transform.interpolation!r}")


def resize_image(image, height, width, interpolation: str = "bilinear"):
    """uint8 [H, W, 3] -> uint8 [height, width, 3], rounded; antialiased only where it shrinks (enlarging, it
    changes nothing but costs ~2.5x, bench/README.md)."""
    size = tf.stack([height, width])
    resized = tf.cond(tf.reduce_any(size < tf.shape(image)[:2]),
                      lambda: tf.image.resize(image, size, method=interpolation, antialias=True),
                      lambda: tf.image.resize(image, size, method=interpolation))
    return tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)


@dataclass(frozen=True)
class Resize:
    """Squash the whole image to ``size`` x ``size`` (the aspect ratio is not kept; nothing is cut)."""
    size: int
    interpolation: str = "bilinear"

    def __post_init__(self):
        _check_size_and_interpolation(self)

    def __call__(self, image, seed=None):
        return tf.ensure_shape(resize_image(image, self.size, self.size, self.interpolation), [self.size, self.size, 3])


@dataclass(frozen=True)
class CenterCrop:
    """timm's eval transform: shorter side -> ``floor(size / crop_pct)``, then the centre ``size`` x ``size``,
    rounded as torchvision does so that the pixels line up with timm's for the same ``crop_pct``."""
    size: int
    crop_pct: float = 0.875
    interpolation: str = "bilinear"

    def __post_init__(self):
        _check_size_and_interpolation(self)
        if not 0 < self.crop_pct <= 1:
            raise ValueError(f"crop_pct must be in (0, 1], got {self.crop_pct}")

    def __call__(self, image, seed=None):
        scaled = math.floor(self.size / self.crop_pct)
        shape = tf.shape(image)
        height, width = tf.cast(shape[0], tf.float64), tf.cast(shape[1], tf.float64)
        short, scaled = tf.minimum(height, width), tf.constant(scaled, tf.float64)
        new_h = tf.cast(tf.where(height <= width, scaled, tf.floor(scaled * height / short)), tf.int32)
        new_w = tf.cast(tf.where(width <= height, scaled, tf.floor(scaled * width / short)), tf.int32)
        resized = resize_image(image, new_h, new_w, self.interpolation)
        top = tf.cast(tf.round(tf.cast(new_h - self.size, tf.float64) / 2), tf.int32)
        left = tf.cast(tf.round(tf.cast(new_w - self.size, tf.float64) / 2), tf.int32)
        return tf.ensure_shape(resized[top:top + self.size, left:left + self.size], [self.size, self.size, 3])


@dataclass(frozen=True)
class RandomResizedCrop:
    """Training crop as torchvision/timm's: the first of 10 random boxes (area in ``scale``, log-aspect uniform in
    ``log(ratio)``) that fits, else the centre box with the ratio clamped; resized, flipped with ``hflip``."""
    size: int
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    hflip: float = 0.5
    interpolation: str = "bilinear"

    def __post_init__(self):
        _check_size_and_interpolation(self)
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise ValueError(f"scale must satisfy 0 < low <= high <= 1, got {self.scale}")
        if not 0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"ratio must satisfy 0 < low <= high, got {self.ratio}")
        if not 0 <= self.hflip <= 1:
            raise ValueError(f"hflip is a probability, got {self.hflip}")

    def box(self, height, width, seed):
        """(top, left, box_height, box_width) for an image of ``height`` x ``width``."""
        area_seed, ratio_seed, top_seed, left_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 4))
        h, w = tf.cast(height, tf.float32), tf.cast(width, tf.float32)
        area = h * w * tf.random.stateless_uniform([_RRC_ATTEMPTS], area_seed, self.scale[0], self.scale[1])
        log_ratio = tf.random.stateless_uniform([_RRC_ATTEMPTS], ratio_seed, math.log(self.ratio[0]),
                                                math.log(self.ratio[1]))
        aspect = tf.exp(log_ratio)
        box_w = tf.cast(tf.round(tf.sqrt(area * aspect)), tf.int32)
        box_h = tf.cast(tf.round(tf.sqrt(area / aspect)), tf.int32)
        fits = (box_w > 0) & (box_w <= width) & (box_h > 0) & (box_h <= height)
        first = tf.argmax(tf.cast(fits, tf.int32))
        in_ratio = w / h
        fallback_w = tf.where(in_ratio > self.ratio[1], tf.cast(tf.round(h * self.ratio[1]), tf.int32), width)
        fallback_h = tf.where(in_ratio < self.ratio[0], tf.cast(tf.round(w / self.ratio[0]), tf.int32), height)
        found = tf.reduce_any(fits)
        box_h = tf.where(found, box_h[first], fallback_h)
        box_w = tf.where(found, box_w[first], fallback_w)
        top = tf.random.stateless_uniform([], top_seed, 0, height - box_h + 1, dtype=tf.int32)
        left = tf.random.stateless_uniform([], left_seed, 0, width - box_w + 1, dtype=tf.int32)
        top = tf.where(found, top, (height - box_h) // 2)
        left = tf.where(found, left, (width - box_w) // 2)
        return top, left, box_h, box_w

    def __call__(self, image, seed):
        box_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        shape = tf.shape(image)
        top, left, box_h, box_w = self.box(shape[0], shape[1], box_seed)
        crop = resize_image(image[top:top + box_h, left:left + box_w], self.size, self.size, self.interpolation)
        flip = tf.random.stateless_uniform([], flip_seed) < self.hflip
        return tf.ensure_shape(tf.cond(flip, lambda: tf.reverse(crop, [1]), lambda: crop), [self.size, self.size, 3])


# --train-crop: (the size trained at, the stored size, --crop-scale, --interpolation) -> the crop (None: the stored
# image as it is); --crop-scale is the smallest share of the area a crop keeps, "auto" (not settled from the data)
# timm's 0.08
TRAIN_CROPS.register("none", lambda size, stored, scale, filt: Resize(size, filt) if size != stored else None,
                     help="the stored image, resized to --image-size")
TRAIN_CROPS.register("flip", lambda size, stored, scale, filt: RandomResizedCrop(size, scale=(1.0, 1.0),
                                                                                 ratio=(1.0, 1.0), interpolation=filt),
                     help="the same, flipped left-right half the time")
TRAIN_CROPS.register("random-resized", lambda size, stored, scale, filt: RandomResizedCrop(
                         size, **({} if scale == "auto" else {"scale": (scale, 1.0)}), interpolation=filt),
                     help="timm's RandomResizedCrop + flip, area --crop-scale to 1", reads=("crop_scale",))
