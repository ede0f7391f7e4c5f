"""Kaggle packaging: upload-ready folders for the notebooks, the kit and the weights, and a lint.

::

    python -m kaggle_utils.kaggle package OUT [--user NAME] [--notebooks DIR] [--weights FILE.msgpack ...] [--overwrite]
    python -m kaggle_utils.kaggle lint [--fix] [PATHS ...]

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
files and notebooks (default: the top-level ``kernel-metadata.json`` and ``notebooks/*.ipynb``)
for the traps that make a push "succeed" and then do something else: a title whose slug is
not the id's (the kernel is created at the title's slug), a pinned ``docker_image`` with
``enable_tpu`` (runs on the CPU image), ``enable_internet`` left out (the CLI turns it on),
internet on in a competition notebook (Kaggle refuses its submission),
``c/`` / ``d/`` / URL source prefixes, a missing ``code_file``, an unknown (misspelt) key.
``--fix`` strips the pinned-image keys from notebooks; everything else is left to a person.
Owners default to the placeholder ``kaggle-utils``; ``--user`` sets your Kaggle name.
"""
from __future__ import annotations

import argparse
import hashlib
import html
import json
import re
import shutil
import sys
import tempfile
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

__all__ = [
    "PackageResult",
    "PackagingError",
    "Problem",
    "dataset_metadata_for_kit",
    "dataset_metadata_for_weights",
    "default_lint_paths",
    "kernel_metadata",
    "lint",
    "lint_dataset_metadata",
    "lint_kernel_metadata",
    "lint_notebook",
    "main",
    "notebook_title",
    "package",
    "slugify",
    "strip_pinned_image",
]

REPO = Path(__file__).resolve().parent.parent
DEFAULT_USER = "kaggle-utils"  # placeholder owner; --user replaces it everywhere
COMPETITION = "tpu-getting-started"
TPU_SHAPE = "TpuV5E8"
FLOWER_NOTEBOOK = "04_flower_classification_tpu.ipynb"
ONLINE_NOTEBOOKS = ("03_port_pytorch_weights.ipynb",)  # fetches timm's pretrained weights from the hub
KIT_SLUG, KIT_TITLE = "kaggle-utils", "Kaggle Utils"
WEIGHTS_SLUG, WEIGHTS_TITLE = "efficientnetv2-jax", "EfficientNetV2 JAX"
KIT_PACKAGES = ("kaggle_utils", "weights_port")
KIT_FILES = ("README.md", "requirements.txt", "pyproject.toml")
KERNEL_METADATA, DATASET_METADATA = "kernel-metadata.json", "dataset-metadata.json"
# titles fix the slugs, hence the kernels' URLs: a notebook's heading can change without moving it
NOTEBOOK_TITLES = {
    "01_flax_model_surgery": "Flax Model Surgery",
    "02_efficientnetv2_in_flax": "EfficientNetV2 in Flax",
    "03_port_pytorch_weights": "Port PyTorch Weights to Flax",
    "04_flower_classification_tpu": "Flower Classification on TPU with JAX",
}
PINNED_NOTEBOOK_KEYS = ("dockerImageVersionId", "accelerator")  # under metadata.kaggle
KERNEL_KEYS = frozenset({
    "id", "id_no", "title", "code_file", "language", "kernel_type", "is_private", "enable_gpu", "enable_tpu",
    "enable_internet", "dataset_sources", "competition_sources", "kernel_sources", "model_sources", "keywords",
    "machine_shape", "docker_image", "docker_image_pinning_type"})
DATASET_KEYS = frozenset({"title", "subtitle", "description", "id", "id_no", "licenses", "resources", "keywords",
                          "collaborators", "isPrivate"})
KERNEL_BOOLEANS = ("is_private", "enable_gpu", "enable_tpu", "enable_internet")
CODE_SUFFIXES = {"notebook": (".ipynb",), "script": (".py", ".r", ".R", ".Rmd", ".rmd")}
LANGUAGES = ("python", "r", "rmarkdown")
_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_OWNER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".ipynb_checkpoints", ".*")


class PackagingError(ValueError):
    """An input to ``package`` or ``lint`` is unusable; the message names the file and the reason."""


