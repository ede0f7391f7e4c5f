"""The lint: each metadata file the kaggle client sends (:mod:`.rules`), the notebook a kernel's ``code_file``
names, and the bootstrap cell.

The bootstrap cell runs before the kit is importable, so it is copied text, and copies drift: the README and
every notebook naming ``kaggle_utils`` must hold ``runtime.BOOTSTRAP`` verbatim, as their first code cell. A cell
after it is the user's (notebook 4's settings): ``--fix`` rewrites a stale bootstrap only, never another cell.
"""
import textwrap
from functools import partial
from pathlib import Path
from typing import Sequence

from ..runtime import BOOTSTRAP
from .metadata import (CODE_SUFFIXES, DATASET_METADATA, INSTANCE_METADATA, KERNEL_METADATA, MODEL_METADATA, REPO,
                       PackagingError, strip_pinned_image, write_json)
from .rules import (Found, Problem, dataset_problems, instance_problems, kernel_problems, model_problems,
                    read_json)

__all__ = ["Problem", "lint", "lint_kernel_metadata", "lint_notebook", "lint_markdown"]


def lint_kernel_metadata(path: str | Path, *, fix: bool = False, template: bool = False) -> list[Problem]:
    """Problems of one ``kernel-metadata.json`` (and of the notebook its ``code_file`` names; ``fix`` strips that
    notebook's pinned-image keys); ``template``: the repository's owner-less file (no id, no visibility)."""
    path = Path(path)
    found, meta, kernel_type = kernel_problems(path, template=template)
    code_file = meta.get("code_file") if meta is not None else None
    if isinstance(code_file, str) and code_file:
        code = path.parent / code_file
        if not code.is_file():
            found("code_file", f"{code_file!r} does not exist (looked for {code})")
        elif kernel_type is not None and code.suffix not in CODE_SUFFIXES[kernel_type]:
            found("code_file", f"{code_file!r} is not a {kernel_type} ({'/'.join(CODE_SUFFIXES[kernel_type])})")
        elif code.suffix == ".ipynb":
            found += lint_notebook(code, fix=fix)
    return found


MARKER = BOOTSTRAP.splitlines()[0]  # "# kaggle_utils bootstrap: ..." opens every copy


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def _first_difference(copy: str, expected: str) -> str:
    got, want = copy.rstrip().splitlines(), expected.rstrip().splitlines()
    for n, (a, b) in enumerate(zip(got, want), 1):
        if a != b:
            return f"line {n} is {a!r}, expected {b!r}"
    n = min(len(got), len(want)) + 1
    return f"line {n}: {'extra' if len(got) > len(want) else 'missing'} " \
           f"{(got if len(got) > len(want) else want)[n - 1]!r}"


def _bootstrap_issue(notebook: dict, *, fix: bool = False) -> str | None:
    """Why the notebook's first code cell is not the bootstrap, or None; ``fix`` replaces a stale copy (a
    first code cell opening with :data:`MARKER`). A missing cell is not added: where is for a person to say."""
    code = [c for c in notebook.get("cells", []) if isinstance(c, dict) and c.get("cell_type") == "code"]
    if not any("kaggle_utils" in _source(c) for c in code):
        return None
    expected = BOOTSTRAP.rstrip("\n")
    first = _source(code[0])
    if first.rstrip() == expected:
        return None
    if not first.lstrip().startswith(MARKER):
        return ("the first code cell is not the kit's bootstrap, and a later cell imports kaggle_utils: start the "
                "notebook with the cell `python -m kaggle_utils.runtime --bootstrap` prints")
    difference = _first_difference(first, expected)
    setup_line = expected.splitlines()[-1]  # RT = runtime.setup()
    lines = first.rstrip().splitlines()
    at = next((i for i, line in enumerate(lines) if line.lstrip().startswith(setup_line.split("=")[0].strip())), None)
    if at is not None and lines[at:] != [setup_line]:  # the user's own edit (a model, a size): never overwritten
        return (f"the bootstrap cell's {setup_line!r} line was edited ({difference}): --fix leaves this cell alone; "
                "choose the run in the settings cell after it (RT.configure(model=..., image_size=...)) and restore "
                "the line, or paste the cell `python -m kaggle_utils.runtime --bootstrap` prints")
    if fix:
        code[0]["source"] = expected.splitlines(keepends=True)
    return "the bootstrap cell differs from kaggle_utils.runtime.BOOTSTRAP: " + difference


