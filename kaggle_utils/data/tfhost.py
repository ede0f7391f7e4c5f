"""TensorFlow for the input pipeline: imported on first use, kept off the accelerators, on this process's cores."""

import os
import re
import threading
import warnings

_tf_module = None
_tf_lock = threading.Lock()


def tensorflow_on_host():
    """Import TensorFlow with GPUs and TPUs hidden from it (it would take memory the model needs), once per process;
    a warning where TF was initialised elsewhere with an accelerator visible."""
    global _tf_module
    with _tf_lock:
        if _tf_module is None:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ start-up INFO lines are noise here
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