@dataclass(frozen=True)
class Problem:
    """One rule broken by one key of one file; ``fixed`` when ``lint(fix=True)`` repaired it."""

    file: str
    key: str
    message: str
    fixed: bool = False

    def __str__(self) -> str:
        return f"{self.file}: {self.key}: {self.message}" + (" (fixed)" if self.fixed else "")


# --------------------------------------------------------------------------- slugs and titles


def _fold_ascii(text: str) -> str:
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")


def slugify(text: str) -> str:
    """The slug Kaggle derives from a title (its CLI uses python-slugify's defaults).

    Quotes become separators, accents fold to ASCII, HTML entities are decoded, ``1,000`` loses
    its comma, the rest of ``[^a-z0-9-]`` becomes ``-``, dashes collapse and are stripped.
    python-slugify also transliterates non-Latin scripts (unidecode); this drops them instead,
    which is why :func:`lint` asks for titles without such letters.
    """
    text = re.sub(r"'+", "-", text)
    text = html.unescape(_fold_ascii(text))
    text = _fold_ascii(text).lower()
    text = re.sub(r"'+", "", text)
    text = re.sub(r"(?<=\d),(?=\d)", "", text)
    text = re.sub(r"[^-a-z0-9]+", "-", text)
    return re.sub(r"-{2,}", "-", text).strip("-")


def notebook_title(path: str | Path) -> str:
    """The Kaggle title of a notebook: from :data:`NOTEBOOK_TITLES`, else its file name
    (``05_my_idea.ipynb`` -> ``My idea``)."""
    stem = Path(path).stem
    if stem in NOTEBOOK_TITLES:
        return NOTEBOOK_TITLES[stem]
    words = re.sub(r"^\d+[_-]*", "", stem).replace("_", " ").replace("-", " ").strip() or stem
    return words[:1].upper() + words[1:]


# --------------------------------------------------------------------------- metadata


def kernel_metadata(notebook: str | Path, *, user: str = DEFAULT_USER, code_file: str | None = None) -> dict:
    """``kernel-metadata.json`` of one notebook: TPU + competition for the flower notebook, CPU
    for the rest; offline but for :data:`ONLINE_NOTEBOOKS`, no ``docker_image``, the kit and
    weights datasets attached."""
    notebook = Path(notebook)
    title = notebook_title(notebook)
    flower = notebook.name == FLOWER_NOTEBOOK
    meta = {
        "id": f"{user}/{slugify(title)}",
        "title": title,
        "code_file": code_file or notebook.name,
        "language": "python",
        "kernel_type": "notebook",
        "is_private": True,
        "enable_gpu": False,
        "enable_tpu": flower,
        "enable_internet": notebook.name in ONLINE_NOTEBOOKS,
        "dataset_sources": [f"{user}/{KIT_SLUG}", f"{user}/{WEIGHTS_SLUG}"],
        "competition_sources": [COMPETITION] if flower else [],
        "kernel_sources": [],
        "model_sources": [],
    }
    if flower:
        meta["machine_shape"] = TPU_SHAPE
    return meta


def dataset_metadata_for_kit(user: str = DEFAULT_USER) -> dict:
    from .runtime import BOOTSTRAP

    description = (
        "The kaggle-utils kit: EfficientNet / EfficientNetV2 in JAX/Flax matching timm, the timm -> Flax "
        "weight porter, TFRecord input pipelines and multi-device training for Kaggle TPUs and GPUs.\n\n"
        "Attach this dataset to a notebook and start it with:\n\n```python\n" + BOOTSTRAP + "```\n")
    return {
        "title": KIT_TITLE,
        "subtitle": "EfficientNet(V2) in JAX/Flax, TFRecord input, TPU/GPU training",
        "description": description,
        "id": f"{user}/{KIT_SLUG}",
        "licenses": [{"name": "apache-2.0"}],
        "resources": [{"path": name, "description": desc} for name, desc in (
            ("README.md", "how to use the kit"), ("requirements.txt", "the tested versions"),
            ("pyproject.toml", "pip install --no-deps --no-build-isolation ."))],
        "keywords": [],
    }


