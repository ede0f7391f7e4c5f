"""Runtime set-up for the notebooks: what machine is this, where are the inputs, what sizes to use.

The same notebook runs unchanged on a Kaggle TPU VM, a Kaggle GPU, a Kaggle CPU session and a
CPU in CI. Its first cell puts the kit on ``sys.path`` and calls :func:`setup`, which looks at
the machine and the mounted inputs and returns a :class:`Runtime` (frozen) with everything the
rest of the notebook needs to choose. That cell cannot be a function of the kit, since it runs
before the kit is importable: it is the text :data:`BOOTSTRAP`, its one source
(``python -m kaggle_utils.runtime --bootstrap`` prints it; ``python -m kaggle_utils.publish lint``
checks that the README and every notebook hold it verbatim). Then::

    RT.platform          "tpu" | "gpu" | "cpu"
    RT.smoke             True: tiny model, small images, few steps (CI / nbmake)
    RT.model, RT.image_size, RT.precision, RT.per_device_batch, RT.global_batch, RT.epochs, RT.steps_per_epoch
    RT.data_dir          folder with train/ val/ test/ TFRecords, or None (then use
                         kaggle_utils.data.make_sample_dataset(dir, image_size=RT.image_size))
    RT.weights           ported weights (.msgpack + manifest) of RT.model, or None
    RT.kit, RT.out_dir   where the kit was imported from; where to write outputs
    print(RT)            the report setup() prints

Choices, and why:

* Smoke mode is on by itself on a CPU without the competition data (CI, a laptop), so every
  notebook finishes in minutes under nbmake; ``KAGGLE_UTILS_SMOKE=1`` / ``0`` forces it.
* Inputs are found by probing, not assumed: Kaggle has mounted the same competition at several
  paths over time (:func:`kaggle_utils.data.locate_competition_data` does the probing), and a
  kit or weights dataset may sit one or three levels deep. Every probe takes ``root`` (default
  ``$KAGGLE_UTILS_ROOT`` or ``/kaggle``) so tests build fake Kaggle trees.
  ``KAGGLE_UTILS_DATA`` / ``KAGGLE_UTILS_WEIGHTS`` point at local copies instead.
* TensorFlow is only for tf.data on the host: :func:`setup` hides the accelerators from it on a
  TPU or GPU (after JAX has claimed them), and importing this module imports neither
  TensorFlow nor torch. Versions are read from package metadata, not by importing.
* The precision is the job's ``--precision auto`` (:func:`kaggle_utils.precision.choose_precision`),
  16 images per device with at least 64 per step (:func:`global_batch`): the job's rules.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform as _platform_module
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

__all__ = ["BOOTSTRAP", "Defaults", "Runtime", "RuntimeSetupError", "current_platform", "defaults", "detect",
           "find_competition_data", "find_kit", "find_weights", "global_batch", "internet_available", "kaggle_root",
           "setup", "smoke_override"]

ROOT_ENV = "KAGGLE_UTILS_ROOT"
SMOKE_ENV = "KAGGLE_UTILS_SMOKE"
DATA_ENV = "KAGGLE_UTILS_DATA"
WEIGHTS_ENV = "KAGGLE_UTILS_WEIGHTS"
DEFAULT_ROOT = "/kaggle"
# where a kit directory (one holding kaggle_utils/) may be: beside/above the working directory
# (this repository), then under the Kaggle root (utility scripts first, then datasets, whose
# newer mounts are input/datasets/<owner>/<slug>)
LOCAL_KIT_DIRS = (".", "..")
KAGGLE_KIT_DIRS = ("usr/lib/*", "usr/lib/*/*/*", "input/*", "input/*/*", "input/*/*/*")
FLOWER_SIZES = (192, 224, 331, 512)  # the competition's tfrecords-jpeg-SxS folders
DEFAULT_PER_DEVICE_BATCH = 16
MIN_GLOBAL_BATCH = 64  # BatchNorm statistics and the LR scale want some examples per step
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

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


# --------------------------------------------------------------------------- defaults


@dataclass(frozen=True)
class Defaults:
    """What a notebook trains on a given machine unless told otherwise."""

    model: str
    image_size: int
    per_device_batch: int
    epochs: int
    steps_per_epoch: int | None = None  # None: a full pass over the training data


_PLATFORM_DEFAULTS = {
    # v5e-8: 16 GiB HBM per chip holds V2-M at 512 px, 16 images, bf16
    "tpu": Defaults("tf_efficientnetv2_m", 512, DEFAULT_PER_DEVICE_BATCH, epochs=12),
    # T4 / P100 (16 GiB): V2-S at the competition's 331 px
    "gpu": Defaults("tf_efficientnetv2_s", 331, DEFAULT_PER_DEVICE_BATCH, epochs=8),
    # a Kaggle CPU session with the data: smallest model and images, still the real data
    "cpu": Defaults("tf_efficientnetv2_b0", 192, DEFAULT_PER_DEVICE_BATCH, epochs=2),
}
# smoke: the same code path in seconds per step on a CPU (32 px = the embedded digits sample), on timm's
# minimal EfficientNet (every block type, one block per stage), which compiles in seconds
_SMOKE = Defaults("test_efficientnet", 32, 8, epochs=2, steps_per_epoch=3)


def defaults(platform: str, *, smoke: bool = False) -> Defaults:
    """The :class:`Defaults` for ``"tpu"`` / ``"gpu"`` / ``"cpu"``, or the smoke size.

    The precision is not among them: it depends on the device itself (a T4 and an A100 are both
    "gpu"), so :func:`detect` asks :func:`kaggle_utils.precision.choose_precision`, as the job does.
    """
    if platform not in _PLATFORM_DEFAULTS:
        raise ValueError(f"unknown platform {platform!r}: expected one of {sorted(_PLATFORM_DEFAULTS)}")
    if smoke:
        return _SMOKE
    return _PLATFORM_DEFAULTS[platform]


def global_batch(device_count: int, per_device: int = DEFAULT_PER_DEVICE_BATCH) -> int:
    """Images per step: ``per_device`` on every device, raised to the smallest multiple of
    ``device_count`` that is at least :data:`MIN_GLOBAL_BATCH` (e.g. 128 on 8 devices, 64 on 1, 66 on 3)."""
    if device_count < 1 or per_device < 1:
        raise ValueError(f"device_count={device_count} and per_device={per_device} must be positive")
    return max(per_device * device_count, -(-MIN_GLOBAL_BATCH // device_count) * device_count)


def current_platform() -> str:
    """JAX's default backend as ``"tpu"`` / ``"gpu"`` / ``"cpu"`` (CUDA and ROCm are both "gpu")."""
    import jax

    backend = jax.default_backend()
    return "gpu" if backend in ("gpu", "cuda", "rocm") else backend


