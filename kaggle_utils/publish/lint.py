"""The metadata lint: the traps that make a Kaggle push "succeed" and then do something else
(the package docstring lists them)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from . import bootstrap
from .metadata import (PackagingError, CODE_SUFFIXES, COMPETITION, DATASET_KEYS, DATASET_METADATA, KERNEL_BOOLEANS, KERNEL_KEYS,
                       KERNEL_METADATA, LANGUAGES, OWNER_PATTERN, REPO, SLUG_PATTERN, TPU_SHAPE, fold_ascii,
                       slugify, strip_pinned_image, write_json)


@dataclass(frozen=True)
class Problem:
    """One rule broken by one key of one file; ``fixed`` when ``lint(fix=True)`` repaired it."""

    file: str
    key: str
    message: str
    fixed: bool = False

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" + (" (fixed)" if self.fixed else "")



def _read_json(path: Path, problems: list[Problem]):
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(Problem(str(path), "(file)", "does not exist"))
        return None
    except (OSError, ValueError) as e:
        problems.append(Problem(str(path), "(file)", f"not readable JSON: {e}"))
        return None
    if not isinstance(data, dict):
        problems.append(Problem(str(path), "(file)", f"holds a JSON {type(data).__name__}, not an object"))
        return None
    return data


def _check_unknown(path: Path, meta: dict, known: frozenset, problems: list[Problem]) -> None:
    for key in sorted(set(meta) - known):
        problems.append(Problem(str(path), key, f"unknown key: Kaggle ignores it (misspelt?); known keys: "
                                                f"{', '.join(sorted(known))}"))


def _check_id(path: Path, key: str, value, problems: list[Problem], *, slug_len: tuple[int, int] | None = None):
    """``owner/slug``; returns the slug or None."""
    if not isinstance(value, str) or value.count("/") != 1:
        problems.append(Problem(str(path), key, f"{value!r} is not \"owner/slug\""))
        return None
    owner, slug = value.split("/")
    if not OWNER_PATTERN.fullmatch(owner):
        problems.append(Problem(str(path), key, f"owner {owner!r} of {value!r} is not a Kaggle user name"))
    if not SLUG_PATTERN.fullmatch(slug):
        problems.append(Problem(str(path), key, f"slug {slug!r} of {value!r} is not lowercase letters, digits "
                                                "and single dashes"))
    if slug_len and not slug_len[0] <= len(slug) <= slug_len[1]:
        problems.append(Problem(str(path), key, f"slug {slug!r} has {len(slug)} characters; Kaggle wants "
                                                f"{slug_len[0]}-{slug_len[1]}"))
    return slug


def _check_str_list(path: Path, meta: dict, key: str, problems: list[Problem]) -> list[str]:
    value = meta.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        problems.append(Problem(str(path), key, f"must be a list of strings, got {value!r}"))
        return []
    return value


def _check_sources(path: Path, meta: dict, problems: list[Problem]) -> None:
    for source in _check_str_list(path, meta, "competition_sources", problems):
        if "/" in source or ":" in source:
            problems.append(Problem(str(path), "competition_sources",
                                    f"{source!r}: give the bare competition slug (e.g. {COMPETITION!r}), "
                                    "no 'c/' prefix or URL"))
    for key, parts, example in (("dataset_sources", 2, "owner/slug"), ("kernel_sources", 2, "owner/slug"),
                                ("model_sources", None, "owner/model/framework/variation/version")):
        for source in _check_str_list(path, meta, key, problems):
            segments = source.split("/")
            bad = ":" in source or "kaggle.com" in source or segments[0] in ("d", "k", "m", "code", "datasets")
            bad = bad or (len(segments) != parts if parts else len(segments) < 4) or not all(segments)
            if bad:
                problems.append(Problem(str(path), key, f"{source!r} is not {example!r} (no URL, no 'd/' prefix)"))


def _check_title(path: Path, meta: dict, slug: str | None, problems: list[Problem]) -> None:
    title = meta.get("title")
    if not isinstance(title, str) or len(title.strip()) < 5:
        problems.append(Problem(str(path), "title", f"{title!r}: Kaggle wants a title of at least 5 characters"))
        return
    if any(ch.isalnum() and not fold_ascii(ch) for ch in title):
        problems.append(Problem(str(path), "title", f"{title!r} has letters Kaggle transliterates in ways this "
                                                    "check cannot follow: use ASCII"))
    expected = slugify(title)
    if slug is not None and expected != slug:
        problems.append(Problem(
            str(path), "title", f"{title!r} slugifies to {expected!r} but the id's slug is {slug!r}: Kaggle would "
            f"create the kernel at .../{expected} and the id would name nothing; make the title slugify to the id"))


def _check_machine(path: Path, meta: dict, problems: list[Problem]) -> None:
    tpu, gpu = meta.get("enable_tpu") is True, meta.get("enable_gpu") is True
    if "docker_image" in meta:
        why = ("with enable_tpu the kernel silently runs on that (CPU) image, not on a TPU" if tpu else
               "it pins an old image; leave it out so Kaggle picks the current one")
        problems.append(Problem(str(path), "docker_image", f"remove it: {why}"))
    if tpu and gpu:
        problems.append(Problem(str(path), "enable_tpu", "enable_tpu and enable_gpu are both true: choose one"))
    shape = meta.get("machine_shape")
    if shape is None:
        if tpu:
            problems.append(Problem(str(path), "machine_shape",
                                    f"missing with enable_tpu: set it (e.g. {TPU_SHAPE!r})"))
        return
    if not isinstance(shape, str) or not shape:
        problems.append(Problem(str(path), "machine_shape", f"{shape!r} is not a machine shape name"))
    elif tpu and not shape.startswith("Tpu"):
        problems.append(Problem(str(path), "machine_shape", f"{shape!r} is not a TPU shape (e.g. {TPU_SHAPE!r}) "
                                                            "but enable_tpu is true"))
    elif gpu and not shape.startswith("Nvidia"):
        problems.append(Problem(str(path), "machine_shape", f"{shape!r} is not a GPU shape (e.g. 'NvidiaTeslaT4') "
                                                            "but enable_gpu is true"))
    elif not tpu and not gpu:
        needs = "enable_tpu" if shape.startswith("Tpu") else "enable_gpu"
        problems.append(Problem(str(path), "machine_shape", f"{shape!r} without {needs}: true"))


def _read_metadata(path: Path, known: frozenset) -> tuple[list[Problem], dict | None]:
    """The problems found so far and the parsed JSON (None when it does not parse), unknown keys checked."""
    problems: list[Problem] = []
    meta = _read_json(path, problems)
    if meta is not None:
        _check_unknown(path, meta, known, problems)
    return problems, meta


def lint_kernel_metadata(path: str | Path, *, fix: bool = False) -> list[Problem]:
    """Problems of one ``kernel-metadata.json`` (and of the notebook its ``code_file`` names;
    ``fix`` strips that notebook's pinned-image keys)."""
    path = Path(path)
    problems, meta = _read_metadata(path, KERNEL_KEYS)
    if meta is None:
        return problems
    f = str(path)
    for key in ("id", "title", "code_file", "language", "kernel_type"):
        if key not in meta:
            problems.append(Problem(f, key, "missing"))
    slug = _check_id(path, "id", meta["id"], problems) if "id" in meta else None
    if "title" in meta:
        _check_title(path, meta, slug, problems)
    if "language" in meta and (not isinstance(meta["language"], str) or meta["language"] not in LANGUAGES):
        problems.append(Problem(f, "language", f"{meta['language']!r} is not one of {', '.join(LANGUAGES)}"))
    kernel_type = meta.get("kernel_type")
    if not isinstance(kernel_type, str):  # a list or object would not even be a key of CODE_SUFFIXES
        kernel_type = None if "kernel_type" not in meta else repr(kernel_type)
    if "kernel_type" in meta and kernel_type not in CODE_SUFFIXES:
        problems.append(Problem(f, "kernel_type", f"{kernel_type!r} is not 'notebook' or 'script'"))
    for key in KERNEL_BOOLEANS:
        if key in meta and not isinstance(meta[key], bool):
            problems.append(Problem(f, key, f"must be true or false, got {meta[key]!r}"))
    if "enable_internet" not in meta:
        problems.append(Problem(f, "enable_internet", "missing: the kaggle CLI then turns internet ON; set it "
                                                      "explicitly (false for a competition notebook)"))
    elif meta["enable_internet"] is not False and meta.get("competition_sources"):
        problems.append(Problem(f, "enable_internet", "must be false with competition_sources: Kaggle does not "
                                                      "accept submissions from notebooks with internet on"))
    _check_machine(path, meta, problems)
    _check_sources(path, meta, problems)
    _check_str_list(path, meta, "keywords", problems)
    code_file = meta.get("code_file")
    if isinstance(code_file, str) and code_file:
        code = path.parent / code_file
        if not code.is_file():
            problems.append(Problem(f, "code_file", f"{code_file!r} does not exist (looked for {code})"))
        elif kernel_type in CODE_SUFFIXES and code.suffix not in CODE_SUFFIXES[kernel_type]:
            problems.append(Problem(f, "code_file", f"{code_file!r} is not a {kernel_type} "
                                                    f"({'/'.join(CODE_SUFFIXES[kernel_type])})"))
        elif code.suffix == ".ipynb":
            problems += lint_notebook(code, fix=fix)
    elif "code_file" in meta:
        problems.append(Problem(f, "code_file", f"{code_file!r} is not a file name"))
    return problems


def lint_dataset_metadata(path: str | Path) -> list[Problem]:
    """Problems of one ``dataset-metadata.json`` (lengths, id, exactly one license, resources present)."""
    path = Path(path)
    problems, meta = _read_metadata(path, DATASET_KEYS)
    if meta is None:
        return problems
    f = str(path)
    for key, (low, high), required in (("title", (6, 50), True), ("subtitle", (20, 80), False)):
        value = meta.get(key)
        if value is None:
            if required:
                problems.append(Problem(f, key, "missing"))
        elif not isinstance(value, str) or not low <= len(value) <= high:
            shown = len(value) if isinstance(value, str) else type(value).__name__
            problems.append(Problem(f, key, f"{value!r} ({shown} characters): Kaggle wants {low}-{high}"))
    if "id" not in meta:
        problems.append(Problem(f, "id", "missing"))
    else:
        _check_id(path, "id", meta["id"], problems, slug_len=(3, 50))
    licenses = meta.get("licenses")
    if not (isinstance(licenses, list) and len(licenses) == 1 and isinstance(licenses[0], dict)
            and isinstance(licenses[0].get("name"), str) and licenses[0]["name"]):
        problems.append(Problem(f, "licenses", f"{licenses!r}: Kaggle wants exactly one, e.g. "
                                               '[{"name": "apache-2.0"}]'))
    resources = meta.get("resources", [])
    if not isinstance(resources, list):
        problems.append(Problem(f, "resources", f"must be a list of {{path, description}}, got {resources!r}"))
        resources = []
    for i, res in enumerate(resources):
        where = f"resources[{i}]"
        if not isinstance(res, dict) or not isinstance(res.get("path"), str):
            problems.append(Problem(f, where, f"{res!r} has no \"path\""))
        elif not (path.parent / res["path"]).exists():
            problems.append(Problem(f, where, f"path {res['path']!r} does not exist beside the metadata"))
    _check_str_list(path, meta, "keywords", problems)
    return problems


def lint_notebook(path: str | Path, *, fix: bool = False) -> list[Problem]:
    """A notebook must be readable, free of pinned-image keys and, when it uses the kit, start with the
    bootstrap cell verbatim; ``fix`` strips the keys and rewrites a stale bootstrap (atomic rewrite)."""
    path = Path(path)
    problems: list[Problem] = []
    notebook = _read_json(path, problems)
    if notebook is None:
        return problems
    if not isinstance(notebook.get("cells"), list):
        return [Problem(str(path), "cells", "missing: not a Jupyter notebook")]
    shape = _notebook_shape(notebook)
    if shape:
        return [Problem(str(path), key, why) for key, why in shape]
    removed = strip_pinned_image(notebook)
    stale = bootstrap.notebook_issue(notebook, fix=fix)
    fixed_stale = fix and stale is not None and bootstrap.notebook_issue(notebook) is None
    if fix and (removed or fixed_stale):
        write_json(path, notebook, indent=1)
    problems = [Problem(str(path), key, "Kaggle's pinned image: with it the kernel keeps that image (the CPU one, "
                                        "even with enable_tpu); remove it (lint --fix, or package strips copies)",
                        fixed=fix) for key in removed]
    if stale is not None:
        problems.append(Problem(str(path), "cells[bootstrap]", stale, fixed=fixed_stale))
    return problems


def _notebook_shape(notebook: dict) -> list[tuple[str, str]]:
    """The JSON types nbformat requires where the rules read: a value of another type is named, not a traceback."""
    found = []
    if not isinstance(notebook.get("metadata", {}), dict):
        found.append(("metadata", f"must be a JSON object, got {type(notebook['metadata']).__name__}"))
    for i, cell in enumerate(notebook["cells"]):
        source = cell.get("source", "") if isinstance(cell, dict) else None
        if not isinstance(cell, dict):
            found.append((f"cells[{i}]", f"must be a JSON object, got {type(cell).__name__}"))
        elif not (isinstance(source, str) or isinstance(source, list) and all(isinstance(x, str) for x in source)):
            found.append((f"cells[{i}].source", "must be a string or a list of strings"))
    return found


def lint_markdown(path: str | Path) -> list[Problem]:
    """A Markdown file (the README) that shows the bootstrap cell must show it verbatim."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, ValueError) as e:
        return [Problem(str(path), "(file)", f"not readable: {e}")]
    return [Problem(str(path), f"line {line}", why) for line, why in bootstrap.markdown_issues(text)]


def _lint_kind(path: Path) -> str | None:
    """What ``path`` is linted as, by its name; None for files lint does not check."""
    if path.name == KERNEL_METADATA:
        return "kernel"
    if path.name == DATASET_METADATA:
        return "dataset"
    return {".ipynb": "notebook", ".md": "markdown"}.get(path.suffix)


def _lint_targets(paths: Iterable[str | Path]) -> list[tuple[str, Path]]:
    targets = []
    for p in map(Path, paths):
        if p.is_dir():
            found = [(_lint_kind(f), f) for f in sorted(p.rglob("*"))
                     if ".ipynb_checkpoints" not in f.parts and f.is_file()]
            found = [(kind, f) for kind, f in found if kind is not None]
            if not found:
                raise PackagingError(f"{p}: nothing to check (no {KERNEL_METADATA}, {DATASET_METADATA} or .ipynb "
                                     "in it): give the folder or files to lint")
            targets += found
        else:  # a file given by name; any other name is linted as kernel metadata (it is the strict one)
            targets.append((_lint_kind(p) or "kernel", p))
    return targets


def default_lint_paths(repo: Path = REPO) -> list[Path]:
    """The committed metadata: the top-level kernel-metadata.json, the notebooks and the README."""
    return [repo / KERNEL_METADATA, *sorted((repo / "notebooks").glob("*.ipynb")), repo / "README.md"]


def lint(paths: Sequence[str | Path] | None = None, *, fix: bool = False) -> list[Problem]:
    """Problems of every metadata file and notebook in ``paths`` (files or folders, searched
    recursively); default :func:`default_lint_paths`. ``fix`` strips pinned-image keys from the
    notebooks (listed, or named by a ``code_file``) and reports those problems as fixed. A
    notebook reached twice is reported once."""
    problems: list[Problem] = []
    for kind, p in _lint_targets(default_lint_paths() if paths is None else paths):
        if kind == "kernel":
            problems += lint_kernel_metadata(p, fix=fix)
        elif kind == "dataset":
            problems += lint_dataset_metadata(p)
        elif kind == "markdown":
            problems += lint_markdown(p)
        else:
            problems += lint_notebook(p, fix=fix)
    seen, unique = set(), []
    for problem in problems:
        key = (Path(problem.file).resolve(), problem.key, problem.message)
        if key not in seen:
            seen.add(key)
            unique.append(problem)
    return unique


# --------------------------------------------------------------------------- package
