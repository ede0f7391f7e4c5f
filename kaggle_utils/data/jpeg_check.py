"""Corrupt JPEG data that every decoder passes in silence: found, and named by file and record.

A JPEG whose header is intact but whose entropy-coded data are garbled (a bad disk block, a
spliced or half-rewritten file) decodes without an error: libjpeg recovers, reports a *warning*
("Corrupt JPEG data: 114 extraneous bytes before marker 0xd9", "bad Huffman code", "premature
end of data segment") and returns an image that is partly grey or smeared. TensorFlow's
``decode_jpeg``, OpenCV and torchvision let libjpeg print that warning, with no file name, to
stderr; Pillow discards it. None of them tells the caller, so the garbage would be trained on.

``simplejpeg`` (MIT; its wheels bundle libjpeg-turbo) turns those warnings into a ``ValueError``
with ``strict=True``. It flags exactly the files on which libjpeg warns (measured on random
garbles, zeroed runs and bit flips of real photos: the same files, one for one) and never a clean
file (every scikit-image picture encoded by PIL, TensorFlow, OpenCV and libjpeg-turbo, baseline
and progressive, 4:4:4 to 4:1:1, greyscale, CMYK, with restart markers); the figures are in
``bench/README.md``. None of the decoders on Kaggle's images reports the warnings, and
``simplejpeg`` is not installed there, so the check is optional: without it
:func:`check_available` says once that corrupt JPEGs go undetected and how to turn the check on
(``pip install -U simplejpeg``), and everything else works as before.

What no decoder can find: a change that leaves a valid entropy stream (most single bit flips,
which only alter a coefficient) decodes without a warning; only a checksum of the file would
show it.

Where it runs: augmentation workers decode with ``simplejpeg`` itself, strict (:mod:`.jpeg`: the decode is the
check); in tf.data, :func:`tf_check` runs beside ``tf.io.decode_jpeg``, decoding the entropy data again at 1/8
scale (every coefficient is still Huffman-decoded, which is where the warnings arise). That costs a good part of a
decode, so :class:`CheckedRecords` remembers the records that passed, for the life of the process: a record is
checked the first time it is decoded (the first epoch), later epochs only look it up.
"""
from __future__ import annotations

import os
import threading
import warnings

import numpy as np

from .tfhost import tf

__all__ = ["CheckedRecords", "CorruptJpegError", "NOT_CHECKED_NOTICE", "check_available",
           "corrupt_problem", "jpeg_problem", "strict_decoder", "tf_check"]

NOT_CHECKED_NOTICE = (
    "kaggle_utils.data: simplejpeg is not installed (or too old for strict=), so JPEGs with corrupt data "
    "(which libjpeg only warns about, and which decode to garbage) are NOT detected and would be trained on; "
    "`pip install -U simplejpeg` turns the check on")
CMYK_COLORSPACES = ("CMYK", "YCCK")  # simplejpeg's names for four-channel JPEGs
_NOT_LOADED = object()
_decoder = _NOT_LOADED  # the simplejpeg module, or None where it is not installed
_notice_given = False
_notice_lock = threading.Lock()


class CorruptJpegError(ValueError):
    """A JPEG whose header reads but whose data are corrupt; the message is the whole problem."""


def strict_decoder():
    """The ``simplejpeg`` module, or None where it is not installed (says nothing: see :func:`check_available`)."""
    global _decoder
    if _decoder is _NOT_LOADED:
        try:
            import simplejpeg as module

            probe = module.encode_jpeg(np.zeros((8, 8, 3), np.uint8))
            module.decode_jpeg(probe, strict=True)
        except (ImportError, TypeError):  # TypeError: a release without strict= (1.9.0 is tested)
            module = None
        _decoder = module
    return _decoder


