"""Release tooling, imported by nothing at run time: upload-ready Kaggle folders and a metadata lint.

::

    python -m kaggle_utils.publish package OUT [--user NAME] [--notebooks DIR] [--weights FILE.msgpack ...] [--overwrite]
    python -m kaggle_utils.publish lint [--fix] [PATHS ...]

``package`` writes under ``OUT`` one folder per ``notebooks/*.ipynb`` (a copy without Kaggle's
pinned-image keys, and its ``kernel-metadata.json``: the flower notebook on a ``TpuV5E8`` with the
competition, the others on a CPU, all offline but the porting notebook), ``kaggle-utils/`` (the kit
as a dataset: ``kaggle datasets create -p DIR --dir-mode zip``) and ``efficientnetv2-jax/`` (the
``--weights`` with their manifests), then lints what it wrote.

``lint`` checks metadata files, notebooks and Markdown (default: the top-level
``kernel-metadata.json``, ``notebooks/*.ipynb``, the README) for the traps that make a push
"succeed" and then do something else: a title whose slug is not the id's (the kernel is created at
the title's slug), a pinned ``docker_image`` with ``enable_tpu`` (runs on the CPU image),
``enable_internet`` left out (the CLI turns it on) or on with a competition (no submission),
``c/`` / ``d/`` / URL source prefixes, a missing ``code_file``, a misspelt key, a bootstrap cell
that is not ``runtime.BOOTSTRAP`` verbatim. ``--fix`` strips pinned-image keys and rewrites stale
bootstrap cells; the rest is left to a person. Owners default to the placeholder ``kaggle-utils``.
"""
from .cli import build_parser, main
from .lint import (Problem, default_lint_paths, lint, lint_dataset_metadata, lint_kernel_metadata, lint_markdown,
                   lint_notebook)
from .metadata import (COMPETITION, DATASET_METADATA, DEFAULT_USER, FLOWER_NOTEBOOK, KERNEL_METADATA, KIT_SLUG,
                       NOTEBOOK_TITLES, ONLINE_NOTEBOOKS, WEIGHTS_SLUG, PackagingError, dataset_metadata_for_kit,
                       dataset_metadata_for_weights, kernel_metadata, notebook_title, slugify, strip_pinned_image)
from .package import PackageResult, package
