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

Where the check runs:

* Augmentation workers decode with ``simplejpeg`` itself (:mod:`kaggle_utils.data.jpeg`), strict,
  so there the check costs nothing: the decode is the check.
* In tf.data, ``tf.io.decode_jpeg`` decodes and :func:`tf_check` runs beside it, a
  ``tf.numpy_function`` that decodes the entropy data again at 1/8 scale (libjpeg-turbo still
  Huffman-decodes every coefficient, which is where the warnings arise, but skips most of the
  inverse DCT and all colour work; the same files are flagged as at full scale). That costs a
  good part of a decode on every read, and in tf.data even a Python call per record is felt, so
  :class:`CheckedRecords` remembers which records passed in a TensorFlow hash table, looked up in
  the graph, for the life of the process (a file rewritten in place is checked again): a record
  is checked once. The job reads every train and val record before training (its label scan),
  so a corrupt image stops it, or is counted, before the first step, and training's epochs only
  look the records up. Test images are not read before training; prediction keeps a corrupt one
  (its row is needed) and names it in a warning.
"""
from __future__ import annotations

import os
import threading
import warnings

import numpy as np

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
        from .tfhost import tensorflow_on_host

        tf = tensorflow_on_host()
        self._passed = tf.lookup.experimental.MutableHashTable(tf.string, tf.bool, default_value=False)

    def tf_check(self, files=None):
        """``(filename, index, jpeg) -> problem`` for tf.data; ``files``: stamp these files' keys (see above)."""
        from .tfhost import tensorflow_on_host

        tf = tensorflow_on_host()
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


_tfrecord_checks: CheckedRecords | None = None  # shared by every TFRecord pipeline of the process
_tfrecord_checks_lock = threading.Lock()


def tf_check(tfrecord_files=None, *, warn_only: bool = False):
    """``(filename, index, jpeg) -> problem`` (string tensors; ``""``: fine) for tf.data; None without simplejpeg.

    ``tfrecord_files``: the records that passed are remembered for every pipeline of the
    process over these files (else for this pipeline only). ``warn_only``: a corrupt JPEG is
    named in a RuntimeWarning and passes as fine.
    """
    global _tfrecord_checks
    if not check_available():
        return None
    from .tfhost import tensorflow_on_host

    tf = tensorflow_on_host()
    if tfrecord_files is None:
        check = CheckedRecords().tf_check()
    else:
        with _tfrecord_checks_lock:
            if _tfrecord_checks is None:
                _tfrecord_checks = CheckedRecords()
        check = _tfrecord_checks.tf_check(tfrecord_files)
    if not warn_only:
        return check

    def check_warning(filename, index, jpeg):
        problem = check(filename, index, jpeg)
        return tf.cond(tf.equal(problem, ""), lambda: problem, lambda: tf.ensure_shape(
            tf.numpy_function(_warn_and_pass, [filename, index, problem], tf.string), []))

    return check_warning


def _warn_and_pass(filename: bytes, index, problem: bytes) -> bytes:
    warnings.warn(f"{filename.decode()}, record {int(index)}: {problem.decode()}; kept as decoded "
                  "(keep_corrupt_jpegs=True)", RuntimeWarning, stacklevel=1)
    return b""
