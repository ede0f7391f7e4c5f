"""The notebooks' first cell: what machine is this, where are the inputs, what to train, where outputs go.

The same notebook runs unchanged on a Kaggle TPU or GPU, a CPU session and CI: :data:`BOOTSTRAP` puts the kit
on ``sys.path`` and :func:`setup` returns a :class:`Runtime` whose ``config`` this machine trains (smoke mode
on a CPU without the competition data); ``RT.configure(...)`` is a notebook's settings cell. Kaggle mounts inputs
in several layouts (:func:`find_weights` lists them) and reads a submission from ``/kaggle/working/submission.csv``
(:func:`kaggle_submission`). Probes take ``root`` (``$KAGGLE_UTILS_ROOT``), so tests fake Kaggle.
"""
import argparse
import dataclasses
import json
import os
import platform as _platform_module
import socket
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

import jax

from . import compilation
from .checkpoint import atomic_write_bytes, manifest_path
from .config import TrainConfig, overrides
from .data import locate_competition_data, tensorflow_on_host
from .efficientnet import resolve_name
from .precision import choose_precision

ROOT_ENV, SMOKE_ENV = "KAGGLE_UTILS_ROOT", "KAGGLE_UTILS_SMOKE"
DATA_ENV, WEIGHTS_ENV = "KAGGLE_UTILS_DATA", "KAGGLE_UTILS_WEIGHTS"
FLOWER_SIZES = (192, 224, 331, 512)  # the competition's tfrecords-jpeg-SxS folders
SUBMISSION = "submission.csv"  # in working/: where Kaggle's Submit and a code competition read it
# Below input/, where Kaggle mounts what a notebook attaches (all seen; newer mounts name the owner):
#   a dataset          SLUG/...                      datasets/OWNER/SLUG/...
#   a notebook output  SLUG/...                      notebooks/OWNER/SLUG/...
#   a Kaggle Model     MODEL/FRAMEWORK/VARIATION/N/  models/OWNER/MODEL/FRAMEWORK/VARIATION/N/
WEIGHTS_DEPTH = 7  # folders below input/ to a weights file in the deepest of them (a Model's newer mount)

# What a notebook trains on each machine: TrainConfig flags, RT.config = TrainConfig().replace(**row).
# A flag a row leaves out keeps TrainConfig's default (the batch: 16 per device, at least 64 per step).
PLATFORM_DEFAULTS = {
    "tpu": dict(model="tf_efficientnetv2_m", image_size=512, epochs=12),  # fits: bench/README.md "TPU v5e-8 plan"
    "gpu": dict(model="tf_efficientnetv2_s", image_size=331, epochs=8),  # T4 (15 GiB) at 331 px: not measured yet
    "cpu": dict(model="tf_efficientnetv2_b0", image_size=192, epochs=2),  # a CPU session with the real data
    # the same code path in seconds on a CPU: timm's minimal EfficientNet at the digits sample's 32 px
    "smoke": dict(model="test_efficientnet", image_size=32, epochs=2, steps_per_epoch=3),
}

# The first cell looks for a kit (a folder holding kaggle_utils/) in this repository, then in Kaggle's
# utility scripts, then in its datasets (newer mounts are input/datasets/<owner>/<slug>).
BOOTSTRAP = '''\
# kaggle_utils bootstrap: put the kit on sys.path (this repository, or a Kaggle dataset / utility script)
import glob, os, sys
_root = os.environ.get("KAGGLE_UTILS_ROOT", "/kaggle")
_dirs = ["kaggle_utils", "../kaggle_utils"] + [f"{_root}/{d}/kaggle_utils" for d in (
    "usr/lib/*", "usr/lib/*/*/*", "input/*", "input/*/*", "input/*/*/*")]
_kits = [os.path.abspath(f"{f}/../..") for d in _dirs for f in sorted(glob.glob(f"{d}/runtime.py"))]
if _kits and _kits[0] not in sys.path:
    sys.path.insert(0, _kits[0])
from kaggle_utils import runtime  # ModuleNotFoundError: attach the kit dataset (kaggle-utils) to the notebook
RT = runtime.setup()
'''


