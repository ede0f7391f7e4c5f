"""Import imgaug 0.4 on NumPy 2 without changing NumPy for anyone else: ``np.sctypes`` (read at import time)
exists only while imgaug's modules execute; ``np.complex`` (read at call time by ``imgaug.parameters``) is given
to that module alone, through a NumPy namespace of its own.
"""

import importlib
import sys
import threading
import types

import numpy as np

_IMPORT_LOCK = threading.Lock()


class _NumpyWithLegacyAliases(types.ModuleType):
    """NumPy plus ``complex``, the alias NumPy 1.24 removed, for imgaug's own modules."""

    complex = complex

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
        parameters = sys.modules["imgaug.parameters"]
        if not isinstance(parameters.np, _NumpyWithLegacyAliases):
            parameters.np = _NumpyWithLegacyAliases("numpy")
        return sys.modules["imgaug.augmenters"]
