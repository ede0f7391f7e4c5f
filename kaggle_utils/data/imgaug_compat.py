"""Import imgaug 0.4 on NumPy 2, without changing NumPy for anyone else.

Why this exists: imgaug 0.4.0 (its last release, 2020) is still the library the flower
tutorial's RandAugment comes from, but JAX 0.10 needs NumPy 2, and imgaug touches two
NumPy attributes that NumPy removed:

* ``np.sctypes`` (removed in NumPy 2.0) is read once, at import time, by
  ``imgaug/imgaug.py`` to build its dtype sets; without it ``import imgaug`` fails.
* ``np.complex`` (the alias of the builtin ``complex``, removed in NumPy 1.24) is read at
  call time by ``imgaug.parameters.Power`` and ``FrequencyNoise``.

(``np.bool``, also used by imgaug, is back in NumPy 2 as an alias of ``np.bool_``.)

The step is contained: ``np.sctypes`` exists only while imgaug's modules execute and is
removed afterwards, and ``np.complex`` is given only to the imgaug modules that read it,
through a NumPy namespace private to those modules. Code outside imgaug never sees a
patched NumPy. Use :func:`import_imgaug_augmenters` instead of ``import imgaug`` anywhere in
the kit (the augmentation worker processes do the same).
"""
from __future__ import annotations

import importlib
import sys
import threading
import types

import numpy as np

_IMPORT_LOCK = threading.Lock()

# imgaug modules that read ``np.complex`` at call time (see the module docstring).
_MODULES_NEEDING_LEGACY_ALIASES = ("imgaug.parameters",)


def _legacy_sctypes() -> dict:
    """The ``np.sctypes`` dict as NumPy 1.x built it on this platform (concrete types only)."""
    def present(*names):
        return [getattr(np, n) for n in names if hasattr(np, n)]

    return {
        "int": present("int8", "int16", "int32", "int64"),
        "uint": present("uint8", "uint16", "uint32", "uint64"),
        "float": present("float16", "float32", "float64", "longdouble"),
        "complex": present("complex64", "complex128", "clongdouble"),
        "others": [bool, object, bytes, str, np.void],
    }


class _NumpyWithLegacyAliases(types.ModuleType):
    """A NumPy namespace for imgaug's own modules: NumPy itself plus the removed aliases."""

    complex = complex  # what ``np.complex`` was before NumPy 1.24

    def __init__(self):
        super().__init__("numpy")
        self.__dict__["__wrapped__"] = np

    def __getattr__(self, name):
        return getattr(np, name)


def _import_with_temporary_sctypes(name: str):
    if hasattr(np, "sctypes"):  # NumPy 1.x: nothing to do
        return importlib.import_module(name)
    np.sctypes = _legacy_sctypes()
    try:
        return importlib.import_module(name)
    finally:
        del np.sctypes


def import_imgaug_augmenters():
    """Return ``imgaug.augmenters`` (``iaa``), importable and working on NumPy 2.

    Raises ImportError with the install hint when imgaug is not installed (it is not on
    Kaggle's TPU image: ``pip install imgaug`` or attach a wheel dataset).
    """
    with _IMPORT_LOCK:
        if "imgaug.augmenters" not in sys.modules:
            try:
                _import_with_temporary_sctypes("imgaug.augmenters")
            except ModuleNotFoundError as err:
                if err.name != "imgaug":
                    raise
                raise ImportError(
                    "the 'imgaug' augmentation needs the imgaug package (pip install imgaug==0.4.0); "
                    "or use augment='randaugment', the TensorFlow-native version") from err
        for module_name in _MODULES_NEEDING_LEGACY_ALIASES:
            module = sys.modules.get(module_name)
            if module is not None and not isinstance(module.np, _NumpyWithLegacyAliases):
                module.np = _NumpyWithLegacyAliases()
        return sys.modules["imgaug.augmenters"]
