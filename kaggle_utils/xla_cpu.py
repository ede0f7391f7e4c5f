"""The XLA:CPU compiler option under which the kit's EfficientNet is fast on CPU.

Why this exists: jaxlib 0.10's XLA:CPU hands dots, convolutions, elementwise fusions and
reductions to YNNPACK by default. On a 2-core x86 machine (``bench/model_speed.py``), its
convolutions and elementwise kernels often run on one core where XLA's own Eigen kernel
uses both, while its reductions are faster than XLA's loops (the depthwise kernel gradients
and BatchNorm statistics of the training step). So YNNPACK keeps the reductions only: eval
and the training step (``efficientnet.layers.conv2d``'s CPU path) are faster that way than with
YNNPACK's default, and much faster than with YNNPACK off; figures in bench/README.md.

XLA reads ``XLA_FLAGS`` once, when JAX starts its CPU backend, so :func:`apply` runs when
the ``kaggle_utils`` package is first imported, which is before any computation in the kit's
jobs, notebooks (their first cell imports ``kaggle_utils.runtime``) and tests. Rules:

* A user's own ``--xla_cpu_experimental_ynn_fusion_type`` in ``XLA_FLAGS`` wins.
* XLA aborts the process on an unknown flag, so the option is added only for jaxlib
  versions it was measured on (:data:`MEASURED_JAXLIB`); elsewhere nothing changes.
* If JAX's backends already started, the option cannot take effect any more: a warning says
  so (on the CPU backend only, where it matters) instead of changing nothing silently.
  Set ``KAGGLE_UTILS_XLA_CPU_TUNING=0`` to leave ``XLA_FLAGS`` alone.

The option changes which library computes an op, not the op: results agree to float
rounding (the timm parity tests run under it).
"""
from __future__ import annotations

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


def _backends_started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    started = getattr(bridge, "backends_are_initialized", None)
    return bool(started and started())


def apply(environ=os.environ) -> bool:
    """Add ``FLAG=VALUE`` to ``XLA_FLAGS`` when it can take effect; True if it was added."""
    flags = environ.get("XLA_FLAGS", "")
    if environ.get(OPT_OUT, "1") == "0" or FLAG in flags or _jaxlib_release() not in MEASURED_JAXLIB:
        return False
    if _backends_started():
        import jax

        if jax.default_backend() == "cpu":
            warnings.warn(
                f"JAX started its CPU backend before kaggle_utils was imported, so XLA runs without "
                f"{FLAG}={VALUE} and EfficientNet on CPU runs slower. Import kaggle_utils before the "
                f"first JAX computation, or set XLA_FLAGS={FLAG}={VALUE} yourself.", stacklevel=3)
        return False
    environ["XLA_FLAGS"] = f"{flags} {FLAG}={VALUE}".strip()
    return True