class RuntimeSetupError(RuntimeError):
    """An environment variable or input the set-up was pointed at is unusable; says which and why."""


def defaults(platform: str, *, smoke: bool = False) -> TrainConfig:
    """The :data:`PLATFORM_DEFAULTS` row of ``"tpu"`` / ``"gpu"`` / ``"cpu"`` (or smoke) as a TrainConfig; the
    precision is left to ``--precision auto`` (a T4 and an A100 are both "gpu")."""
    if platform not in ("tpu", "gpu", "cpu"):
        raise ValueError(f"unknown platform {platform!r}: expected one of cpu, gpu, tpu")
    return TrainConfig().replace(**PLATFORM_DEFAULTS["smoke" if smoke else platform])


def current_platform() -> str:
    """JAX's default backend as ``"tpu"`` / ``"gpu"`` / ``"cpu"`` (CUDA and ROCm are both "gpu")."""
    backend = jax.default_backend()
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def internet_available(host: str = "huggingface.co", port: int = 443, timeout: float = 2.0) -> bool:
    """Whether ``host`` (timm's weight hub by default) accepts a TCP connection within ``timeout`` s: a probe,
    so a notebook chooses between downloading and an offline fallback without a flag to remember."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def kaggle_root(root: str | os.PathLike | None = None) -> Path:
    """``root``, else ``$KAGGLE_UTILS_ROOT``, else ``/kaggle``."""
    return Path(root if root is not None else os.environ.get(ROOT_ENV) or "/kaggle")


def _nearest_first(preferred: int) -> list[int]:
    return sorted(FLOWER_SIZES, key=lambda s: (abs(s - preferred), s))


def find_competition_data(image_size: int, root: str | os.PathLike | None = None) -> tuple[Path, int] | None:
    """``(folder with train/ val/ test/, image size)`` of the flower competition (``image_size`` or the nearest
    size there), or None; searches ``$KAGGLE_UTILS_DATA`` when set (then it must be there), else ``root/input``."""
    requested = os.environ.get(DATA_ENV)
    search = [requested] if requested else [str(kaggle_root(root) / "input")]
    for size in dict.fromkeys([image_size, *_nearest_first(image_size)]):  # the size asked for, else the nearest
        splits = locate_competition_data(size, roots=search)
        if splits is not None:
            return Path(splits["train"]).parent, size
    if requested:
        raise RuntimeSetupError(f"{DATA_ENV}={requested}: no tfrecords-jpeg-SxS/{{train,val,test}} folders below it "
                                f"(looked for S in {image_size}, {', '.join(map(str, _nearest_first(image_size)))})")
    return None


def _ported_model(msgpack: Path) -> str | None:
    """The model a weights file holds, from the manifest weights_port writes beside it, else None."""
    try:
        model = json.loads(manifest_path(msgpack).read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None  # training checkpoints name a model config (a dict)


def _msgpack_files(folder: Path, max_depth: int) -> list[Path]:
    """``*.msgpack`` files up to ``max_depth`` folders below ``folder``, shallowest first, then by path: one walk."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        depth = len(Path(dirpath).relative_to(folder).parts)
        found += [(depth, Path(dirpath) / name) for name in filenames if name.endswith(".msgpack")]
        dirnames[:] = sorted(dirnames) if depth < max_depth else []
    return [path for _, path in sorted(found)]


