"""The metadata lint: the traps that make a Kaggle push "succeed" and then do something else.

A title whose slug is not the id's, a pinned ``docker_image`` with ``enable_tpu``, ``enable_internet`` left
out or on with a competition, ``c/`` / ``d/`` / URL source prefixes, a missing ``code_file``, a misspelt
key; and the bootstrap cell: it runs before the kit is importable, so it is copied text, and copies drift,
so the README and every notebook naming ``kaggle_utils`` must hold ``runtime.BOOTSTRAP`` verbatim.
"""
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..runtime import BOOTSTRAP
from .metadata import (CODE_SUFFIXES, COMPETITION, DATASET_KEYS, DATASET_METADATA, KERNEL_BOOLEANS, KERNEL_KEYS,
                       KERNEL_METADATA, LANGUAGES, OWNER_PATTERN, REPO, SLUG_PATTERN, TPU_SHAPE, PackagingError,
                       fold_ascii, slugify, strip_pinned_image, write_json)


@dataclass(frozen=True)
class Problem:
    """One rule broken by one key of one file; ``fixed`` when ``lint(fix=True)`` repaired it."""

    file: str
    key: str
    message: str
    fixed: bool = False

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" + (" (fixed)" if self.fixed else "")


class _Found(list):
    """The problems of one file: ``found(key, message)`` adds one (and returns None: ``return found(...)``)."""

    def __init__(self, path: Path):
        super().__init__()
        self.file = str(path)

    def __call__(self, key: str, message: str, fixed: bool = False) -> None:
        self.append(Problem(self.file, key, message, fixed))


