"""JPEGs outside TensorFlow's decoder: corrupt data found and named, and the workers' decode to TF's exact pixels.

A JPEG with garbled entropy data decodes without an error: libjpeg only warns, with no file name, and returns a
smeared image that would be trained on. ``simplejpeg`` (optional: not on Kaggle's images) raises on exactly those
with ``strict=True`` (most single bit flips leave a valid stream: only a checksum would show them;
bench/README.md). :func:`tf_check` decodes each record again at 1/8 scale (every coefficient is still read) the
first time it is decoded and remembers it for the process. :func:`decode_jpeg_into` gives the workers the pixels
of ``tf.io.decode_jpeg(dct_method="INTEGER_ACCURATE")``: simplejpeg (strict: the decode is the check), else OpenCV
for RGB and greyscale, else PIL (CMYK, whose colour conversion must be libjpeg's).
"""

import functools
import io
import warnings

import numpy as np

from .tfhost import records_read, tf

DCT_METHOD = "INTEGER_ACCURATE"  # for tf.io.decode_jpeg; the only method PIL and OpenCV also have
NOT_CHECKED_NOTICE = (
    "kaggle_utils.data: simplejpeg is not installed (or too old for strict=), so JPEGs with corrupt data (which "
    "libjpeg only warns about, and which decode to garbage) are NOT detected and would be trained on; "
    "`pip install -U simplejpeg` turns the check on")
CMYK_COLORSPACES = ("CMYK", "YCCK")  # simplejpeg's names for four-channel JPEGs
_TRUNCATED = "Premature end of JPEG file"  # libjpeg's words when the data stop before the end marker


class CorruptJpegError(ValueError):
    """A JPEG whose header reads but whose data are corrupt; the message is the whole problem."""


@functools.cache
def strict_decoder():
    """The ``simplejpeg`` module, or None where it is not installed (or has no ``strict=``)."""
    try:
        import simplejpeg  # here: optional, and only a check or a worker decodes

        simplejpeg.decode_jpeg(simplejpeg.encode_jpeg(np.zeros((8, 8, 3), np.uint8)), strict=True)
    except (ImportError, TypeError):  # TypeError: a release without strict= (1.9.0 is tested)
        return None
    return simplejpeg


@functools.cache
def _opencv():
    """OpenCV (imgaug needs it), or None: PIL alone decodes every JPEG exactly too, only slower."""
    try:
        import cv2  # here: slow to import, and only the workers decode
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    return cv2


def check_available() -> bool:
    """Whether corrupt JPEG data can be detected here; if not, says so once per process (a RuntimeWarning)."""
    available = strict_decoder() is not None
    if not available:
        _notice_not_checked()
    return available


@functools.cache
def _notice_not_checked() -> None:  # cached: once per process
    warnings.warn(NOT_CHECKED_NOTICE, RuntimeWarning, stacklevel=4)


def corrupt_problem(libjpeg_message: str) -> str:
    return f"corrupt JPEG data, which would decode to garbage (libjpeg: {libjpeg_message})"


def jpeg_problem(data: bytes) -> str:
    """What is wrong with a JPEG's data, or ``""`` (also for a header that does not parse: the decoders name it)."""
    decoder = strict_decoder()
    try:
        colorspace = decoder.decode_jpeg_header(data)[2]
    except ValueError:
        return ""
    try:  # min_height/min_width 1: decoded at 1/8 scale, with every coefficient still read
        decoder.decode_jpeg(data, colorspace="CMYK" if colorspace in CMYK_COLORSPACES else "RGB", strict=True,
                            min_height=1, min_width=1)
    except ValueError as err:
        return corrupt_problem(str(err))
    return ""


def tf_check(files=(), *, warn_only: bool = False):
    """``(filename, index, jpeg) -> problem`` for tf.data: :func:`jpeg_problem`, once per record until its file
    changes (``files``, stamped now: the process's :class:`~.tfhost.RecordMemo`); ``warn_only``: a corrupt JPEG is
    named in a RuntimeWarning and passes (a test image: the submission needs its row)."""
    passed = records_read()
    key_of = passed.key_of(files, "jpeg")

    def check(filename, index, jpeg):
        key = key_of(filename, index)
        problem = tf.cond(passed.known(key), lambda: tf.constant(""), lambda: passed.remember(key, tf.ensure_shape(
            tf.numpy_function(lambda data: jpeg_problem(data).encode(), [jpeg], tf.string, stateful=False), [])))
        if not warn_only:
            return problem
        return tf.cond(tf.equal(problem, ""), lambda: problem, lambda: tf.ensure_shape(
            tf.numpy_function(_warn_and_pass, [filename, index, problem], tf.string), []))

    return check


def _warn_and_pass(filename: bytes, index, problem: bytes) -> bytes:
    warnings.warn(f"{filename.decode()}, record {int(index)}: {problem.decode()}; kept as decoded (a test image: its "
                  "row is needed)", RuntimeWarning, stacklevel=1)
    return b""


# ---------- Decoding in the augmentation workers
def decode_jpeg_into(data: bytes, out: np.ndarray) -> None:
    """Decode ``data`` into ``out`` (uint8 ``[H, W, 3]``) as ``tf.io.decode_jpeg(channels=3)`` would (EXIF ignored);
    ``ValueError`` for anything but a complete JPEG of that size, :class:`CorruptJpegError` for corrupt data."""
    from PIL import Image  # here: only the workers decode

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
                rgb = getattr(opencv, "IMREAD_COLOR_RGB", None)  # OpenCV >= 4.10 decodes straight to RGB
                flags = (opencv.IMREAD_COLOR if rgb is None else rgb) | opencv.IMREAD_IGNORE_ORIENTATION
                decoded = opencv.imdecode(np.frombuffer(data, np.uint8), flags)
                if decoded is None or decoded.shape != out.shape:
                    raise ValueError("truncated or corrupt JPEG data")
                out[...] = decoded if rgb is not None else opencv.cvtColor(decoded, opencv.COLOR_BGR2RGB)
            else:  # CMYK / YCCK: OpenCV's colour conversion differs from libjpeg's by one level
                out[...] = np.asarray(image.convert("RGB"))
    except (OSError, SyntaxError, Image.DecompressionBombError) as err:  # PIL's "not a JPEG" / "truncated"
        raise ValueError(str(err) or type(err).__name__) from None


def _decode_strictly_into(data: bytes, out: np.ndarray) -> bool:
    """simplejpeg, strict; False where the other decoders must (no simplejpeg, a header it cannot read, CMYK)."""
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
        if jpeg_problem(data):
            raise CorruptJpegError(jpeg_problem(data))
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
