"""``package``: the upload folders (one per notebook, the kit, the weights as a dataset or a Kaggle Model), each
input checked before the first write, each folder moved into place when complete; and the kaggle commands that
upload them, in the order the notebooks need their inputs."""
import json
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..checkpoint import CheckpointError, check_digest, manifest_path
from .lint import Problem, lint
from .metadata import (DATASET_METADATA, FLOWER_NOTEBOOK, INSTANCE_METADATA, KERNEL_METADATA, KIT_FILES, KIT_PACKAGES,
                       KIT_SLUG, MODEL_FOLDER, MODEL_METADATA, PORT_NOTEBOOK, REPO, WEIGHTS_AS, WEIGHTS_FRAMEWORK,
                       WEIGHTS_SLUG, PackagingError, dataset_metadata_for_kit, dataset_metadata_for_weights,
                       instance_metadata, kaggle_owner, kernel_metadata, model_metadata, notebook_title, slugify,
                       strip_pinned_image, variation_slug, write_json)

_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info", ".ipynb_checkpoints", ".*")


@dataclass
class PackageResult:
    """What ``package`` built, for whom, what it changed on the way, what lint says, and how to upload it."""

    folders: dict[str, Path]  # folder name -> path
    stripped: dict[str, list[str]]  # notebook -> pinned keys removed from its copy
    notes: list[str]
    problems: list[Problem]
    owner: str = ""
    owner_source: str = ""  # --user, KAGGLE_USERNAME or the client's kaggle.json
    public: bool = False
    commands: list[str] = field(default_factory=list)  # the first upload, in order
    updates: list[str] = field(default_factory=list)  # a new version of each, later

    def summary(self) -> list[str]:
        """The lines the command prints: owner, visibility, each folder, then the upload commands."""
        seen = ("public: anyone can fork the notebooks and attach the kit and the weights" if self.public else
                "private: only you (and those you share with) can see them; --public lets others fork and attach")
        return [f"owner      {self.owner} (from {self.owner_source})", f"visibility {seen}",
                *(f"folder     {path}" for path in self.folders.values()),
                "upload, the first time (in this order):", *(f"  {c}" for c in self.commands),
                "later, a new version of each" + (" (a kernel push is a new version, run on Kaggle):"
                                                  if any("kernels push" in c for c in self.updates) else ":"),
                *(f"  {c}" for c in self.updates)]


@dataclass(frozen=True)
class Release:
    """Who publishes, how visibly, and how the weights travel (None: the port notebook's output)."""

    owner: str
    public: bool
    weights_as: str | None
    variations: dict[str, dict[Path, dict]]


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


def _plan(out: Path, notebooks: list[Path], weights: dict, weights_as: str, overwrite: bool) -> dict[str, tuple]:
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
    weights_folder = WEIGHTS_SLUG if weights_as == "dataset" else MODEL_FOLDER
    for slug, kind in ((KIT_SLUG, "kit"), (weights_folder, weights_as)):
        if slug in plan:
            raise PackagingError(f"notebook {plan[slug][1].name} gets the slug {slug!r} of the {kind} folder")
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


def _variations(weights: dict[Path, dict]) -> dict[str, dict[Path, dict]]:
    """The weights Model's variations: one per ported model, holding its files."""
    grouped: dict[str, dict[Path, dict]] = {}
    for f, manifest in weights.items():
        grouped.setdefault(variation_slug(manifest["model"]), {})[f] = manifest
    return dict(sorted(grouped.items()))


def package(out: str | Path, *, public: bool, user: str | None = None, notebooks_dir: str | Path | None = None,
            weights: Sequence[str | Path] = (), weights_as: str = "dataset", kit: bool = True,
            overwrite: bool = False, repo: str | Path = REPO) -> PackageResult:
    """Builds the upload folders under ``out`` for ``user`` (else the kaggle client's own user: :func:`kaggle_owner`),
    ``public`` or private, then lints them. ``weights_as``: the ported ``weights`` as a dataset or a Kaggle Model
    (one variation per model); the notebooks' sources name them, or the port notebook's output when there are
    none; ``kit`` False: no kit folder (the weights alone, as notebook 3 writes them). Every input is checked
    before the first write; each folder is built beside its target and moved into place when complete (replacing
    one: ``overwrite``)."""
    repo, out = Path(repo), Path(out)
    if not isinstance(public, bool):
        raise PackagingError("choose --public (others can fork the notebooks and attach the kit and weights) or "
                             "--private")
    if weights_as not in WEIGHTS_AS:
        raise PackagingError(f"--weights-as {weights_as!r}: choose {' or '.join(WEIGHTS_AS)}")
    owner, owner_source = kaggle_owner(user)
    notebooks_dir = Path(notebooks_dir) if notebooks_dir is not None else repo / "notebooks"
    notebooks = sorted(notebooks_dir.glob("*.ipynb")) if notebooks_dir.is_dir() else []
    notes = [] if notebooks else [f"no notebooks in {notebooks_dir}: only the kit and weights folders"]
    for name in [*(f"{package}/__init__.py" for package in KIT_PACKAGES), *KIT_FILES]:
        if not (repo / name).is_file():
            raise PackagingError(f"{repo / name} is missing; the kit dataset ships it")
    checked = _check_weights(weights)
    if not checked:
        notes.append("no --weights: the notebooks attach the output of the port notebook "
                     f"({notebook_title(PORT_NOTEBOOK)}), which ports the weights on Kaggle")
    for f, m in checked.items():
        if str(m.get("source", "")).startswith("random init"):
            notes.append(f"{f.name} is a random initialisation ({m['source']}), not pretrained weights")
    variations = _variations(checked)
    release = Release(owner, public, weights_as if checked else None, variations)
    if checked and weights_as == "model":
        for name, files in variations.items():  # refused here, before any write, if no Model license fits
            instance_metadata(owner, name, files)
    plan = _plan(out, notebooks, checked, weights_as, overwrite)
    if not kit:
        del plan[KIT_SLUG]
    stripped = {src.name: keys for _, src, notebook in plan.values()  # the copies' pinned-image keys, in memory
                if notebook is not None and (keys := strip_pinned_image(notebook))}
    try:
        out.mkdir(parents=True, exist_ok=True)
        folders = {}
        for name, (kind, src, notebook) in plan.items():
            staged = out / f".{name}.{uuid.uuid4().hex[:8]}.partial"  # mkdir: the umask's mode, as any folder
            staged.mkdir()
            try:
                _build(kind, staged, release, repo, checked, src, notebook)
                _replace_dir(staged, out / name)
            finally:
                if staged.exists():
                    shutil.rmtree(staged)
            folders[name] = out / name
    except OSError as e:  # read-only place, full disk: nothing partial is left
        raise PackagingError(f"cannot write into {out}: {e.strerror or e}") from None
    commands, updates = upload_commands(folders, plan, release)
    return PackageResult(folders, stripped, notes, lint(list(folders.values())), owner, owner_source, public,
                         commands, updates)


