"""Release tooling, not needed at run time (nothing in the kit imports it): upload-ready folders for
the notebooks, the kit and the weights, and a lint.

::

    python -m kaggle_utils.publish package OUT [--user NAME] [--notebooks DIR] [--weights FILE.msgpack ...] [--overwrite]
    python -m kaggle_utils.publish lint [--fix] [PATHS ...]

``package`` writes, under ``OUT``:

* one folder per ``notebooks/*.ipynb``: a copy without Kaggle's pinned-image keys and its
  ``kernel-metadata.json`` (``kaggle kernels push -p``). The flower notebook runs on a
  ``TpuV5E8`` with the competition attached; the others on a CPU. All have the kit and the
  weights datasets attached and run offline, except the porting notebook, which needs the
  internet to fetch timm's pretrained weights (offline it ports random ones).
* ``kaggle-utils/``: the kit as a dataset (``kaggle_utils/``, ``weights_port/``, README,
  requirements, pyproject) with ``dataset-metadata.json`` (``kaggle datasets create -p DIR
  --dir-mode zip``: the CLI skips sub-folders without ``--dir-mode``).
* ``efficientnetv2-jax/``: the ``--weights`` files with their manifests and metadata.

It then lints what it wrote. ``lint`` checks ``kernel-metadata.json`` / ``dataset-metadata.json``
files, notebooks and Markdown files (default: the top-level ``kernel-metadata.json``,
``notebooks/*.ipynb`` and the README) for the traps that make a push "succeed" and then do
something else: a title whose slug is not the id's (the kernel is created at the title's slug),
a pinned ``docker_image`` with ``enable_tpu`` (runs on the CPU image), ``enable_internet`` left
out (the CLI turns it on), internet on in a competition notebook (Kaggle refuses its
submission), ``c/`` / ``d/`` / URL source prefixes, a missing ``code_file``, an unknown
(misspelt) key, a bootstrap cell that is not ``runtime.BOOTSTRAP`` verbatim (:mod:`.bootstrap`).
``--fix`` strips the pinned-image keys from notebooks and rewrites stale bootstrap cells;
everything else is left to a person.
Owners default to the placeholder ``kaggle-utils``; ``--user`` sets your Kaggle name.

Modules: :mod:`.metadata` (slugs, titles, the metadata ``package`` writes), :mod:`.lint` (the
checks), :mod:`.bootstrap` (the first cell's copies), :mod:`.package` (the upload folders),
:mod:`.cli` (the command line).
"""
from .cli import build_parser, main
from .lint import (Problem, default_lint_paths, lint, lint_dataset_metadata, lint_kernel_metadata,
                   lint_markdown, lint_notebook)
# constants the tests and notebooks read
from .metadata import (COMPETITION, DATASET_METADATA, DEFAULT_USER, FLOWER_NOTEBOOK, KERNEL_METADATA, KIT_SLUG,
                       NOTEBOOK_TITLES, ONLINE_NOTEBOOKS, WEIGHTS_SLUG, dataset_metadata_for_kit,
                       dataset_metadata_for_weights, kernel_metadata, notebook_title, slugify,
                       strip_pinned_image)
from .package import PackageResult, PackagingError, package

__all__ = [
    "PackageResult",
    "PackagingError",
    "Problem",
    "build_parser",
    "dataset_metadata_for_kit",
    "dataset_metadata_for_weights",
    "default_lint_paths",
    "kernel_metadata",
    "lint",
    "lint_dataset_metadata",
    "lint_kernel_metadata",
    "lint_markdown",
    "lint_notebook",
    "main",
    "notebook_title",
    "package",
    "slugify",
    "strip_pinned_image",
]
