"""JPEG decoding without TensorFlow, pixel-identical to the pipeline's ``tf.io.decode_jpeg``.

The augmentation worker processes (:mod:`kaggle_utils.data.augment_workers`) decode the JPEGs of
their own batches, so that all per-image work scales with the number of workers instead of
leaving the decode (a sizeable part of the per-image cost: bench/README.md) on the process
that runs tf.data. Their pixels must be the ones every other route sees, so
the pipeline decodes with libjpeg's accurate integer DCT (``INTEGER_ACCURATE``, libjpeg's
``JDCT_ISLOW``): the method PIL and OpenCV use. TensorFlow's default (``INTEGER_FAST``)
differs from it by up to 5 levels per pixel and is no faster (bench/README.md).

Workers decode with ``simplejpeg`` where it is installed, strictly: a JPEG with corrupt data,
which every other decoder turns into garbage without a word, fails there and is reported by file
and record (:mod:`~kaggle_utils.data.jpeg_check`). Without it, or for CMYK JPEGs (whose colour
conversion must be libjpeg's, as PIL does it), they decode with OpenCV, the faster, when it is
installed and the JPEG is RGB or greyscale, else with PIL. All of them give exactly TensorFlow's
pixels, which ``tests/test_data_jpeg.py`` checks for 4:2:0, 4:4:4, 4:2:2, progressive, greyscale
and CMYK JPEGs. All are imported on first use: only the worker processes decode, and importing
OpenCV alone would lengthen every import of :mod:`kaggle_utils.data` noticeably.
"""
from __future__ import annotations

import io

import numpy as np

from .jpeg_check import CMYK_COLORSPACES, CorruptJpegError, corrupt_problem, jpeg_problem, strict_decoder

__all__ = ["DCT_METHOD", "decode_jpeg_into"]

_TRUNCATED = "Premature end of JPEG file"  # libjpeg's words when the data stop before the end marker
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
    ``out``'s height and width (truncated, corrupt header, another format, another size), and
    its subclass :class:`~kaggle_utils.data.jpeg_check.CorruptJpegError` for corrupt data that
    libjpeg would let through (only where ``simplejpeg`` is installed).
    EXIF orientation is ignored, as TensorFlow ignores it.
    """
    from PIL import Image

    if _decode_strictly_into(data, out):
        return
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


def _decode_strictly_into(data: bytes, out: np.ndarray) -> bool:
    """Decode ``data`` into ``out`` with simplejpeg, strict; False where the other decoders must (see the module doc).

    Raises ``ValueError`` for corrupt data and for a size other than ``out``'s; a header that
    does not parse is left to PIL, whose message says what the bytes are.
    """
    decoder = strict_decoder()
    if decoder is None:
        return False
    try:
        height, width, colorspace, _ = decoder.decode_jpeg_header(data)
    except ValueError:
        return False
    if (height, width) != out.shape[:2]:
        raise ValueError(f"image is {height}x{width} (height x width), expected {out.shape[0]}x{out.shape[1]}")
    if colorspace in CMYK_COLORSPACES:
        problem = jpeg_problem(data)
        if problem:
            raise CorruptJpegError(problem)
        return False
    target = out if out.flags.c_contiguous else None  # decoded in place
    try:
        decoded = decoder.decode_jpeg(data, colorspace="RGB", strict=True, buffer=target)
    except ValueError as err:
        if str(err).startswith(_TRUNCATED):  # what TensorFlow's decode_jpeg fails on too
            raise ValueError(f"truncated JPEG ({err})") from None
        raise CorruptJpegError(corrupt_problem(str(err))) from None
    if target is None:
        out[...] = decoded
    return True


def _opencv_decode_rgb(opencv, data: bytes, shape) -> np.ndarray:
    rgb = getattr(opencv, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10 decodes straight to RGB
    flags = (opencv.IMREAD_COLOR if rgb is None else rgb) | opencv.IMREAD_IGNORE_ORIENTATION
    decoded = opencv.imdecode(np.frombuffer(data, np.uint8), flags)
    if decoded is None or decoded.shape != tuple(shape):
        raise ValueError("truncated or corrupt JPEG data")
    return decoded if rgb is not None else opencv.cvtColor(decoded, opencv.COLOR_BGR2RGB)
