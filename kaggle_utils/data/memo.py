"""Records this process has read in full without a problem, so that the next read of one skips its guards.

Naming a bad record costs time on every read of every good one: ``first_success`` (a try/except inside tf.data)
runs a one-element tf.data pipeline around the parse and around the decode, and the JPEG check decodes the data a
second time. A record that once passed them all is read again with plain ops: a pipeline asks
:meth:`RecordMemo.known` and gives the answer to the parse and the decode as ``trusted``, a ``tf.cond`` between
their plain and guarded ops (the same ops on the same bytes, so the same pixels). Keys are
``<reading>|<file>|<size, mtime, inode>|<index>``: ``reading`` says what was read from the record (its labels, its
size; ``jpeg``: the JPEG check's), and a file rewritten in place gets new keys, so it is read in full again. The
table is a TensorFlow op (no GIL), shared by the process's pipelines and the JPEG check.
"""

import os
import threading

from .tfhost import tf

_memo = None
_lock = threading.Lock()


class RecordMemo:
    """Keys of records read in full without a problem, in a TensorFlow hash table."""

    def __init__(self):
        self._passed = tf.lookup.experimental.MutableHashTable(tf.string, tf.bool, default_value=False)

    def key_of(self, files=(), reading: str = ""):
        """``(filename, index) -> key`` for the records of ``files``, whose stamps are taken now."""
        stamps = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant([os.fsencode(f) for f in files] or [b""]), tf.constant([_stamp(f) for f in files] or [""])),
            "")
        return lambda filename, index: tf.strings.join(
            [reading, filename, stamps.lookup(filename), tf.strings.as_string(index)], "|")[None]

    def known(self, key):
        return self._passed.lookup(key)[0]

    def remember(self, key, problem):
        """``problem``, once the record's key is marked as read without a problem where it is ``""`` (an insert, not
        a ``tf.cond``: as cheap for a record known already, which is marked again)."""
        with tf.control_dependencies([self._passed.insert(key, tf.equal(problem, "")[None])]):
            return tf.identity(problem)


def records_read() -> RecordMemo:
    """The process's :class:`RecordMemo` (created on first use)."""
    global _memo
    with _lock:
        _memo = _memo or RecordMemo()
    return _memo


def _stamp(filename: str) -> str:
    try:
        info = os.stat(filename)
    except OSError:
        return ""
    return f"{info.st_size}:{info.st_mtime_ns}:{info.st_ino}"