_KAGGLE_LICENSES = {"unknown": "unknown", "apache-2.0": "apache-2.0", "cc0-1.0": "CC0-1.0", "cc-by-sa-4.0": "CC-BY-SA-4.0",
                    "cc-by-nc-sa-4.0": "CC-BY-NC-SA-4.0", "gpl-2.0": "GPL-2.0"}


def dataset_metadata_for_weights(manifests: dict[str, dict], user: str = DEFAULT_USER) -> dict:
    """Metadata of the weights dataset: ``manifests`` maps each file name to its manifest.

    The license is the weights' own (timm records it) when all files agree on one Kaggle knows;
    otherwise ``other`` and the description lists each file's license.
    """
    licenses = {str(m.get("pretrained_cfg", {}).get("license") or "unknown").lower() for m in manifests.values()}
    known = {_KAGGLE_LICENSES.get(lic) for lic in licenses}
    license_name = known.pop() if len(known) == 1 and None not in known else "other"
    lines = ["EfficientNet weights converted from timm to Flax by kaggle-utils' weights_port, each checked "
             "against timm's logits before it was written. Load with "
             "kaggle_utils.efficientnet.load_weights or efficientnet_v2_pretrained.\n"]
    for name, m in sorted(manifests.items()):
        lines.append(f"* {name}: {m.get('model')} ({m.get('source', 'unknown source')}), "
                     f"{m.get('num_classes', '?')} classes, max |logit diff| {m.get('max_abs_logit_diff', '?')}, "
                     f"license {m.get('pretrained_cfg', {}).get('license', 'unknown')}, sha256 {m.get('sha256')}")
    resources = []
    for name, m in sorted(manifests.items()):
        resources.append({"path": name, "description": f"{m.get('model')} variables (flax msgpack)"})
        resources.append({"path": Path(name).with_suffix(".json").name, "description": f"manifest of {name}"})
    return {
        "title": WEIGHTS_TITLE,
        "subtitle": "timm EfficientNet(V2) weights ported to Flax msgpack, verified",
        "description": "\n".join(lines) + "\n",
        "id": f"{user}/{WEIGHTS_SLUG}",
        "licenses": [{"name": license_name}],
        "resources": resources,
        "keywords": [],
    }


def strip_pinned_image(notebook: dict) -> list[str]:
    """Removes ``metadata.kaggle.{dockerImageVersionId,accelerator}`` in place; returns what it removed.

    A notebook downloaded from Kaggle carries the image it last ran on; pushed with it, the
    kernel is pinned to that (CPU) image even with ``enable_tpu``.
    """
    kaggle_meta = notebook.get("metadata", {}).get("kaggle")
    if not isinstance(kaggle_meta, dict):
        return []
    removed = [k for k in PINNED_NOTEBOOK_KEYS if k in kaggle_meta]
    for k in removed:
        del kaggle_meta[k]
    return [f"metadata.kaggle.{k}" for k in removed]


# --------------------------------------------------------------------------- lint


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
    if not _OWNER.fullmatch(owner):
        problems.append(Problem(str(path), key, f"owner {owner!r} of {value!r} is not a Kaggle user name"))
    if not _SLUG.fullmatch(slug):
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
    if any(ch.isalnum() and not _fold_ascii(ch) for ch in title):
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


