"""TensorFlow for the input pipeline, imported on first use and kept off the accelerators.

Its own module so that every part of :mod:`kaggle_utils.data` (records, sources, transforms,
augmentation) can reach TensorFlow without importing one another.
"""
from __future__ import annotations

import os
import threading
import warnings

__all__ = ["parallel_map", "tensorflow_on_host"]

_tf_module = None
_tf_lock = threading.Lock()


def tensorflow_on_host():
    """Import TensorFlow with GPUs and TPUs hidden from it, once per process.

    JAX and TensorFlow must not both claim the accelerator: TF would pre-allocate GPU memory
    (or grab the TPU) that the model needs. The data pipeline only needs CPUs. If TF was
    already initialised elsewhere with a visible accelerator the setting can no longer be
    changed; a warning says so instead of failing.
    """
    global _tf_module
    with _tf_lock:
        if _tf_module is None:
            os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's C++ INFO lines are noise here
            import tensorflow as tf

            for kind in ("GPU", "TPU"):
                try:
                    tf.config.set_visible_devices([], kind)
                except (RuntimeError, ValueError):
                    if tf.config.get_visible_devices(kind):
                        warnings.warn(
                            f"TensorFlow was initialised before kaggle_utils.data and can see a {kind}; "
                            "it may take accelerator memory from JAX. Import kaggle_utils.data (or call "
                            "tensorflow_on_host()) before any other TensorFlow use.", RuntimeWarning,
                            stacklevel=2)
            _tf_module = tf
        return _tf_module


def parallel_map(dataset, fn, *, num_parallel_calls, deterministic=None):
    """``dataset.map(fn)`` in parallel, or a plain sequential map while TF's op determinism is on.

    Why: every pipeline of the kit holds a ``tf.py_function`` (bad-record reports, worker
    batches), and with op determinism on (the job's ``--deterministic``, for exact resume)
    tf.data's ``make_deterministic`` rewrite then turns every parallel map into a sequential
    ``MapDataset`` anyway. TensorFlow 2.21's rewrite keeps the parallel op's
    ``use_unbounded_threadpool`` attribute, which the sequential op lacks, and logs an ``E0000
    ... NodeDef mentions attribute use_unbounded_threadpool`` line per iterator. Building the
    sequential map here is the same pipeline (same records, order and pixels) without that line.
    """
    if _op_determinism_enabled():
        return dataset.map(fn)
    return dataset.map(fn, num_parallel_calls=num_parallel_calls, deterministic=deterministic)


def _op_determinism_enabled() -> bool:
    tensorflow_on_host()
    try:  # not in tf.config's public API (only enable_op_determinism is); present since TF 2.9
        from tensorflow.python.framework.config import is_op_determinism_enabled
    except ImportError:  # a parallel map then: the rewrite makes it sequential, with its log line
        return False
    return bool(is_op_determinism_enabled())