def _read_json(path: Path, known: frozenset | None = None) -> tuple[_Found, dict | None]:
    """The problems found so far and the parsed JSON object (None when there is none); keys outside
    ``known`` are problems."""
    found = _Found(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return found, found("(file)", "does not exist")
    except (OSError, ValueError) as e:
        return found, found("(file)", f"not readable JSON: {e}")
    if not isinstance(data, dict):
        return found, found("(file)", f"holds a JSON {type(data).__name__}, not an object")
    for key in sorted(set(data) - known) if known else ():
        found(key, f"unknown key: Kaggle ignores it (misspelt?); known keys: {', '.join(sorted(known))}")
    return found, data


def _check_id(found: _Found, key: str, value, *, slug_len: tuple[int, int] | None = None) -> str | None:
    """``owner/slug``; returns the slug or None."""
    if not isinstance(value, str) or value.count("/") != 1:
        return found(key, f"{value!r} is not \"owner/slug\"")
    owner, slug = value.split("/")
    if not OWNER_PATTERN.fullmatch(owner):
        found(key, f"owner {owner!r} of {value!r} is not a Kaggle user name")
    if not SLUG_PATTERN.fullmatch(slug):
        found(key, f"slug {slug!r} of {value!r} is not lowercase letters, digits and single dashes")
    if slug_len and not slug_len[0] <= len(slug) <= slug_len[1]:
        found(key, f"slug {slug!r} has {len(slug)} characters; Kaggle wants {slug_len[0]}-{slug_len[1]}")
    return slug


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# key -> (test of a present value, what the value must be): each failed test is one problem of that key
_STRINGS = (_is_str_list, "a list of strings")
_KERNEL_RULES = {
    "language": (lambda v: isinstance(v, str) and v in LANGUAGES, f"one of {', '.join(LANGUAGES)}"),
    "kernel_type": (lambda v: isinstance(v, str) and v in CODE_SUFFIXES, "'notebook' or 'script'"),
    "code_file": (lambda v: isinstance(v, str) and bool(v), "a file name"),
    **{key: (lambda v: isinstance(v, bool), "true or false") for key in KERNEL_BOOLEANS},
    **{key: _STRINGS for key in ("keywords", "competition_sources", "dataset_sources", "kernel_sources",
                                 "model_sources")},
}
_DATASET_RULES = {
    "title": (lambda v: isinstance(v, str) and 6 <= len(v) <= 50, "6-50 characters (Kaggle's limit)"),
    "subtitle": (lambda v: isinstance(v, str) and 20 <= len(v) <= 80, "20-80 characters (Kaggle's limit)"),
    "licenses": (lambda v: isinstance(v, list) and len(v) == 1 and isinstance(v[0], dict)
                 and isinstance(v[0].get("name"), str) and bool(v[0]["name"]),
                 'exactly one license, e.g. [{"name": "apache-2.0"}]'),
    "resources": (lambda v: isinstance(v, list), "a list of {path, description}"),
    "keywords": _STRINGS,
}


def _check_values(found: _Found, meta: dict, required: Sequence[str], rules: dict) -> None:
    """The ``required`` keys present, and every present key of ``rules`` passing its test."""
    for key in required:
        if key not in meta:
            found(key, "missing")
    for key, (test, what) in rules.items():
        if key in meta and not test(meta[key]):
            found(key, f"must be {what}, got {meta[key]!r}")


def _check_sources(found: _Found, meta: dict) -> None:
    """The sources' forms (their types are :data:`_KERNEL_RULES`')."""
    strings = lambda key: meta[key] if _is_str_list(meta.get(key)) else []  # noqa: E731
    for source in strings("competition_sources"):
        if "/" in source or ":" in source:
            found("competition_sources", f"{source!r}: give the bare competition slug (e.g. {COMPETITION!r}), "
                                         "no 'c/' prefix or URL")
    for key, parts, example in (("dataset_sources", 2, "owner/slug"), ("kernel_sources", 2, "owner/slug"),
                                ("model_sources", None, "owner/model/framework/variation/version")):
        for source in strings(key):
            segments = source.split("/")
            bad = ":" in source or "kaggle.com" in source or segments[0] in ("d", "k", "m", "code", "datasets")
            if bad or (len(segments) != parts if parts else len(segments) < 4) or not all(segments):
                found(key, f"{source!r} is not {example!r} (no URL, no 'd/' prefix)")


def _check_title(found: _Found, title, slug: str | None) -> None:
    if not isinstance(title, str) or len(title.strip()) < 5:
        return found("title", f"{title!r}: Kaggle wants a title of at least 5 characters")
    if any(ch.isalnum() and not fold_ascii(ch) for ch in title):
        found("title", f"{title!r} has letters Kaggle transliterates in ways this check cannot follow: use ASCII")
    expected = slugify(title)
    if slug is not None and expected != slug:
        found("title", f"{title!r} slugifies to {expected!r} but the id's slug is {slug!r}: Kaggle would create the "
                       f"kernel at .../{expected} and the id would name nothing; make the title slugify to the id")


def _check_machine(found: _Found, meta: dict) -> None:
    tpu, gpu = meta.get("enable_tpu") is True, meta.get("enable_gpu") is True
    if "docker_image" in meta:
        found("docker_image", "remove it: " + ("with enable_tpu the kernel silently runs on that (CPU) image, not on "
                                               "a TPU" if tpu else "it pins an old image; leave it out so Kaggle "
                                               "picks the current one"))
    if tpu and gpu:
        found("enable_tpu", "enable_tpu and enable_gpu are both true: choose one")
    shape = meta.get("machine_shape")
    if shape is None:
        if tpu:
            found("machine_shape", f"missing with enable_tpu: set it (e.g. {TPU_SHAPE!r})")
    elif not isinstance(shape, str) or not shape:
        found("machine_shape", f"{shape!r} is not a machine shape name")
    elif tpu and not shape.startswith("Tpu"):
        found("machine_shape", f"{shape!r} is not a TPU shape (e.g. {TPU_SHAPE!r}) but enable_tpu is true")
    elif gpu and not shape.startswith("Nvidia"):
        found("machine_shape", f"{shape!r} is not a GPU shape (e.g. 'NvidiaTeslaT4') but enable_gpu is true")
    elif not tpu and not gpu:
        found("machine_shape", f"{shape!r} without {'enable_tpu' if shape.startswith('Tpu') else 'enable_gpu'}: true")


def lint_kernel_metadata(path: str | Path, *, fix: bool = False) -> list[Problem]:
    """Problems of one ``kernel-metadata.json`` (and of the notebook its ``code_file`` names;
    ``fix`` strips that notebook's pinned-image keys)."""
    path = Path(path)
    found, meta = _read_json(path, KERNEL_KEYS)
    if meta is None:
        return found
    _check_values(found, meta, ("id", "title", "code_file", "language", "kernel_type"), _KERNEL_RULES)
    slug = _check_id(found, "id", meta["id"]) if "id" in meta else None
    if "title" in meta:
        _check_title(found, meta["title"], slug)
    kernel_type = meta.get("kernel_type") if _KERNEL_RULES["kernel_type"][0](meta.get("kernel_type")) else None
    if "enable_internet" not in meta:
        found("enable_internet", "missing: the kaggle CLI then turns internet ON; set it explicitly (false for a "
                                 "competition notebook)")
    elif meta["enable_internet"] is not False and meta.get("competition_sources"):
        found("enable_internet", "must be false with competition_sources: Kaggle does not accept submissions from "
                                 "notebooks with internet on")
    _check_machine(found, meta)
    _check_sources(found, meta)
    code_file = meta.get("code_file")
    if isinstance(code_file, str) and code_file:
        code = path.parent / code_file
        if not code.is_file():
            found("code_file", f"{code_file!r} does not exist (looked for {code})")
        elif kernel_type is not None and code.suffix not in CODE_SUFFIXES[kernel_type]:
            found("code_file", f"{code_file!r} is not a {kernel_type} ({'/'.join(CODE_SUFFIXES[kernel_type])})")
        elif code.suffix == ".ipynb":
            found += lint_notebook(code, fix=fix)
    return found


def lint_dataset_metadata(path: str | Path) -> list[Problem]:
    """Problems of one ``dataset-metadata.json`` (lengths, id, exactly one license, resources present)."""
    path = Path(path)
    found, meta = _read_json(path, DATASET_KEYS)
    if meta is None:
        return found
    _check_values(found, meta, ("title", "id", "licenses"), _DATASET_RULES)
    if "id" in meta:
        _check_id(found, "id", meta["id"], slug_len=(3, 50))
    resources = meta["resources"] if isinstance(meta.get("resources"), list) else []
    for i, res in enumerate(resources):
        if not isinstance(res, dict) or not isinstance(res.get("path"), str):
            found(f"resources[{i}]", f"{res!r} has no \"path\"")
        elif not (path.parent / res["path"]).exists():
            found(f"resources[{i}]", f"path {res['path']!r} does not exist beside the metadata")
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
    if fix:
        code[0]["source"] = expected.splitlines(keepends=True)
    return "the bootstrap cell differs from kaggle_utils.runtime.BOOTSTRAP: " + _first_difference(first, expected)


def lint_notebook(path: str | Path, *, fix: bool = False) -> list[Problem]:
    """A notebook must be readable, free of pinned-image keys and, when it uses the kit, start with the
    bootstrap cell verbatim; ``fix`` strips the keys and rewrites a stale bootstrap (atomic rewrite)."""
    path = Path(path)
    found, notebook = _read_json(path)
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
    found = _Found(path)
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


_LINTERS = {KERNEL_METADATA: lint_kernel_metadata, DATASET_METADATA: lambda p, fix: lint_dataset_metadata(p),
            ".ipynb": lint_notebook, ".md": lambda p, fix: lint_markdown(p)}


def _linter(path: Path):
    """How ``path`` is linted, by its name; None for files lint does not check."""
    return _LINTERS.get(path.name) or _LINTERS.get(path.suffix)


def lint(paths: Sequence[str | Path] | None = None, *, fix: bool = False) -> list[Problem]:
    """Problems of every metadata file and notebook in ``paths`` (files or folders, searched recursively; default:
    the top-level kernel-metadata.json, the notebooks and the README). ``fix`` strips pinned-image keys from the
    notebooks (listed, or named by a ``code_file``) and reports those problems as fixed. A notebook reached twice
    is reported once."""
    if paths is None:
        paths = [REPO / KERNEL_METADATA, *sorted((REPO / "notebooks").glob("*.ipynb")), REPO / "README.md"]
    targets = []  # every folder checked before any file is read
    for p in map(Path, paths):
        if not p.is_dir():  # a file given by name; any other name is linted as kernel metadata (the strict one)
            targets.append(p)
            continue
        found = [f for f in sorted(p.rglob("*")) if ".ipynb_checkpoints" not in f.parts and f.is_file() and _linter(f)]
        if not found:
            raise PackagingError(f"{p}: nothing to check (no {KERNEL_METADATA}, {DATASET_METADATA} or .ipynb in it): "
                                 "give the folder or files to lint")
        targets += found
    unique: dict[tuple, Problem] = {}
    for p in targets:
        for problem in (_linter(p) or lint_kernel_metadata)(p, fix=fix):
            unique.setdefault((Path(problem.file).resolve(), problem.key, problem.message), problem)
    return list(unique.values())
