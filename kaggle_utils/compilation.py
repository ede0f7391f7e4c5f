"""Compile once: JAX's persistent compilation cache in a folder a user keeps, and the seconds compiling took.

A restarted session, the next fold or a second run would compile the same programs again (minutes for a
large EfficientNet); :func:`seconds` sums JAX's compile events, so the loop reports compiling apart.
"""
import os
import threading
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

# JAX's monitoring events of one compilation's stages (jax._src.dispatch), stable since jax 0.4
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_total = [0.0]
_lock = threading.Lock()
_listening = [False]


def _on_event(event: str, duration: float, **_) -> None:
    if event in _COMPILE_EVENTS:
        with _lock:
            _total[0] += duration


def seconds() -> float:
    """Seconds spent compiling in this process since the first call (a listener is registered then)."""
    with _lock:
        if not _listening[0]:
            jax.monitoring.register_event_duration_secs_listener(_on_event)
            _listening[0] = True
        return _total[0]


def enable_cache(folder: str | os.PathLike) -> Path:
    """Caches every compiled program (JAX's default: those of a second or more) in ``folder`` from now on;
    returns the folder in use. One already configured (``JAX_COMPILATION_CACHE_DIR``, ``jax.config``) wins."""
    configured = jax.config.jax_compilation_cache_dir or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if configured:
        return Path(configured)
    folder = Path(folder)
    compilation_cache.set_cache_dir(str(folder))
    compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return folder