def upload_commands(folders: dict[str, Path], plan: dict[str, tuple], release: Release) -> tuple[list[str], list[str]]:
    """The kaggle commands of the first upload (the kit and the weights before the notebooks that attach them, the
    port notebook before the flower notebook, which needs its output) and of a later version of each."""
    first, later = [], []
    note = '-m "what changed"'
    for name, folder in folders.items():
        kind = plan[name][0]
        if kind == "kit":  # its packages are folders: without --dir-mode zip no code is uploaded
            first.append(f"kaggle datasets create -p {folder} --dir-mode zip" + (" --public" if release.public else ""))
            later.append(f"kaggle datasets version -p {folder} --dir-mode zip {note}")
        elif kind == "dataset":
            first.append(f"kaggle datasets create -p {folder}" + (" --public" if release.public else ""))
            later.append(f"kaggle datasets version -p {folder} {note}")
        elif kind == "model":
            first.append(f"kaggle models create -p {folder}")
            for variation in release.variations:
                first.append(f"kaggle models instances create -p {folder / variation}")
                later.append(f"kaggle models instances versions create {release.owner}/{WEIGHTS_SLUG}/"
                             f"{WEIGHTS_FRAMEWORK}/{variation} -p {folder / variation} -n \"what changed\"")
    order = {PORT_NOTEBOOK: 0, FLOWER_NOTEBOOK: 2}
    notebooks = sorted((n for n in folders if plan[n][0] == "notebook"), key=lambda n: order.get(plan[n][1].name, 1))
    for name in notebooks:
        push = f"kaggle kernels push -p {folders[name]}"
        if plan[name][1].name == FLOWER_NOTEBOOK and release.weights_as is None and any(
                plan[n][1].name == PORT_NOTEBOOK for n in notebooks):
            port = slugify(notebook_title(PORT_NOTEBOOK))
            push += (f"   # once `kaggle kernels status {release.owner}/{port}` says complete: its output holds the "
                     "weights this notebook attaches")
        first.append(push)
        later.append(f"kaggle kernels push -p {folders[name]}")
    return first, later


def _copy_weights(files: dict[Path, dict], dest: Path) -> None:
    dest.mkdir(exist_ok=True)
    for f in files:
        shutil.copy2(f, dest / f.name)
        shutil.copy2(manifest_path(f), dest / manifest_path(f).name)


def _build(kind: str, dest: Path, release: Release, repo: Path, weights: dict[Path, dict], src: Path | None,
           notebook: dict | None) -> None:
    """Fills ``dest`` with one folder's files (a notebook's copy already stripped of its pinned-image keys)."""
    user = release.owner
    if kind == "notebook":
        write_json(dest / src.name, notebook, indent=1)
        write_json(dest / KERNEL_METADATA, kernel_metadata(src, user=user, public=release.public,
                                                           weights_as=release.weights_as,
                                                           variations=tuple(release.variations)))
    elif kind == "kit":
        for name in KIT_PACKAGES:
            shutil.copytree(repo / name, dest / name, ignore=_COPY_IGNORE)
        for name in KIT_FILES:
            shutil.copy2(repo / name, dest / name)
        write_json(dest / DATASET_METADATA, dataset_metadata_for_kit(user))
    elif kind == "dataset":
        _copy_weights(weights, dest)
        write_json(dest / DATASET_METADATA, dataset_metadata_for_weights({f.name: m for f, m in weights.items()},
                                                                         user))
    else:  # the Model: its metadata, and a folder per variation with the files and the instance metadata
        write_json(dest / MODEL_METADATA, model_metadata(user, release.public))
        for variation, files in release.variations.items():
            _copy_weights(files, dest / variation)
            write_json(dest / variation / INSTANCE_METADATA,
                       instance_metadata(user, variation, {f.name: m for f, m in files.items()}))


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
