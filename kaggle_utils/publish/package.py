"""``package``: the upload folders (one per notebook, the kit, the weights), each input checked before
the first write, each folder moved into place when complete."""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .lint import Problem, lint
from .metadata import (PackagingError, DATASET_METADATA, DEFAULT_USER, KERNEL_METADATA, KIT_FILES, KIT_PACKAGES, KIT_SLUG,
                       OWNER_PATTERN, REPO, WEIGHTS_SLUG, dataset_metadata_for_kit, dataset_metadata_for_weights,
                       kernel_metadata, notebook_title, slugify, strip_pinned_image, write_json)

_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".ipynb_checkpoints", ".*")



def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_weights(files: Sequence[str | Path]) -> dict[Path, dict]:
    """Each weights file with its manifest, checked before anything is written."""
    from ..checkpoint import manifest_path

    checked: dict[Path, dict] = {}
    names: dict[str, Path] = {}
    for f in map(Path, files):
        manifest_file = manifest_path(f)
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
    write_json(dest / src.name, notebook, indent=1)
    write_json(dest / KERNEL_METADATA, kernel_metadata(src, user=user))
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
    write_json(dest / DATASET_METADATA, dataset_metadata_for_kit(user))


def _build_weights(dest: Path, weights: dict[Path, dict], user: str) -> None:
    from ..checkpoint import manifest_path

    for f in weights:
        shutil.copy2(f, dest / f.name)
        shutil.copy2(manifest_path(f), dest / manifest_path(f).name)
    write_json(dest / DATASET_METADATA, dataset_metadata_for_weights({f.name: m for f, m in weights.items()}, user))


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
    if not OWNER_PATTERN.fullmatch(user):
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
                                 f"rename one (titles come from kaggle_utils.publish.metadata.NOTEBOOK_TITLES or the file name)")
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

