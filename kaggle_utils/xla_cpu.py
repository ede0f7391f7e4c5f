"""The XLA:CPU settings under which the kit's EfficientNet is fast on CPU (bench/README.md "Model speed").

* YNNPACK keeps XLA:CPU's reductions only: its convolutions often run on one core where XLA's use both. XLA
  reads ``XLA_FLAGS`` when JAX starts its CPU backend, so :func:`apply` runs on the first import of
  ``kaggle_utils``; a user's setting wins and only measured jaxlib releases get it (XLA aborts on an unknown flag).
* A step's scratch memory is reused between calls. XLA:CPU allocates a program's scratch buffer on every call
  (1.2 GB for a V2-S training step at 224 px, batch 8). From JAX's dispatch thread glibc maps a block that large
  afresh each time and the kernel zeroes it again: 316k page faults and ~0.6 s of system CPU per step. Run
  inline on the calling thread (:func:`dispatch_inline`, at import, before JAX starts its CPU backend), the
  allocation comes from glibc's main arena, which :func:`keep_scratch_memory` (called when steps are built for
  CPU devices) tells to keep freed memory, so the next call reuses the same pages.

``KAGGLE_UTILS_XLA_CPU_TUNING=0`` opts out of all of them.
"""
import ctypes
import os
import platform
import sys
import warnings
from importlib import metadata

FLAG = "--xla_cpu_experimental_ynn_fusion_type"
VALUE = "reduce"
MEASURED_JAXLIB = ("0.10",)  # major.minor releases whose XLA knows FLAG and was measured with it
OPT_OUT = "KAGGLE_UTILS_XLA_CPU_TUNING"
ASYNC_DISPATCH = "jax_cpu_enable_async_dispatch"  # JAX's option (jax 0.4.31+): False runs CPU programs inline
# glibc's mallopt parameters (malloc.h): no mmap for the main arena's large blocks, and no trimming of its heap
# (-1 is SIZE_MAX: glibc takes the threshold as size_t), so a freed scratch buffer stays for the next call.
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
_scratch_kept = [False]


def _jaxlib_release() -> str | None:
    try:
        return ".".join(metadata.version("jaxlib").split(".")[:2])
    except metadata.PackageNotFoundError:
        return None


def _backends_started() -> bool:  # read from sys.modules: importing jax here would cost every kit import a second
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started and started())


def apply(environ=os.environ) -> bool:
    """Add ``FLAG=VALUE`` to ``XLA_FLAGS`` when it can take effect; True if it was added."""
    flags = environ.get("XLA_FLAGS", "")
    if environ.get(OPT_OUT, "1") == "0" or FLAG in flags or _jaxlib_release() not in MEASURED_JAXLIB:
        return False
    if _backends_started():
        if sys.modules["jax"].default_backend() == "cpu":  # started backends: jax is imported
            warnings.warn(
                f"JAX started its CPU backend before kaggle_utils was imported, so XLA runs without "
                f"{FLAG}={VALUE} and EfficientNet on CPU runs slower. Import kaggle_utils before the "
                f"first JAX computation, or set XLA_FLAGS={FLAG}={VALUE} yourself.", stacklevel=3)
        return False
    environ["XLA_FLAGS"] = f"{flags} {FLAG}={VALUE}".strip()
    return True


def dispatch_inline(environ=os.environ) -> bool:
    """Turn JAX's asynchronous CPU dispatch off before the backend starts; True if it was turned off.

    Single-device CPU programs then run on the calling thread, whose allocations glibc serves from its main
    arena (:func:`keep_scratch_memory`). Multi-device (pmap, sharded) programs keep JAX's own dispatch. Nothing
    is lost by waiting: on a CPU the step and the host share the same cores. GPU and TPU programs are not CPU
    programs, so this changes nothing there.
    """
    if environ.get(OPT_OUT, "1") == "0" or _backends_started():
        return False  # a started backend keeps its dispatch (apply() warns of a late import on measured jaxlibs)
    import jax

    try:
        jax.config.update(ASYNC_DISPATCH, False)
    except AttributeError:  # a JAX without the option: its dispatch stays as it is
        return False
    return True


def keep_scratch_memory(environ=os.environ) -> bool:
    """Make glibc keep and reuse the memory a freed CPU step's scratch buffer held; True if it is set (now or before).

    Process-wide and kept for the process's life: memory the main thread frees then stays with the process
    rather than going back to the system (its peak is the steps' own). So it is set only when steps are built for
    CPU devices, not at import. A no-op off glibc (macOS, musl) and under ``KAGGLE_UTILS_XLA_CPU_TUNING=0``.
    """
    if _scratch_kept[0]:
        return True
    if environ.get(OPT_OUT, "1") == "0" or platform.libc_ver()[0] != "glibc":  # glibc: Linux only
        return False
    libc = ctypes.CDLL(None)
    _scratch_kept[0] = bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, -1))
    return _scratch_kept[0]


def describe(environ=os.environ) -> str:
    """This process's settings, for a benchmark's header: the flags XLA got, the dispatch and the allocator."""
    jax = sys.modules.get("jax")
    inline = jax is not None and jax.config.values.get(ASYNC_DISPATCH) is False
    return (f"XLA_FLAGS={environ.get('XLA_FLAGS', '')!r}; CPU dispatch inline: {'yes' if inline else 'no'}; "
            f"glibc keeps freed memory: {'yes' if _scratch_kept[0] else 'no'}")
