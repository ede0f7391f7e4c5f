"""Release tooling, imported by nothing at run time: upload-ready Kaggle folders and a metadata lint.

``python -m kaggle_utils.publish package OUT`` writes one folder per notebook (a copy without Kaggle's
pinned-image keys, with its ``kernel-metadata.json``), ``kaggle-utils/`` (the kit as a dataset) and
``efficientnetv2-jax/`` (the ``--weights``), then lints them. ``lint [--fix]`` checks metadata,
notebooks and the README for the traps that make a push "succeed" and then do something else: a
title whose slug is not the id's, a pinned ``docker_image`` with ``enable_tpu``, ``enable_internet``
left out or on with a competition, ``c/`` / ``d/`` / URL source prefixes, a missing ``code_file``,
a misspelt key, a bootstrap cell that is not ``runtime.BOOTSTRAP`` verbatim (``--fix`` repairs the
last and the pinned keys).
"""
from .cli import main
from .lint import Problem, lint
from .metadata import (FLOWER_NOTEBOOK, KIT_SLUG, NOTEBOOK_TITLES, WEIGHTS_SLUG, PackagingError, kernel_metadata,
                       notebook_title, slugify)
from .package import PackageResult, package

__all__ = ["FLOWER_NOTEBOOK", "KIT_SLUG", "NOTEBOOK_TITLES", "PackageResult", "PackagingError", "Problem",
           "WEIGHTS_SLUG", "kernel_metadata", "lint", "main", "notebook_title", "package", "slugify"]
