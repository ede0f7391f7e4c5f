"""``package``: the upload folders (one per notebook, the kit, the weights), each input checked before
the first write, each folder moved into place when complete."""
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..checkpoint import CheckpointError, check_digest, manifest_path
from .lint import Problem, lint
from .metadata import (DATASET_METADATA, DEFAULT_USER, KERNEL_METADATA, KIT_FILES, KIT_PACKAGES, KIT_SLUG,
                       OWNER_PATTERN, REPO, WEIGHTS_SLUG, PackagingError, dataset_metadata_for_kit,
                       dataset_metadata_for_weights, kernel_metadata, notebook_title, slugify, strip_pinned_image,
                       write_json)

_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".ipynb_checkpoints", ".*")


@dataclass
class PackageResult:
    """What ``package`` built, what it changed on the way and what lint says about the result."""

    folders: dict[str, Path]  # folder name -> path
    stripped: dict[str, list[str]]  # notebook -> pinned keys removed from its copy
    notes: list[str]
    problems: list[Problem]


def _check_weights(files: Sequence[str | Path]) -> dict[Path, dict]:
    """Each weights file with its manifest, checked before anything is written."""
    checked: dict[Path, dict] = {}
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
        try:
            check_digest(f)
        except CheckpointError as e:
            raise PackagingError(f"--weights {e}") from None
        same_name = next((g for g in checked if g.name == f.name), None)
        if same_name is not None:
            raise PackagingError(f"--weights {f} and {same_name} have the same file name")
        checked[f] = manifest
    return checked


def _plan(out: Path, notebooks: list[Path], weights: dict, overwrite: bool) -> dict[str, tuple]:
    """``folder name -> (kind, source notebook, its JSON)``, refused before any write when names clash."""
    plan: dict[str, tuple] = {}
    for nb in notebooks:
        slug = slugify(notebook_title(nb))
        if slug in plan:
            raise PackagingError(f"{nb.name} and {plan[slug][1].name} both get the kernel slug {slug!r}: rename one "
                                 "(titles come from kaggle_utils.publish.metadata.NOTEBOOK_TITLES or the file name)")
        try:
            notebook = json.loads(nb.read_text(encoding="utf-8"))
        except ValueError as e:
            raise PackagingError(f"{nb}: not a readable notebook: {e}") from None
        if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
            raise PackagingError(f"{nb}: not a Jupyter notebook (no cells)")
        plan[slug] = ("notebook", nb, notebook)
    for slug, kind in ((KIT_SLUG, "kit"), (WEIGHTS_SLUG, "weights")):
        if slug in plan:
            raise PackagingError(f"notebook {plan[slug][1].name} gets the slug {slug!r} of the {kind} dataset")
        if kind == "kit" or weights:
            plan[slug] = (kind, None, None)
    if out.exists() and not out.is_dir():
        raise PackagingError(f"{out} is a file: give package a folder (new or existing) to write into")
    existing = [name for name in plan if (out / name).exists()]
    files_in_the_way = [str(out / name) for name in existing if not (out / name).is_dir()]
    if files_in_the_way:
        raise PackagingError(f"{', '.join(files_in_the_way)}: a file where package writes a folder; move it away")
    if existing and not overwrite:
        raise PackagingError(f"{out} already has {', '.join(existing)}: pass --overwrite to replace them")
    return plan


def package(out: str | Path, *, user: str = DEFAULT_USER, notebooks_dir: str | Path | None = None,
            weights: Sequence[str | Path] = (), overwrite: bool = False, repo: str | Path = REPO) -> PackageResult:
    """Builds the upload folders under ``out``, then lints them. Every input is checked before the first write;
    each folder is built beside its target and moved into place when complete (replacing one: ``overwrite``)."""
    repo, out = Path(repo), Path(out)
    if not OWNER_PATTERN.fullmatch(user):
        raise PackagingError(f"--user {user!r} is not a Kaggle user name (letters, digits, '-' and '_')")
    notebooks_dir = Path(notebooks_dir) if notebooks_dir is not None else repo / "notebooks"
    notebooks = sorted(notebooks_dir.glob("*.ipynb")) if notebooks_dir.is_dir() else []
    notes = [] if notebooks else [f"no notebooks in {notebooks_dir}: only the kit and weights folders"]
    for name in [*(f"{package}/__init__.py" for package in KIT_PACKAGES), *KIT_FILES]:
        if not (repo / name).is_file():
            raise PackagingError(f"{repo / name} is missing; the kit dataset ships it")
    checked = _check_weights(weights)
    if not checked:
        notes.append(f"no --weights: no {WEIGHTS_SLUG} folder (the notebooks still list {user}/{WEIGHTS_SLUG})")
    for f, m in checked.items():
        if str(m.get("source", "")).startswith("random init"):
            notes.append(f"{f.name} is a random initialisation ({m['source']}), not pretrained weights")
    plan = _plan(out, notebooks, checked, overwrite)
    stripped = {src.name: keys for _, src, notebook in plan.values()  # the copies' pinned-image keys, in memory
                if notebook is not None and (keys := strip_pinned_image(notebook))}
    try:
        out.mkdir(parents=True, exist_ok=True)
        folders = {}
        for name, (kind, src, notebook) in plan.items():
            staged = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".partial", dir=out))
            try:
                _build(kind, staged, user, repo, checked, src, notebook)
                _replace_dir(staged, out / name)
            finally:
                if staged.exists():
                    shutil.rmtree(staged)
            folders[name] = out / name
    except OSError as e:  # read-only place, full disk: nothing partial is left
        raise PackagingError(f"cannot write into {out}: {e.strerror or e}") from None
    return PackageResult(folders, stripped, notes, lint(list(folders.values())))


def _build(kind: str, dest: Path, user: str, repo: Path, weights: dict[Path, dict], src: Path | None,
           notebook: dict | None) -> None:
    """Fills ``dest`` with one folder's files (a notebook's copy already stripped of its pinned-image keys)."""
    if kind == "notebook":
        write_json(dest / src.name, notebook, indent=1)
        write_json(dest / KERNEL_METADATA, kernel_metadata(src, user=user))
        return
    if kind == "kit":
        for name in KIT_PACKAGES:
            shutil.copytree(repo / name, dest / name, ignore=_COPY_IGNORE)
        for name in KIT_FILES:
            shutil.copy2(repo / name, dest / name)
        write_json(dest / DATASET_METADATA, dataset_metadata_for_kit(user))
        return
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
