"""TensorFlow for the input pipeline, imported on first use and kept off the accelerators.

Its own module so that every part of :mod:`kaggle_utils.data` (records, sources, transforms,
augmentation) can reach TensorFlow without importing one another.
"""
from __future__ import annotations

import os
import threading
import warnings

__all__ = ["tensorflow_on_host"]

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