def lint_kernel_metadata(path: str | Path, *, fix: bool = False) -> list[Problem]:
    """Problems of one ``kernel-metadata.json`` (and of the notebook its ``code_file`` names;
    ``fix`` strips that notebook's pinned-image keys)."""
    path = Path(path)
    problems: list[Problem] = []
    meta = _read_json(path, problems)
    if meta is None:
        return problems
    f = str(path)
    _check_unknown(path, meta, KERNEL_KEYS, problems)
    for key in ("id", "title", "code_file", "language", "kernel_type"):
        if key not in meta:
            problems.append(Problem(f, key, "missing"))
    slug = _check_id(path, "id", meta["id"], problems) if "id" in meta else None
    if "title" in meta:
        _check_title(path, meta, slug, problems)
    if "language" in meta and meta["language"] not in LANGUAGES:
        problems.append(Problem(f, "language", f"{meta['language']!r} is not one of {', '.join(LANGUAGES)}"))
    kernel_type = meta.get("kernel_type")
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
    problems: list[Problem] = []
    meta = _read_json(path, problems)
    if meta is None:
        return problems
    f = str(path)
    _check_unknown(path, meta, DATASET_KEYS, problems)
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
    """A notebook must be readable and free of pinned-image keys; ``fix`` strips them (atomic rewrite)."""
    path = Path(path)
    problems: list[Problem] = []
    notebook = _read_json(path, problems)
    if notebook is None:
        return problems
    if not isinstance(notebook.get("cells"), list):
        return [Problem(str(path), "cells", "missing: not a Jupyter notebook")]
    removed = strip_pinned_image(notebook)
    if removed and fix:
        _write_json(path, notebook, indent=1)
    return [Problem(str(path), key, "Kaggle's pinned image: with it the kernel keeps that image (the CPU one, even "
                                    "with enable_tpu); remove it (lint --fix, or package strips copies)", fixed=fix)
            for key in removed]


def _lint_targets(paths: Iterable[str | Path]) -> list[tuple[str, Path]]:
    targets = []
    for p in map(Path, paths):
        if p.is_dir():
            before = len(targets)
            for found in sorted(p.rglob("*")):
                if ".ipynb_checkpoints" in found.parts or not found.is_file():
                    continue
                if found.name == KERNEL_METADATA:
                    targets.append(("kernel", found))
                elif found.name == DATASET_METADATA:
                    targets.append(("dataset", found))
                elif found.suffix == ".ipynb":
                    targets.append(("notebook", found))
            if len(targets) == before:
                raise PackagingError(f"{p}: nothing to check (no {KERNEL_METADATA}, {DATASET_METADATA} or .ipynb "
                                     "in it): give the folder or files to lint")
        elif p.name == DATASET_METADATA:
            targets.append(("dataset", p))
        elif p.suffix == ".ipynb":
            targets.append(("notebook", p))
        else:  # kernel-metadata.json, or any other name: linted as kernel metadata (it is the strict one)
            targets.append(("kernel", p))
    return targets


def default_lint_paths(repo: Path = REPO) -> list[Path]:
    """The committed metadata: the top-level kernel-metadata.json and the notebooks."""
    return [repo / KERNEL_METADATA, *sorted((repo / "notebooks").glob("*.ipynb"))]


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


def _write_json(path: Path, data: dict, *, indent: int = 2) -> None:
    from .checkpoint import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=indent, ensure_ascii=False) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_weights(files: Sequence[str | Path]) -> dict[Path, dict]:
    """Each weights file with its manifest, checked before anything is written."""
    checked: dict[Path, dict] = {}
    names: dict[str, Path] = {}
    for f in map(Path, files):
        manifest_file = f.with_suffix(".json")
        if f.suffix != ".msgpack" or not f.is_file():
            raise PackagingError(f"--weights {f}: not an existing .msgpack file")
        if not manifest_file.is_file():
            raise PackagingError(f"--weights {f}: no manifest {manifest_file.name} beside it (weights_port writes "
                                 "one); without it nobody can tell which model the file holds")
        try:
            manifest = json.loads(manifest_file.read_text())
        except ValueError as e:
            raise PackagingError(f"{manifest_file}: not readable JSON: {e}") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("model"), str):
            raise PackagingError(f"{manifest_file}: names no model; is {f.name} ported weights (weights_port) "
                                 "rather than a training checkpoint?")
        if manifest.get("sha256") and manifest["sha256"] != _sha256(f):
            raise PackagingError(f"{f}: sha256 differs from its manifest {manifest_file.name}: the file was "
                                 "changed or truncated after it was written")
        if f.name in names:
            raise PackagingError(f"--weights {f} and {names[f.name]} have the same file name")
        names[f.name] = f
        checked[f] = manifest
    return checked


def _read_notebook(src: Path) -> dict:
    try:
        notebook = json.loads(src.read_text(encoding="utf-8"))
    except ValueError as e:
        raise PackagingError(f"{src}: not a readable notebook: {e}") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise PackagingError(f"{src}: not a Jupyter notebook (no cells)")
    return notebook