def smoke_override() -> bool | None:
    """``$KAGGLE_UTILS_SMOKE``: True / False when set to 1/true/yes/on or 0/false/no/off, None when unset or empty."""
    raw = os.environ.get(SMOKE_ENV, "").strip().lower()
    if not raw:
        return None
    if raw in _TRUE or raw in _FALSE:
        return raw in _TRUE
    raise RuntimeSetupError(f"{SMOKE_ENV}={os.environ[SMOKE_ENV]!r}: use 1 (force smoke mode) or 0 (never), "
                            "or leave it unset (smoke on a CPU without the competition data)")


def internet_available(host: str = "huggingface.co", port: int = 443, timeout: float = 2.0) -> bool:
    """Whether ``host`` (timm's weight hub by default) accepts a TCP connection within ``timeout`` s.

    A probe, not a setting: Kaggle's "Internet off" and CI both fail here in milliseconds (no
    name resolution), so notebooks can choose between downloading and an offline fallback
    without a flag a user must remember to flip.
    """
    import socket

    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- inputs


def kaggle_root(root: str | os.PathLike | None = None) -> Path:
    """``root``, else ``$KAGGLE_UTILS_ROOT``, else ``/kaggle``."""
    return Path(root if root is not None else os.environ.get(ROOT_ENV) or DEFAULT_ROOT)


def find_kit(root: str | os.PathLike | None = None, cwd: str | os.PathLike | None = None) -> Path | None:
    """The folder to put on ``sys.path`` so ``import kaggle_utils`` works, or None.

    The same search as :data:`BOOTSTRAP`, in the same order: ``cwd`` or its parent (this
    repository, e.g. from ``notebooks/``), then utility scripts under ``root/usr/lib``, then
    datasets under ``root/input``.
    """
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    root = kaggle_root(root)
    patterns = [cwd / d / "kaggle_utils" for d in LOCAL_KIT_DIRS]
    patterns += [Path(f"{root}/{d}/kaggle_utils") for d in KAGGLE_KIT_DIRS]
    for pattern in patterns:
        hits = sorted(glob.glob(str(pattern / "runtime.py")))
        if hits:
            return Path(os.path.abspath(Path(hits[0]).parent.parent))
    return None


def _nearest_first(preferred: int) -> list[int]:
    return sorted(FLOWER_SIZES, key=lambda s: (abs(s - preferred), s))