def find_weights(model: str | None = None, root: str | os.PathLike | None = None) -> list[Path]:
    """Ported weights (``NAME.msgpack`` with weights_port's ``NAME.json`` manifest), of ``model`` if given, in
    ``root/input`` in any of Kaggle's mount layouts (a dataset, a notebook's output, a Kaggle Model, old and new:
    see :data:`WEIGHTS_DEPTH`), shallowest first; or in ``$KAGGLE_UTILS_WEIGHTS`` (a file or a folder, where
    finding nothing is an error)."""
    requested = os.environ.get(WEIGHTS_ENV)
    if requested:
        base = Path(requested)
        if not base.exists():
            raise RuntimeSetupError(f"{WEIGHTS_ENV}={requested} does not exist")
        candidates = [base] if base.is_file() else _msgpack_files(base, 1)
    else:
        candidates = _msgpack_files(kaggle_root(root) / "input", WEIGHTS_DEPTH - 1)
    wanted = resolve_name(model) if model is not None else None  # short names ("m") too
    found = [p for p in candidates if (m := _ported_model(p)) is not None and (wanted is None or m == wanted)]
    if requested and not found:
        what = f"ported weights of {wanted}" if wanted else "ported weights"
        raise RuntimeSetupError(f"{WEIGHTS_ENV}={requested}: no {what} there (a NAME.msgpack with the NAME.json "
                                "manifest that weights_port writes)")
    return found


def weights_note(path: Path) -> str:
    """What a weights file is, from its manifest: its source (``random init`` when the port had no internet)."""
    try:
        source = json.loads(manifest_path(path).read_text()).get("source")
    except (OSError, ValueError, AttributeError):
        source = None
    return f" ({source})" if isinstance(source, str) and source else ""


def on_kaggle(root: str | os.PathLike | None = None) -> bool:
    """A Kaggle session (its kernels set ``KAGGLE_KERNEL_RUN_TYPE``), or a root laid out as one (``root/input``)."""
    return "KAGGLE_KERNEL_RUN_TYPE" in os.environ or (kaggle_root(root) / "input").is_dir()


def kaggle_submission(submission: str | os.PathLike, root: str | os.PathLike | None = None) -> Path | None:
    """On Kaggle, ``submission`` copied (atomically) to ``working/submission.csv``, where the notebook's Submit and a
    code competition read it; returns that path, or None off Kaggle (nothing is copied)."""
    if not on_kaggle(root):
        return None
    target = kaggle_root(root) / "working" / SUBMISSION
    source = Path(submission)
    if source.resolve() != target.resolve():
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(target, source.read_bytes())
    return target