def check_available() -> bool:
    """Whether corrupt JPEG data can be detected here; if not, says so once per process (a RuntimeWarning)."""
    global _notice_given
    if strict_decoder() is not None:
        return True
    with _notice_lock:
        first, _notice_given = not _notice_given, True
    if first:
        warnings.warn(NOT_CHECKED_NOTICE, RuntimeWarning, stacklevel=3)
    return False


def corrupt_problem(libjpeg_message: str) -> str:
    """The problem a corrupt JPEG is reported with (after ``<file>, record <i>: ``)."""
    return f"corrupt JPEG data, which would decode to garbage (libjpeg: {libjpeg_message})"


def jpeg_problem(data: bytes) -> str:
    """``""`` for a JPEG whose data decode cleanly (or bytes that are no JPEG at all); else what is wrong.

    Bytes whose header does not parse are left to the decoders, which already fail on them
    with their own words. Needs :func:`strict_decoder`.
    """
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


class CheckedRecords:
    """The records that passed :func:`jpeg_problem`, in a TensorFlow hash table: each is checked once.

    A look-up is a graph op (no Python, no GIL); only a record not seen before goes to the
    check. Keys are ``<file>|<size, mtime, inode when the pipeline was made>|<index>``, so a
    file rewritten in place is checked again. Only passes are kept: a bad record is checked
    again whenever it is read, so it is reported (or counted) every epoch, as other bad records are.
    """

    def __init__(self):
        self._passed = tf.lookup.experimental.MutableHashTable(tf.string, tf.bool, default_value=False)

    def tf_check(self, files=None):
        """``(filename, index, jpeg) -> problem`` for tf.data; ``files``: stamp these files' keys (see above)."""
        stamps = None
        if files:
            stamps = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant([os.fsencode(f) for f in files]), tf.constant([_stamp(f) for f in files])), "")

        def check(filename, index, jpeg):
            stamp = tf.constant("") if stamps is None else stamps.lookup(filename)
            key = tf.strings.join([filename, stamp, tf.strings.as_string(index)], "|")[None]

            def first_read():
                problem = tf.ensure_shape(tf.numpy_function(_problem_bytes, [jpeg], tf.string, stateful=False), [])

                def remember():
                    with tf.control_dependencies([self._passed.insert(key, [True])]):
                        return tf.identity(problem)

                return tf.cond(tf.equal(problem, ""), remember, lambda: problem)

            return tf.cond(self._passed.lookup(key)[0], lambda: tf.constant(""), first_read)

        return check


def _stamp(filename: str) -> str:
    try:
        info = os.stat(filename)
    except OSError:
        return ""
    return f"{info.st_size}:{info.st_mtime_ns}:{info.st_ino}"


def _problem_bytes(data: bytes) -> bytes:
    return jpeg_problem(data).encode()


_checked: CheckedRecords | None = None  # shared by every pipeline of the process
_checked_lock = threading.Lock()


def tf_check(files=(), *, warn_only: bool = False):
    """``(filename, index, jpeg) -> problem`` (string tensors; ``""``: fine) for tf.data, remembering passes for the
    process (``files``: the files the names are, stamped). ``warn_only``: a corrupt JPEG is named in a
    RuntimeWarning and passes (a test image: the submission needs its row). Needs :func:`check_available`.
    """
    global _checked
    with _checked_lock:
        _checked = _checked or CheckedRecords()
    check = _checked.tf_check(files)
    if not warn_only:
        return check

    def check_warning(filename, index, jpeg):
        problem = check(filename, index, jpeg)
        return tf.cond(tf.equal(problem, ""), lambda: problem, lambda: tf.ensure_shape(
            tf.numpy_function(_warn_and_pass, [filename, index, problem], tf.string), []))

    return check_warning


def _warn_and_pass(filename: bytes, index, problem: bytes) -> bytes:
    warnings.warn(f"{filename.decode()}, record {int(index)}: {problem.decode()}; kept as decoded (a test image: its "
                  "row is needed)", RuntimeWarning, stacklevel=1)
    return b""
