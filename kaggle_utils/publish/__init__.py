"""Release tooling, imported by nothing at run time: upload-ready Kaggle folders and a metadata lint.

``python -m kaggle_utils.publish package OUT`` writes one folder per notebook (with its
``kernel-metadata.json``), ``kaggle-utils/`` (the kit) and ``efficientnetv2-jax/`` (the ``--weights``), then
lints them; ``lint [--fix]`` checks metadata, notebooks and the README (:mod:`.lint` lists the traps).
"""
from .cli import main
from .lint import Problem, lint
from .metadata import (FLOWER_NOTEBOOK, KIT_SLUG, NOTEBOOK_TITLES, WEIGHTS_SLUG, PackagingError, kernel_metadata,
                       notebook_title, slugify)
from .package import PackageResult, package

__all__ = ["FLOWER_NOTEBOOK", "KIT_SLUG", "NOTEBOOK_TITLES", "PackageResult", "PackagingError", "Problem",
           "WEIGHTS_SLUG", "kernel_metadata", "lint", "main", "notebook_title", "package", "slugify"]
