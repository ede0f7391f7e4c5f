"""JPEG decoding without TensorFlow, pixel-identical to the pipeline's ``tf.io.decode_jpeg``.

The augmentation worker processes (:mod:`kaggle_utils.data.augment_workers`) decode the JPEGs of
their own batches, so that all per-image work scales with the number of workers instead of
leaving the decode (a sizeable part of the per-image cost: bench/README.md) on the process
that runs tf.data. Their pixels must be the ones every other route sees, so
the pipeline decodes with libjpeg's accurate integer DCT (``INTEGER_ACCURATE``, libjpeg's
``JDCT_ISLOW``): the method PIL and OpenCV use. TensorFlow's default (``INTEGER_FAST``)
differs from it by up to 5 levels per pixel and is no faster (bench/README.md).

Workers decode with OpenCV, the faster, when it is installed and the JPEG is RGB or
greyscale, else with PIL; both give exactly TensorFlow's pixels, which
``tests/test_data_jpeg.py`` checks for 4:2:0, 4:4:4, 4:2:2, progressive, greyscale and CMYK
JPEGs. Both are imported on first use: only the worker processes decode, and importing
OpenCV alone would lengthen every import of :mod:`kaggle_utils.data` noticeably.
"""
from __future__ import annotations

import io

import numpy as np

__all__ = ["DCT_METHOD", "decode_jpeg_into"]

DCT_METHOD = "INTEGER_ACCURATE"  # for tf.io.decode_jpeg; the only method PIL and OpenCV also have

_NOT_LOADED = object()
cv2 = _NOT_LOADED  # the OpenCV module, or None where it is not installed; see _opencv()


def _opencv():
    """OpenCV (a dependency of imgaug), or None: PIL alone also decodes every JPEG exactly, only slower."""
    global cv2
    if cv2 is _NOT_LOADED:
        try:
            import cv2 as module
        except ImportError:  # pragma: no cover - depends on the environment
            module = None
        cv2 = module
    return cv2


def decode_jpeg_into(data: bytes, out: np.ndarray) -> None:
    """Decode ``data`` into ``out`` (uint8 ``[H, W, 3]``) as ``tf.io.decode_jpeg(channels=3)`` would.

    Raises ``ValueError`` saying what is wrong when ``data`` is not a complete JPEG of
    ``out``'s height and width (truncated, corrupt header, another format, another size).
    EXIF orientation is ignored, as TensorFlow ignores it.
    """
    from PIL import Image

    height, width = out.shape[:2]
    try:
        with Image.open(io.BytesIO(data), formats=["JPEG"]) as image:  # reads the header only
            if image.size != (width, height):
                raise ValueError(f"image is {image.size[1]}x{image.size[0]} (height x width), expected "
                                 f"{height}x{width}")
            opencv = _opencv()
            if opencv is not None and image.mode in ("RGB", "L"):
                out[...] = _opencv_decode_rgb(opencv, data, out.shape)
            else:  # CMYK / YCCK: OpenCV's colour conversion differs from libjpeg's by one level
                out[...] = np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, Image.DecompressionBombError) as err:  # PIL's "not a JPEG" / "truncated"
        raise ValueError(str(err) or type(err).__name__) from None


def _opencv_decode_rgb(opencv, data: bytes, shape) -> np.ndarray:
    rgb = getattr(opencv, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10 decodes straight to RGB
    flags = (opencv.IMREAD_COLOR if rgb is None else rgb) | opencv.IMREAD_IGNORE_ORIENTATION
    decoded = opencv.imdecode(np.frombuffer(data, np.uint8), flags)
    if decoded is None or decoded.shape != tuple(shape):
        raise ValueError("truncated or corrupt JPEG data")
    return decoded if rgb is not None else opencv.cvtColor(decoded, opencv.COLOR_BGR2RGB)
