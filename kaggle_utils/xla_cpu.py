"""The XLA:CPU compiler option under which the kit's EfficientNet is fast on CPU (bench/README.md).

YNNPACK keeps XLA:CPU's reductions only: its convolutions often run on one core where XLA's use both. XLA
reads ``XLA_FLAGS`` when JAX starts its CPU backend, so :func:`apply` runs on the first import of
``kaggle_utils``; a user's setting wins, only measured jaxlib releases get it (XLA aborts on an unknown flag),
and ``KAGGLE_UTILS_XLA_CPU_TUNING=0`` opts out.
"""
import os
import sys
import warnings
from importlib import metadata

FLAG = "--xla_cpu_experimental_ynn_fusion_type"
VALUE = "reduce"
MEASURED_JAXLIB = ("0.10",)  # major.minor releases whose XLA knows FLAG and was measured with it
OPT_OUT = "KAGGLE_UTILS_XLA_CPU_TUNING"


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