def find_competition_data(image_size: int, root: str | os.PathLike | None = None) -> tuple[Path, int] | None:
    """``(folder with train/ val/ test/, image size)`` of the flower competition, or None.

    Takes ``image_size`` when Kaggle ships it, else the nearest size that is there. Searches
    ``$KAGGLE_UTILS_DATA`` when set (and then insists on finding the data there), else
    ``root/input`` through :func:`kaggle_utils.data.locate_competition_data`.
    """
    from .data.tfrecords import locate_competition_data  # imports neither TF nor jax

    requested = os.environ.get(DATA_ENV)
    search = [requested] if requested else [str(kaggle_root(root) / "input")]
    sizes = [image_size] if image_size not in FLOWER_SIZES else []
    for size in sizes + _nearest_first(image_size):
        splits = locate_competition_data(size, roots=search)
        if splits is not None:
            return Path(splits["train"]).parent, size
    if requested:
        raise RuntimeSetupError(f"{DATA_ENV}={requested}: no tfrecords-jpeg-SxS/{{train,val,test}} folders below it "
                                f"(looked for S in {image_size}, {', '.join(map(str, _nearest_first(image_size)))})")
    return None


def _ported_model(msgpack: Path) -> str | None:
    """The model a weights file holds, from the manifest weights_port writes beside it, else None."""
    from .checkpoint import manifest_path  # jax and flax: imported only when weights are looked for

    manifest = manifest_path(msgpack)
    try:
        model = json.loads(manifest.read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None  # training checkpoints name a model config (a dict)


def find_weights(model: str | None = None, root: str | os.PathLike | None = None) -> list[Path]:
    """Ported weights (``NAME.msgpack`` with weights_port's ``NAME.json`` manifest), of ``model`` if given.

    ``$KAGGLE_UTILS_WEIGHTS`` (a file or a folder) replaces the search of ``root/input``; when
    it is set, finding nothing there is an error rather than a silent None later.
    """
    requested = os.environ.get(WEIGHTS_ENV)
    if requested:
        base = Path(requested)
        if not base.exists():
            raise RuntimeSetupError(f"{WEIGHTS_ENV}={requested} does not exist")
        candidates = [base] if base.is_file() else sorted(base.glob("*.msgpack")) + sorted(base.glob("*/*.msgpack"))
    else:
        inputs = kaggle_root(root) / "input"
        candidates = [Path(p) for depth in ("*", "*/*", "*/*/*")
                      for p in sorted(glob.glob(f"{inputs}/{depth}/*.msgpack"))]
    wanted = None
    if model is not None:
        from .efficientnet.arch import resolve_name  # accepts the short names ("m") too

        wanted = resolve_name(model)
    found = [p for p in candidates if (m := _ported_model(p)) is not None and (wanted is None or m == wanted)]
    if requested and not found:
        what = f"ported weights of {wanted}" if wanted else "ported weights"
        raise RuntimeSetupError(f"{WEIGHTS_ENV}={requested}: no {what} there (a NAME.msgpack with the NAME.json "
                                "manifest that weights_port writes)")
    return found


# --------------------------------------------------------------------------- the machine


def _versions() -> dict[str, str | None]:
    """Installed versions from package metadata (importing TF or torch here would cost seconds)."""
    import jax

    def dist(*names):
        for name in names:
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
        return None

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
    """The machine, the inputs found and the sizes chosen; ``str()`` is the set-up report."""

    platform: str
    device_count: int
    device_kind: str
    process_count: int
    versions: Mapping[str, str | None] = dataclasses.field(hash=False, compare=False)
    on_kaggle: bool
    smoke: bool
    smoke_reason: str
    model: str
    image_size: int
    precision: str  # fp32 | bf16 | fp16: what the job's --precision auto picks on this device
    precision_reason: str
    per_device_batch: int
    epochs: int
    steps_per_epoch: int | None
    data_dir: Path | None
    weights: Path | None
    kit: Path
    kit_source: str
    out_dir: Path

    @property
    def dtype(self) -> str:  # RT.dtype of notebooks written before RT.precision
        return {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[self.precision]

    @property
    def global_batch(self) -> int:
        return global_batch(self.device_count, self.per_device_batch)

    def __str__(self) -> str:
        v = self.versions
        shown = ", ".join(f"{k} {v[k]}" for k in ("python", "jax", "jaxlib", "libtpu", "flax", "optax") if v.get(k))
        tf = v.get("tensorflow")
        if not tf:
            tf_note = "tensorflow not installed (needed for the TFRecord input only)"
        elif self.platform == "cpu":
            tf_note = f"tensorflow {tf} (for tf.data; imported on first use)"
        else:
            tf_note = f"tensorflow {tf} (for tf.data; the {self.platform.upper()} is hidden from it)"
        steps = f", {self.steps_per_epoch} steps/epoch" if self.steps_per_epoch else ""
        data = (f"{self.data_dir} ({self.image_size}x{self.image_size})" if self.data_dir else
                "competition data not found: use kaggle_utils.data.make_sample_dataset(dir, "
                f"image_size={self.image_size})")
        smoke = f"ON ({self.smoke_reason})" if self.smoke else f"off ({self.smoke_reason})"
        lines = [
            "kaggle_utils runtime",
            f"  machine   {self.platform}: {self.device_count} x {self.device_kind}, {self.process_count} process(es)"
            + (" on Kaggle" if self.on_kaggle else ""),
            f"  versions  {shown}",
            f"            {tf_note}",
            f"  smoke     {smoke}",
            f"  defaults  {self.model} at {self.image_size}px, batch {self.per_device_batch}/device "
            f"-> {self.global_batch} per step, {self.epochs} epoch(s){steps}",
            f"  precision {self.precision} ({self.precision_reason})",
            f"  data      {data}",
            f"  weights   {self.weights or f'none found for {self.model}'}",
            f"  kit       {self.kit} ({self.kit_source})",
            f"  output    {self.out_dir}",
        ]
        return "\n".join(lines)


def detect(*, model: str | None = None, image_size: int | None = None, smoke: bool | None = None,
           root: str | os.PathLike | None = None) -> Runtime:
    """Looks at the machine and the inputs; no side effects (no TensorFlow, no printing).

    ``model`` / ``image_size`` override the platform's defaults (the image size then picks
    which competition folder is used); ``smoke`` overrides both ``$KAGGLE_UTILS_SMOKE`` and the
    automatic choice.
    """
    import jax

    from .precision import choose_precision

    root = kaggle_root(root)
    platform = current_platform()
    devices = jax.devices()
    precision, precision_reason = choose_precision("auto", devices[0])
    base = defaults(platform)
    found = find_competition_data(image_size or base.image_size, root)
    forced = smoke if smoke is not None else smoke_override()
    if forced is not None:
        is_smoke = forced
        reason = f"smoke={forced} argument" if smoke is not None else f"{SMOKE_ENV}={os.environ[SMOKE_ENV]}"
    else:
        is_smoke = platform == "cpu" and found is None
        if is_smoke:
            reason = f"CPU without the competition data; {SMOKE_ENV}=0 turns it off"
        else:
            reason = (f"{'competition data found' if found else 'on a ' + platform.upper()}; "
                      f"{SMOKE_ENV}=1 forces it")
    chosen = defaults(platform, smoke=is_smoke)
    if is_smoke and found is not None and image_size is None:  # smoke on real data: its smallest images
        found = find_competition_data(min(FLOWER_SIZES), root)
    size = found[1] if found is not None else (image_size or chosen.image_size)
    name = model or chosen.model
    weights = find_weights(name, root)
    kit = Path(__file__).resolve().parent.parent
    on_kaggle = "KAGGLE_KERNEL_RUN_TYPE" in os.environ or (root / "input").is_dir()
    return Runtime(
        platform=platform, device_count=len(devices), device_kind=devices[0].device_kind,
        process_count=jax.process_count(), versions=MappingProxyType(_versions()), on_kaggle=on_kaggle,
        smoke=is_smoke, smoke_reason=reason, model=name, image_size=size,
        precision=precision.name, precision_reason=precision_reason,
        per_device_batch=chosen.per_device_batch, epochs=chosen.epochs, steps_per_epoch=chosen.steps_per_epoch,
        data_dir=found[0] if found is not None else None, weights=weights[0] if weights else None,
        kit=kit, kit_source=_kit_source(kit, root),
        out_dir=root / "working" if on_kaggle else Path(tempfile.gettempdir()) / "kaggle_utils_out")


def setup(*, model: str | None = None, image_size: int | None = None, smoke: bool | None = None,
          root: str | os.PathLike | None = None, quiet: bool = False) -> Runtime:
    """:func:`detect`, then the compilation cache, TensorFlow off the accelerator, ``out_dir`` and the report.

    On a TPU or GPU, TensorFlow (when installed) is imported here with the accelerators hidden
    from it, after JAX has claimed them: a later ``import tensorflow`` anywhere in the notebook
    gets that host-only instance. On a CPU it is left unimported (it costs seconds).
    """
    from . import compilation

    runtime = detect(model=model, image_size=image_size, smoke=smoke, root=root)
    compilation.enable_cache(runtime.out_dir / "jax_cache")  # kept with the outputs: a restart compiles nothing
    if runtime.platform != "cpu" and runtime.versions.get("tensorflow"):
        from .data import tfrecords

        tfrecords.tensorflow_on_host()
    runtime.out_dir.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(runtime, flush=True)
    return runtime


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils.runtime",
                                     description="Print the runtime report, or the notebooks' first-cell bootstrap.")
    parser.add_argument("--bootstrap", action="store_true", help="print the first-cell snippet and exit")
    args = parser.parse_args(argv)
    if args.bootstrap:
        print(BOOTSTRAP, end="")
        return 0
    try:
        setup()
    except RuntimeSetupError as e:
        parser.exit(2, f"error: {e}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