def _build_notebook(src: Path, notebook: dict, dest: Path, user: str) -> list[str]:
    """The copy without pinned-image keys (returned) and its kernel-metadata.json."""
    removed = strip_pinned_image(notebook)
    _write_json(dest / src.name, notebook, indent=1)
    _write_json(dest / KERNEL_METADATA, kernel_metadata(src, user=user))
    return removed


def _check_kit(repo: Path) -> None:
    for name in KIT_PACKAGES:
        if not (repo / name / "__init__.py").is_file():
            raise PackagingError(f"the kit package {repo / name} is missing")
    for name in KIT_FILES:
        if not (repo / name).is_file():
            raise PackagingError(f"{repo / name} is missing; the kit dataset ships it")


def _build_kit(dest: Path, user: str, repo: Path) -> None:
    for name in KIT_PACKAGES:
        shutil.copytree(repo / name, dest / name, ignore=_COPY_IGNORE)
    for name in KIT_FILES:
        shutil.copy2(repo / name, dest / name)
    _write_json(dest / DATASET_METADATA, dataset_metadata_for_kit(user))


def _build_weights(dest: Path, weights: dict[Path, dict], user: str) -> None:
    for f in weights:
        shutil.copy2(f, dest / f.name)
        shutil.copy2(f.with_suffix(".json"), dest / f.with_suffix(".json").name)
    _write_json(dest / DATASET_METADATA, dataset_metadata_for_weights({f.name: m for f, m in weights.items()}, user))


