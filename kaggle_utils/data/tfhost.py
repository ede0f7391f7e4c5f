"""TensorFlow for the input pipeline: imported on first use, kept off the accelerators, on this process's cores;
a try/except inside tf.data (:func:`first_success`), and the records read without a problem (:class:`RecordMemo`).
"""

import contextlib
import os
import re
import sys
import tempfile
import threading
import warnings

_tf_module = None
_tf_lock = threading.Lock()
# TensorFlow's C++ start-up lines that TF_CPP_MIN_LOG_LEVEL does not reach on every machine: TF 2.21 logs them
# through absl before absl's logging is initialised, and absl then writes every level to stderr (abseil-cpp #1718;
# seen on a CPU where oneDNN is on by default, not on others)
_STARTUP_NOISE = re.compile(r"All log messages before absl::InitializeLog|\] oneDNN custom operations are on|"
                            r"cpu_feature_guard\.cc|^To enable the following instructions:")


@contextlib.contextmanager
def _without_startup_noise():
    """Standard error (the file descriptor, where C++ writes) held in a file while TensorFlow loads; its lines are
    written back after, less :data:`_STARTUP_NOISE`, so nothing else is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = [line for line in held.read().decode(errors="replace").splitlines(keepends=True)
                    if not _STARTUP_NOISE.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


def tensorflow_on_host():
    """Import TensorFlow with GPUs and TPUs hidden from it (it would take memory the model needs), once per process;
    a warning where TF was initialised elsewhere with an accelerator visible."""
    global _tf_module
    with _tf_lock:
        if _tf_module is None:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ start-up INFO lines are noise here
            with _without_startup_noise():
                import tensorflow as tf

            for kind in ("GPU", "TPU"):
                try:
                    tf.config.set_visible_devices([], kind)
                except (RuntimeError, ValueError):
                    if tf.config.get_visible_devices(kind):
                        warnings.warn(
                            f"TensorFlow was initialised before kaggle_utils.data and can see a {kind}; it may take "
                            "accelerator memory from JAX. Import kaggle_utils.data (or call tensorflow_on_host()) "
                            "before any other TensorFlow use.", RuntimeWarning, stacklevel=2)
            _tf_module = tf
        return _tf_module


class _TensorFlow:
    """``tf`` for this package's modules: TensorFlow is imported (by :func:`tensorflow_on_host`) when first used,
    so importing the package, as the augmentation workers do, loads none of it."""

    def __getattr__(self, name):
        return getattr(tensorflow_on_host(), name)


tf = _TensorFlow()


def traced(fn):
    """``fn`` for ``Dataset.map`` traced as written, without AutoGraph's rewrite: the per-record functions here branch
    on tensors with ``tf.cond`` only, and the rewrite is most of the seconds a pipeline takes to build (every
    function it calls is converted, for each split and epoch)."""
    return tf.autograph.experimental.do_not_convert(fn)


def host_cores() -> int:
    """The CPU cores this process may run on: its affinity (a container's or a pinned job's share), which
    ``os.cpu_count()`` ignores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, cores or 1)


def op_message(err) -> str:
    """A TensorFlow error's text without its annotations (``{{function_node ...}}``, ``[[...]]``, ``[Op:...]``)."""
    text = re.sub(r"\{\{.*?\}\}", " ", err.message)
    text = re.sub(r"\[\[.*?\]\]", " ", text, flags=re.S)
    text = re.sub(r"\[Op:\w+\]( name:\S*)?", " ", text)
    return " ".join(text.split())


def first_success(fn, value, fallback):
    """``(fn(value), True)``, or ``(fallback, False)`` where ``fn`` raises: a try/except inside tf.data, made of
    ``ignore_errors`` on a one-element dataset with the fallback behind it."""
    tried = tf.data.Dataset.from_tensors(value).map(lambda v: (fn(v), True)).ignore_errors()
    return tried.concatenate(tf.data.Dataset.from_tensors((fallback, False))).take(1).get_single_element()


# ---------- Records read in full without a problem
_memo = None
_memo_lock = threading.Lock()


class RecordMemo:
    """Keys of records this process has read in full without a problem (a TensorFlow hash table), whose next read
    skips its guards.

    Naming a bad record costs time on every read of every good one: ``first_success`` (a try/except inside tf.data)
    runs a one-element tf.data pipeline around the parse and around the decode, and the JPEG check decodes the data a
    second time. A record that once passed them all is read again with plain ops: a pipeline asks
    :meth:`known` and gives the answer to the parse and the decode as ``trusted``, a ``tf.cond`` between
    their plain and guarded ops (the same ops on the same bytes, so the same pixels). Keys are
    ``<reading>|<file>|<size, mtime, inode>|<index>``: ``reading`` says what was read from the record (its labels, its
    size; ``jpeg``: the JPEG check's), and a file rewritten in place gets new keys, so it is read in full again. The
    table is a TensorFlow op (no GIL), shared by the process's pipelines and the JPEG check.
    """

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
    with _memo_lock:
        _memo = _memo or RecordMemo()
    return _memo


def _stamp(filename: str) -> str:
    try:
        info = os.stat(filename)
    except OSError:
        return ""
    return f"{info.st_size}:{info.st_mtime_ns}:{info.st_ino}"