def package_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` found, from package metadata (importing TF or torch here
    would cost seconds)."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _versions() -> dict[str, str | None]:
    dist = package_version
    return {"python": _platform_module.python_version(), "jax": jax.__version__, "jaxlib": dist("jaxlib"),
            "libtpu": dist("libtpu", "libtpu-nightly"), "flax": dist("flax"), "optax": dist("optax"),
            "tensorflow": dist("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly"),
            "torch": dist("torch"), "timm": dist("timm")}


def _kit_source(kit: Path, root: Path) -> str:
    resolved = kit.resolve()
    for sub, what in (("usr/lib", "Kaggle utility script"), ("input", "Kaggle dataset")):
        if resolved.is_relative_to((root / sub).resolve()):
            return what
    if (kit / ".git").exists() or (kit / "pyproject.toml").is_file():
        return "repository"
    return "installed package"


@dataclass(frozen=True)
class Runtime:
    """The machine, the inputs found and the config to train; ``str()`` is the set-up report."""

    platform: str  # "tpu" | "gpu" | "cpu"
    device_count: int
    device_kind: str
    process_count: int
    versions: Mapping[str, str | None] = field(hash=False, compare=False)
    on_kaggle: bool
    smoke: bool
    smoke_reason: str
    config: TrainConfig  # this machine's PLATFORM_DEFAULTS row, with the data, image size and weights found
    precision: str  # fp32 | bf16 | fp16: what --precision auto picks on this device
    precision_reason: str
    data_dir: Path | None  # train/ val/ test/ TFRecords, or None: use kaggle_utils.data.make_sample_dataset
    weights: Path | None  # ported weights of the model, or None
    kit: Path  # where the kit was imported from
    kit_source: str
    out_dir: Path  # where to write outputs (/kaggle/working on Kaggle)
    root: Path = Path("/kaggle")  # where the inputs were looked for (root/input)
    weights_found: tuple[Path, ...] = ()  # every ported file of the model found; ``weights`` is the first

    def configure(self, *, model: str | None = None, image_size: int | None = None, epochs: int | None = None,
                  batch_per_device: int | None = None, quiet: bool = False) -> "Runtime":
        """A notebook's settings cell: this runtime with ``model`` and ``image_size`` (the competition folder and the
        ported weights looked for again, for them), ``epochs`` and ``batch_per_device`` (images per device per step);
        None keeps what :func:`setup` chose. Prints what changed unless ``quiet``."""
        changed = self
        if model is not None or image_size is not None:
            changed = dataclasses.replace(detect(model=model or self.config.model.name, image_size=image_size,
                                                 smoke=self.smoke, root=self.root), smoke_reason=self.smoke_reason)
        config = changed.config
        if epochs is not None:
            config = config.replace(epochs=epochs)
        if batch_per_device is not None:
            config = config.replace(batch_per_device=batch_per_device, batch_size=None)
        changed = dataclasses.replace(changed, config=config)
        if not quiet:
            lines = changed._lines()
            at = next(i for i, line in enumerate(lines) if line.startswith("  config"))
            shown = lines[at:at + 2] + [line for line in lines if line.startswith(("  data", "  weights"))]
            print("\n".join(["kaggle_utils settings", *shown]), flush=True)
        return changed

    def __str__(self) -> str:
        return "\n".join(self._lines())

    def _lines(self) -> list[str]:
        v = self.versions
        shown = ", ".join(f"{k} {v[k]}" for k in ("python", "jax", "jaxlib", "libtpu", "flax", "optax") if v.get(k))
        tf = v.get("tensorflow")
        if not tf:
            tf_note = "tensorflow not installed (needed for the TFRecord input only)"
        elif self.platform == "cpu":
            tf_note = f"tensorflow {tf} (for tf.data; imported on first use)"
        else:
            tf_note = f"tensorflow {tf} (for tf.data; the {self.platform.upper()} is hidden from it)"
        model, loop, size = self.config.model.name, self.config.loop, self.config.model.image_size
        steps = f", {loop.steps_per_epoch} steps/epoch" if loop.steps_per_epoch else ""
        data = (f"{self.data_dir} ({size}x{size})" if self.data_dir else
                f"competition data not found: use kaggle_utils.data.make_sample_dataset(dir, image_size={size})")
        changes = ", ".join(f"{k}={v!r}" for k, v in overrides(self.config).items())
        weights = f"none found for {model}"
        if self.weights is not None:
            more = len(self.weights_found) - 1
            weights = f"{self.weights}{weights_note(self.weights)}" + (f"; {more} more of {model} found, the first "
                                                                       "is used" if more > 0 else "")
        return [
            "kaggle_utils runtime",
            f"  machine   {self.platform}: {self.device_count} x {self.device_kind}, {self.process_count} process(es)"
            + (" on Kaggle" if self.on_kaggle else ""),
            f"  versions  {shown}",
            f"            {tf_note}",
            f"  smoke     {'ON' if self.smoke else 'off'} ({self.smoke_reason})",
            f"  config    RT.config = TrainConfig().replace({changes})",
            f"            {model} at {size}px, {self.config.data.global_batch(self.device_count)} per step, "
            f"{loop.epochs} epoch(s){steps}",
            f"  precision {self.precision} ({self.precision_reason})",
            f"  data      {data}",
            f"  weights   {weights}",
            f"  kit       {self.kit} ({self.kit_source})",
            f"  output    {self.out_dir}",
        ]


def _smoke(smoke: bool | None, platform: str, data_found: bool) -> tuple[bool, str]:
    """Smoke mode and why: the argument, else ``$KAGGLE_UTILS_SMOKE`` (1/true/yes/on or 0/false/no/off), else on a
    CPU without the competition data."""
    if smoke is not None:
        return smoke, f"smoke={smoke} argument"
    raw = os.environ.get(SMOKE_ENV, "").strip().lower()
    if raw in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return raw in ("1", "true", "yes", "on"), f"{SMOKE_ENV}={os.environ[SMOKE_ENV]}"
    if raw:
        raise RuntimeSetupError(f"{SMOKE_ENV}={os.environ[SMOKE_ENV]!r}: use 1 (force smoke mode) or 0 (never), "
                                "or leave it unset (smoke on a CPU without the competition data)")
    if platform == "cpu" and not data_found:
        return True, f"CPU without the competition data; {SMOKE_ENV}=0 turns it off"
    return False, f"{'competition data found' if data_found else 'on a ' + platform.upper()}; {SMOKE_ENV}=1 forces it"


def detect(*, model: str | None = None, image_size: int | None = None, smoke: bool | None = None,
           root: str | os.PathLike | None = None) -> Runtime:
    """Looks at the machine and the inputs, with no side effects. ``model`` / ``image_size`` override the platform's
    defaults (and pick the competition folder); ``smoke`` overrides ``$KAGGLE_UTILS_SMOKE`` and the automatic choice."""
    root = kaggle_root(root)
    platform = current_platform()
    devices = jax.devices()
    precision, precision_reason = choose_precision("auto", devices[0])
    found = find_competition_data(image_size or defaults(platform).model.image_size, root)
    is_smoke, smoke_reason = _smoke(smoke, platform, found is not None)
    config = defaults(platform, smoke=is_smoke)
    if is_smoke and found is not None and image_size is None:  # smoke on real data: its smallest images, resized
        found = find_competition_data(min(FLOWER_SIZES), root)  # to the smoke size: the same path, in seconds
    weights = find_weights(model or config.model.name, root)
    at_data_size = found is not None and (image_size is not None or not is_smoke)
    config = config.replace(model=model or config.model.name, weights=str(weights[0]) if weights else None,
                            image_size=found[1] if at_data_size else (image_size or config.model.image_size),
                            data_dir=str(found[0]) if found is not None else None)
    kit = Path(__file__).resolve().parent.parent
    kaggle = on_kaggle(root)
    return Runtime(
        platform=platform, device_count=len(devices), device_kind=devices[0].device_kind,
        process_count=jax.process_count(), versions=MappingProxyType(_versions()), on_kaggle=kaggle,
        smoke=is_smoke, smoke_reason=smoke_reason, config=config, precision=precision.name,
        precision_reason=precision_reason, data_dir=found[0] if found is not None else None,
        weights=weights[0] if weights else None, kit=kit, kit_source=_kit_source(kit, root),
        out_dir=root / "working" if kaggle else Path(tempfile.gettempdir()) / "kaggle_utils_out", root=root,
        weights_found=tuple(weights))


def setup(*, model: str | None = None, image_size: int | None = None, smoke: bool | None = None,
          root: str | os.PathLike | None = None, quiet: bool = False) -> Runtime:
    """:func:`detect`, then the compilation cache, TensorFlow off the accelerator, ``out_dir`` and the report.

    On a TPU or GPU, TensorFlow is imported here, after JAX claimed the accelerators, hidden from them, so a
    later ``import tensorflow`` gets that host-only instance; on a CPU it is left unimported (seconds).
    """
    runtime = detect(model=model, image_size=image_size, smoke=smoke, root=root)
    compilation.enable_cache(runtime.out_dir / "jax_cache")  # kept with the outputs: a restart compiles nothing
    if runtime.platform != "cpu" and runtime.versions.get("tensorflow"):
        tensorflow_on_host()
    runtime.out_dir.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(runtime, flush=True)
    return runtime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils.runtime",
                                     description="Print the runtime report, or the notebooks' first-cell bootstrap.")
    parser.add_argument("--bootstrap", action="store_true", help="print the first-cell snippet and exit")
    if parser.parse_args(argv).bootstrap:
        print(BOOTSTRAP, end="")
        return 0
    try:
        setup()
    except RuntimeSetupError as e:
        parser.exit(2, f"error: {e}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
