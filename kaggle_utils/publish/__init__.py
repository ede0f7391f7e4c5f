"""Release tooling, imported by nothing at run time: upload-ready Kaggle folders and a metadata lint.

``python -m kaggle_utils.publish package OUT`` writes one folder per notebook (with its
``kernel-metadata.json``), ``kaggle-utils/`` (the kit) and ``efficientnetv2-jax/`` (the ``--weights``), then
lints them; ``lint [--fix]`` checks metadata, notebooks and the README (:mod:`.lint` lists the traps).
"""
import argparse
import sys

from .lint import Problem, lint
from .metadata import (DEFAULT_USER, FLOWER_NOTEBOOK, KIT_SLUG, NOTEBOOK_TITLES, WEIGHTS_SLUG, PackagingError,
                       kernel_metadata, notebook_title, slugify)
from .package import PackageResult, package

__all__ = ["FLOWER_NOTEBOOK", "KIT_SLUG", "NOTEBOOK_TITLES", "PackageResult", "PackagingError", "Problem",
           "WEIGHTS_SLUG", "kernel_metadata", "lint", "main", "notebook_title", "package", "slugify"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils.publish",
                                     description="Build upload-ready Kaggle folders, or lint Kaggle metadata.")
    commands = parser.add_subparsers(dest="command", required=True)
    pkg = commands.add_parser("package", help="one folder per notebook, one for the kit, one for the weights")
    pkg.add_argument("out", help="output folder")
    pkg.add_argument("--user", default=DEFAULT_USER, help=f"Kaggle owner in every id (default {DEFAULT_USER})")
    pkg.add_argument("--notebooks", help="folder of .ipynb files (default: the repository's notebooks/)")
    pkg.add_argument("--weights", nargs="+", default=[], metavar="FILE.msgpack",
                     help="ported weights, each with its JSON manifest beside it")
    pkg.add_argument("--overwrite", action="store_true", help="replace folders already in OUT")
    chk = commands.add_parser("lint", help="check kernel-/dataset-metadata.json files, notebooks and the README")
    chk.add_argument("paths", nargs="*", help="files or folders (default: the top-level kernel-metadata.json, "
                                              "notebooks/*.ipynb and README.md)")
    chk.add_argument("--fix", action="store_true", help="strip Kaggle's pinned-image keys from notebooks and "
                                                        "rewrite stale bootstrap cells, in place")
    return parser


def _report(problems: list[Problem], ok: str | None = None) -> int:
    for p in problems:
        print(p, file=sys.stderr if not p.fixed else sys.stdout)
    remaining = [p for p in problems if not p.fixed]
    if remaining or ok:
        print(f"{len(remaining)} problem(s)" if remaining else ok, file=sys.stderr if remaining else sys.stdout)
    return 1 if remaining else 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "lint":
            return _report(lint(args.paths or None, fix=args.fix), ok="lint: ok")
        result = package(args.out, user=args.user, notebooks_dir=args.notebooks, weights=args.weights,
                         overwrite=args.overwrite)
    except PackagingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in result.notes:
        print(f"note: {note}")
    for name, keys in result.stripped.items():
        print(f"stripped from the copy of {name}: {', '.join(keys)}")
    upload = {KIT_SLUG: "kaggle datasets create -p {} --dir-mode zip", WEIGHTS_SLUG: "kaggle datasets create -p {}"}
    for name, folder in result.folders.items():
        print(upload.get(name, "kaggle kernels push -p {}").format(folder))
    return _report(result.problems)
