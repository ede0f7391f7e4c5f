"""Import imgaug 0.4 on NumPy 2 without changing NumPy for anyone else.

imgaug 0.4.0 (2020, its last release) reads two attributes NumPy 2 removed: ``np.sctypes`` once, at import
time, and ``np.complex`` at call time (``imgaug.parameters``). ``np.sctypes`` exists only while imgaug's modules
execute; ``np.complex`` is given only to the imgaug modules that read it, through a NumPy namespace of their own.
"""

import importlib
import sys
import threading
import types

import numpy as np

_IMPORT_LOCK = threading.Lock()
_MODULES_NEEDING_LEGACY_ALIASES = ("imgaug.parameters",)  # they read np.complex at call time


class _NumpyWithLegacyAliases(types.ModuleType):
    """NumPy plus ``complex``, the alias NumPy 1.24 removed, for imgaug's own modules."""

    complex = complex

    def __init__(self):
        super().__init__("numpy")

    def __getattr__(self, name):
        return getattr(np, name)


def import_imgaug_augmenters():
    """``imgaug.augmenters`` (``iaa``), working on NumPy 2; ImportError with the install hint where imgaug is
    not installed (Kaggle's TPU image)."""
    with _IMPORT_LOCK:
        if "imgaug.augmenters" not in sys.modules:
            added = not hasattr(np, "sctypes")
            if added:  # the dict NumPy 1.x built, concrete types only
                np.sctypes = {kind: [getattr(np, n) for n in names.split() if hasattr(np, n)] for kind, names in (
                    ("int", "int8 int16 int32 int64"), ("uint", "uint8 uint16 uint32 uint64"),
                    ("float", "float16 float32 float64 longdouble"), ("complex", "complex64 complex128 clongdouble"))}
                np.sctypes["others"] = [bool, object, bytes, str, np.void]
            try:
                importlib.import_module("imgaug.augmenters")
            except ModuleNotFoundError as err:
                if err.name != "imgaug":
                    raise
                raise ImportError("the 'imgaug' augmentation needs the imgaug package (pip install imgaug==0.4.0); "
                                  "or use augment='randaugment', the TensorFlow-native version") from err
            finally:
                if added:
                    del np.sctypes
        for name in _MODULES_NEEDING_LEGACY_ALIASES:
            module = sys.modules.get(name)
            if module is not None and not isinstance(module.np, _NumpyWithLegacyAliases):
                module.np = _NumpyWithLegacyAliases()
        return sys.modules["imgaug.augmenters"]
