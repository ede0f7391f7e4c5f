"""Release tooling, imported by nothing at run time: upload-ready Kaggle folders and a metadata lint.

``python -m kaggle_utils.publish package OUT --public|--private`` writes one folder per notebook (with its
``kernel-metadata.json``), ``kaggle-utils/`` (the kit) and the ``--weights`` as a dataset (``efficientnetv2-jax/``)
or a Kaggle Model (``efficientnetv2-jax-model/``), for the owner ``--user`` names or the kaggle client is set up
for, lints them and prints the kaggle commands that upload them; ``lint [--fix]`` checks the metadata files,
notebooks and the README as strictly as the kaggle client does, and more (:mod:`.rules`).
"""
import argparse
import sys

from .lint import Problem, lint
from .metadata import (FLOWER_NOTEBOOK, KIT_SLUG, MODEL_FOLDER, NOTEBOOK_TITLES, PORT_NOTEBOOK, WEIGHTS_AS,
                       WEIGHTS_SLUG, PackagingError, kaggle_owner, kernel_metadata, notebook_title, slugify)
from .package import PackageResult, package

__all__ = ["FLOWER_NOTEBOOK", "KIT_SLUG", "MODEL_FOLDER", "NOTEBOOK_TITLES", "PORT_NOTEBOOK", "PackageResult",
           "PackagingError", "Problem", "WEIGHTS_SLUG", "kaggle_owner", "kernel_metadata", "lint", "main",
           "notebook_title", "package", "slugify"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils.publish",
                                     description="Build upload-ready Kaggle folders, or lint Kaggle metadata.")
    commands = parser.add_subparsers(dest="command", required=True)
    pkg = commands.add_parser("package", help="one folder per notebook, one for the kit, one for the weights")
    pkg.add_argument("out", help="output folder")
    seen = pkg.add_mutually_exclusive_group(required=True)
    seen.add_argument("--public", dest="public", action="store_true", default=None,
                      help="others can fork the notebooks and attach the kit and weights")
    seen.add_argument("--private", dest="public", action="store_false", help="only you (and those you share with)")
    pkg.add_argument("--user", help="Kaggle owner in every id (default: the kaggle client's user: KAGGLE_USERNAME or "
                                    "~/.kaggle/kaggle.json)")
    pkg.add_argument("--notebooks", help="folder of .ipynb files (default: the repository's notebooks/)")
    pkg.add_argument("--weights", nargs="+", default=[], metavar="FILE.msgpack",
                     help="ported weights, each with its JSON manifest beside it (default: none; the notebooks then "
                          "attach the port notebook's output)")
    pkg.add_argument("--weights-as", choices=WEIGHTS_AS, default="dataset",
                     help="publish --weights as a dataset or as a Kaggle Model (a variation per model, framework "
                          "Flax)")
    pkg.add_argument("--overwrite", action="store_true", help="replace folders already in OUT")
    chk = commands.add_parser("lint", help="check kernel-, dataset-, model- and model-instance-metadata.json files "
                                           "(as the kaggle client would, and more), notebooks and the README")
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
        result = package(args.out, public=args.public, user=args.user, notebooks_dir=args.notebooks,
                         weights=args.weights, weights_as=args.weights_as, overwrite=args.overwrite)
    except PackagingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in result.notes:
        print(f"note: {note}")
    for name, keys in result.stripped.items():
        print(f"stripped from the copy of {name}: {', '.join(keys)}")
    print("\n".join(result.summary()))
    return _report(result.problems)