def lint_notebook(path: str | Path, *, fix: bool = False) -> list[Problem]:
    """A notebook must be readable, free of pinned-image keys and, when it uses the kit, start with the
    bootstrap cell verbatim; ``fix`` strips the keys and rewrites a stale bootstrap (atomic rewrite)."""
    path = Path(path)
    found, notebook = read_json(path)
    if notebook is None:
        return found
    if not isinstance(notebook.get("cells"), list):
        found("cells", "missing: not a Jupyter notebook")
        return found
    # the JSON types nbformat requires where the rules read: a value of another type is named, not a traceback
    if not isinstance(notebook.get("metadata", {}), dict):
        found("metadata", f"must be a JSON object, got {type(notebook['metadata']).__name__}")
    for i, cell in enumerate(notebook["cells"]):
        source = cell.get("source", "") if isinstance(cell, dict) else None
        if not isinstance(cell, dict):
            found(f"cells[{i}]", f"must be a JSON object, got {type(cell).__name__}")
        elif not (isinstance(source, str) or isinstance(source, list) and all(isinstance(x, str) for x in source)):
            found(f"cells[{i}].source", "must be a string or a list of strings")
    if found:
        return found
    removed = strip_pinned_image(notebook)
    stale = _bootstrap_issue(notebook, fix=fix)
    fixed_stale = fix and stale is not None and _bootstrap_issue(notebook) is None
    if fix and (removed or fixed_stale):
        write_json(path, notebook, indent=1)
    for key in removed:
        found(key, "Kaggle's pinned image: with it the kernel keeps that image (the CPU one, even with enable_tpu); "
                   "remove it (lint --fix, or package strips copies)", fixed=fix)
    if stale is not None:
        found("cells[bootstrap]", stale, fixed=fixed_stale)
    return found


def lint_markdown(path: str | Path) -> list[Problem]:
    """A Markdown file (the README) that shows the bootstrap cell must show it verbatim, in a fenced block."""
    found = Found(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError) as e:
        return [Problem(found.file, "(file)", f"not readable: {e}")]
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        start = next((j for j in range(i - 1, -1, -1) if lines[j].strip().startswith("```")), None)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if start is None or end is None:
            found(f"line {i + 1}", "the bootstrap is not inside a fenced code block")
            continue
        block = textwrap.dedent("\n".join(lines[start + 1:end]))
        if block.rstrip() != BOOTSTRAP.rstrip():
            found(f"line {i + 1}", "the bootstrap block differs from kaggle_utils.runtime.BOOTSTRAP: "
                                   + _first_difference(block, BOOTSTRAP))
    return found


_LINTERS = {KERNEL_METADATA: lint_kernel_metadata, DATASET_METADATA: lambda p, fix: dataset_problems(p),
            MODEL_METADATA: lambda p, fix: model_problems(p), INSTANCE_METADATA: lambda p, fix: instance_problems(p),
            ".ipynb": lint_notebook, ".md": lambda p, fix: lint_markdown(p)}
METADATA_FILES = (KERNEL_METADATA, DATASET_METADATA, MODEL_METADATA, INSTANCE_METADATA)


def _linter(path: Path):
    """How ``path`` is linted, by its name; None for files lint does not check."""
    return _LINTERS.get(path.name) or _LINTERS.get(path.suffix)


def lint(paths: Sequence[str | Path] | None = None, *, fix: bool = False) -> list[Problem]:
    """Problems of every metadata file and notebook in ``paths`` (files or folders, searched recursively; default:
    the top-level kernel-metadata.json as the template it is, the notebooks and the README). ``fix`` strips
    pinned-image keys from the notebooks (listed, or named by a ``code_file``) and rewrites stale bootstrap cells,
    reporting those problems as fixed. A notebook reached twice is reported once."""
    template = None
    if paths is None:
        template = REPO / KERNEL_METADATA
        paths = [template, *sorted((REPO / "notebooks").glob("*.ipynb")), REPO / "README.md"]
    targets = []  # every folder checked before any file is read
    for p in map(Path, paths):
        if not p.is_dir():  # a file given by name; any other name is linted as kernel metadata (the strict one)
            targets.append(p)
            continue
        found = [f for f in sorted(p.rglob("*")) if ".ipynb_checkpoints" not in f.parts and f.is_file() and _linter(f)]
        if not found:
            raise PackagingError(f"{p}: nothing to check (no {', '.join(METADATA_FILES)} or .ipynb in it): give the "
                                 "folder or files to lint")
        targets += found
    unique: dict[tuple, Problem] = {}
    for p in targets:
        linter = partial(lint_kernel_metadata, template=True) if p == template else _linter(p) or lint_kernel_metadata
        for problem in linter(p, fix=fix):
            unique.setdefault((Path(problem.file).resolve(), problem.key, problem.message), problem)
    return list(unique.values())
