"""Process-wide test set-up, applied before any test module is imported.

Two things must happen before jax or tensorflow are first imported anywhere:

* Import order: on this stack, importing ``tensorflow`` before ``torch``/``torchvision``
  (pulled in by ``timm``) in one process segfaults, while the reverse order works. Tests
  mix both (parity tests use timm, data tests use tensorflow), so torch is imported here,
  first, whenever it is installed. Library code never imports both: ``kaggle_utils.efficientnet``
  and ``weights_port`` avoid tensorflow, ``kaggle_utils.data`` avoids torch.
* Virtual devices: multi-device tests (pmap / shard_map) need several devices on a CPU-only
  machine. JAX exposes N host devices when told before the backend starts. It is told through
  its config, not ``XLA_FLAGS``: an environment variable would be inherited by the notebook
  kernels nbmake starts, and the notebooks should run as on a user's CPU (one device). Tests that
  start processes give them their own ``XLA_FLAGS``.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

try:  # torch before tensorflow, see the module docstring
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError:  # the porter tests will fail on their own imports, with a clear message
    pass

import jax  # noqa: E402  (after torch, see above)

jax.config.update("jax_num_cpu_devices", 8)