def _replace_dir(staged: Path, target: Path) -> None:
    """Moves a finished folder into place; an old one is removed only after the new one is complete."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old")
        if old.exists():
            shutil.rmtree(old)
        target.rename(old)
    staged.rename(target)
    if old is not None:
        shutil.rmtree(old)


@dataclass
class PackageResult:
    """What ``package`` built, what it changed on the way and what lint says about the result."""

    folders: dict[str, Path]  # folder name -> path
    stripped: dict[str, list[str]]  # notebook -> pinned keys removed from its copy
    notes: list[str]
    problems: list[Problem]


def package(out: str | Path, *, user: str = DEFAULT_USER, notebooks_dir: str | Path | None = None,
            weights: Sequence[str | Path] = (), overwrite: bool = False, repo: str | Path = REPO) -> PackageResult:
    """Builds the upload folders under ``out`` (see the module docstring), then lints them.

    Every input is checked before the first write; each folder is built beside its target and
    moved into place when complete. Existing target folders are replaced only with ``overwrite``.
    """
    repo = Path(repo)
    out = Path(out)
    if not _OWNER.fullmatch(user):
        raise PackagingError(f"--user {user!r} is not a Kaggle user name (letters, digits, '-' and '_')")
    notebooks_dir = Path(notebooks_dir) if notebooks_dir is not None else repo / "notebooks"
    notebooks = sorted(notebooks_dir.glob("*.ipynb")) if notebooks_dir.is_dir() else []
    notes = [] if notebooks else [f"no notebooks in {notebooks_dir}: only the kit and weights folders"]
    _check_kit(repo)
    checked = _check_weights(weights)
    if not checked:
        notes.append(f"no --weights: no {WEIGHTS_SLUG} folder (the notebooks still list {user}/{WEIGHTS_SLUG})")
    for f, m in checked.items():
        if str(m.get("source", "")).startswith("random init"):
            notes.append(f"{f.name} is a random initialisation ({m['source']}), not pretrained weights")

    plan: dict[str, tuple] = {}
    for nb in notebooks:
        slug = slugify(notebook_title(nb))
        if slug in plan:
            raise PackagingError(f"{nb.name} and {plan[slug][1].name} both get the kernel slug {slug!r}: "
                                 f"rename one (titles come from {__name__}.NOTEBOOK_TITLES or the file name)")
        plan[slug] = ("notebook", nb, _read_notebook(nb))
    for slug, kind in ((KIT_SLUG, "kit"), (WEIGHTS_SLUG, "weights")):
        if slug in plan:
            raise PackagingError(f"notebook {plan[slug][1].name} gets the slug {slug!r} of the {kind} dataset")
        if kind == "kit" or checked:
            plan[slug] = (kind, None, None)
    if out.exists() and not out.is_dir():
        raise PackagingError(f"{out} is a file: give package a folder (new or existing) to write into")
    existing = [name for name in plan if (out / name).exists()]
    files_in_the_way = [str(out / name) for name in existing if not (out / name).is_dir()]
    if files_in_the_way:
        raise PackagingError(f"{', '.join(files_in_the_way)}: a file where package writes a folder; move it away")
    if existing and not overwrite:
        raise PackagingError(f"{out} already has {', '.join(existing)}: pass --overwrite to replace them")
    try:
        return _build(out, plan, checked, user, repo, notes)
    except OSError as e:  # read-only place, full disk: nothing partial is left (see _build)
        raise PackagingError(f"cannot write into {out}: {e.strerror or e}") from None


def _build(out: Path, plan: dict[str, tuple], checked: dict[Path, dict], user: str, repo: Path,
           notes: list[str]) -> PackageResult:
    out.mkdir(parents=True, exist_ok=True)
    folders, stripped = {}, {}
    for name, (kind, src, notebook) in plan.items():
        staged = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=out))
        try:
            if kind == "notebook":
                removed = _build_notebook(src, notebook, staged, user)
                if removed:
                    stripped[src.name] = removed
            elif kind == "kit":
                _build_kit(staged, user, repo)
            else:
                _build_weights(staged, checked, user)
            _replace_dir(staged, out / name)
        finally:
            if staged.exists():
                shutil.rmtree(staged)
        folders[name] = out / name
    return PackageResult(folders, stripped, notes, lint(list(folders.values())))


# --------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils.kaggle",
                                     description="Build upload-ready Kaggle folders, or lint Kaggle metadata.")
    commands = parser.add_subparsers(dest="command", required=True)
    pkg = commands.add_parser("package", help="one folder per notebook, one for the kit, one for the weights")
    pkg.add_argument("out", help="output folder")
    pkg.add_argument("--user", default=DEFAULT_USER, help=f"Kaggle owner in every id (default {DEFAULT_USER})")
    pkg.add_argument("--notebooks", help="folder of .ipynb files (default: the repository's notebooks/)")
    pkg.add_argument("--weights", nargs="+", default=[], metavar="FILE.msgpack",
                     help="ported weights, each with its JSON manifest beside it")
    pkg.add_argument("--overwrite", action="store_true", help="replace folders already in OUT")
    chk = commands.add_parser("lint", help="check kernel-/dataset-metadata.json files and notebooks")
    chk.add_argument("paths", nargs="*", help="files or folders (default: the top-level kernel-metadata.json "
                                              "and notebooks/*.ipynb)")
    chk.add_argument("--fix", action="store_true", help="strip Kaggle's pinned-image keys from notebooks in place")
    return parser


def _report(problems: list[Problem]) -> int:
    for p in problems:
        print(p, file=sys.stderr if not p.fixed else sys.stdout)
    remaining = [p for p in problems if not p.fixed]
    if remaining:
        print(f"{len(remaining)} problem(s)", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "lint":
        try:
            problems = lint(args.paths or None, fix=args.fix)
        except PackagingError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        status = _report(problems)
        if status == 0:
            print("lint: ok")
        return status
    try:
        result = package(args.out, user=args.user, notebooks_dir=args.notebooks, weights=args.weights,
                         overwrite=args.overwrite)
    except PackagingError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in result.notes:
        print(f"note: {note}")
    for name, keys in result.stripped.items():
        print(f"stripped from the copy of {name}: {', '.join(keys)}")
    for name, folder in result.folders.items():
        if name == KIT_SLUG:
            print(f"kaggle datasets create -p {folder} --dir-mode zip")
        elif name == WEIGHTS_SLUG:
            print(f"kaggle datasets create -p {folder}")
        else:
            print(f"kaggle kernels push -p {folder}")
    return _report(result.problems)


if __name__ == "__main__":
    raise SystemExit(main())
