"""``python -m kaggle_utils plan --target tpu-v5e-8 | tpu-v3-8 | local``: what a run's steps need on a device.

The TPU compiler answers without a TPU: with libtpu installed, JAX hands out compile-only devices of a TPU
topology, and the run's own steps are compiled for a mesh of them (:func:`memory_plan.step_compiler`). Every byte
and FLOP comes from the compiler; a chip's bf16 peak is the vendor's figure, so images/s at that peak is a bound.
"""
import dataclasses
import json
import os
from importlib import metadata
from pathlib import Path

import jax
from jax.experimental import topologies

try:  # JAX's own probe for TPU chips on the PCI bus (private; in jax 0.7.2 and 0.10.2 alike)
    from jax._src.hardware_utils import num_available_tpu_chips_and_device_id as _tpu_chips
except ImportError:  # a later JAX: assume chips, leave libtpu's environment alone
    _tpu_chips = None

from .. import runtime
from ..checkpoint import atomic_write_text
from ..config import ConfigError, TrainConfig
from ..efficientnet import pretrained_cfg
from ..models import registered
from ..parallel import make_mesh
from . import RunData, check_config, global_batch, memory_plan, open_data, resolve, run_task  # (run/__init__ first)
from .memory_plan import GIB, gib_text

FLOWER_TRAIN_IMAGES, FLOWER_CLASSES = 12_753, 104  # a plan without data: the flower competition's train split


@dataclasses.dataclass(frozen=True)
class Target:
    topology: str  # jax.experimental.topologies' name
    chips_per_host: tuple[int, int, int]  # one VM holds them all, as on Kaggle (pmap maps over one host's devices)
    device_kind: str
    hbm: int  # bytes per device the TPU compiler says are available ("exceeds available HBM (15.75G)")
    peak_tflops: float  # bf16, per device


TARGETS = {  # a v3 chip is two devices (cores) of 61.5 of its 123 TFLOPS; a v5e chip is one device
    "tpu-v5e-8": Target("v5e:2x4", (2, 4, 1), "TPU v5 lite", int(15.75 * GIB), 197.0),
    "tpu-v3-8": Target("v3:2x2", (2, 2, 1), "TPU v3", int(15.48 * GIB), 61.5),
}


def quiet_libtpu() -> None:
    """Where the machine has no TPU chip, tell libtpu so before JAX loads it: a compile-only load, or JAX's probe for
    a TPU backend wherever libtpu is installed, then prints no failed search for TPU hosts and no multi-process lock
    error. On a TPU VM nothing changes (libtpu finds its chips, as JAX_PLATFORMS is never touched)."""
    if _tpu_chips is not None and _tpu_chips()[0] == 0:
        for name, value in (("TPU_ACCELERATOR_TYPE", "v5litepod-8"), ("TPU_WORKER_HOSTNAMES", "localhost"),
                            ("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")):
            os.environ.setdefault(name, value)


def _check_libtpu(flag: str) -> None:
    """libtpu installed, in the version this jax's ``[tpu]`` extra pins; else one line saying what to install."""
    pins = [r.split(";")[0].strip()[len("libtpu"):] for r in metadata.requires("jax") or [] if r.startswith("libtpu")]
    wanted = pins[0] if pins else ""  # "==0.0.42.*" (jax 0.10.2), "==0.0.23" (jax 0.7.2)
    install = f"pip install 'libtpu{wanted}' (the TPU compiler of jax {jax.__version__}, ~700 MB)"
    have = runtime.package_version("libtpu")
    if have is None:
        if os.environ.get("TPU_LIBRARY_PATH"):
            return  # a libtpu.so given by path: jax loads that one
        raise ConfigError(f"{flag}: libtpu is not installed; {install}")
    pin = wanted.removeprefix("==")
    if wanted.startswith("==") and not (have == pin or pin.endswith("*") and have.startswith(pin[:-1])):
        raise ConfigError(f"{flag}: libtpu {have} does not fit jax {jax.__version__}, which needs libtpu{wanted}; "
                          f"{install}")


def target_devices(name: str) -> list:
    """The devices a plan compiles for: a TPU slice's compile-only devices, or ``local``: this machine's."""
    if name == "local":
        return jax.devices()
    if name not in TARGETS:
        raise ConfigError(f"--target {name}: choose one of {', '.join([*TARGETS, 'local'])}")
    _check_libtpu(f"--target {name}")
    quiet_libtpu()
    target = TARGETS[name]
    return topologies.get_topology_desc(platform="tpu", topology_name=target.topology,
                                        chips_per_host_bounds=target.chips_per_host).devices


def target_config(config: TrainConfig, name: str) -> TrainConfig:
    """``config`` with what ``train`` chooses on a TPU where it left them open: bf16, a head padded to 128."""
    if name == "local":
        return config
    precision = "bf16" if config.model.precision == "auto" else config.model.precision
    return config.replace(precision=precision, head_multiple=config.model.head_multiple or 128)


def no_data(config: TrainConfig, train_images: int | None) -> RunData:
    """A plan's data where none is given: ``train_images`` (default the flower competition's), its 104 classes (or
    ``--num-classes``), at ``--image-size`` (default the model's pretrained size)."""
    images = FLOWER_TRAIN_IMAGES if train_images is None else train_images
    if images < 1:
        raise ConfigError(f"--train-images {images}: must be at least 1")
    if config.model.image_size is None and not registered(config.model.name).efficientnet:
        raise ConfigError(f"--model {config.model.name}: a plan without data needs --image-size (the size is known "
                          "only for the registered EfficientNets)")
    size = config.model.image_size or pretrained_cfg(config.model.name)["input_size"][-1]
    return RunData(root=None, splits={"train": [], "val": [], "test": []}, stored_size=size, num_train=images,
                   max_label=(config.model.num_classes or FLOWER_CLASSES) - 1,
                   description="no data (--train-images)" if train_images else "no data (the flower set's count)")


def _source_data(config: TrainConfig) -> RunData:
    """``--source``'s images counted as its conversion would split them (nothing is converted)."""
    from ..data.convert import source_from_spec, stratified_split  # reads the source's listing only

    data = config.data
    source = source_from_spec(data.source, image_dir=data.image_dir, tfds_data_dir=data.tfds_data_dir)
    train, _ = stratified_split(source.labels, data.val_fraction, config.seed)
    classes = source.labels.shape[1] if source.multi_label else int(source.labels.max()) + 1
    return dataclasses.replace(no_data(config.replace(num_classes=config.model.num_classes or classes), len(train)),
                               multi_label=source.multi_label, description=f"--source {data.source}")


def plan(config: TrainConfig, target: str, *, out=None, train_images: int | None = None, task=None,
         search: bool = True) -> dict:
    """The run's steps compiled for ``target``: bytes per device against its budget, the largest batch that fits
    (unless not ``search``: then only the run's batch is compiled, three compiles instead of a search's dozen),
    FLOPs per image and the peak's bound on images/s; written to ``out/plan.json`` when ``out`` is given. A run
    batch above the budget is refused (:class:`ConfigError` naming the bytes) after the plan is written."""
    devices = target_devices(target)
    chips, config = len(devices), target_config(config, target)
    config, task = run_task(config, task)
    # what train would refuse, before any data is read; --memory-budget is the plan's own, with any batch
    check_config(config.replace(memory_budget=None) if config.data.batch_per_device != "auto" else config, task)
    if train_images is not None and (config.data.data_dir or config.data.source):
        raise ConfigError("--train-images is for a plan without data: --data-dir / --source give their own count")
    data = (_source_data(config) if config.data.source else open_data(config, config.data.data_dir)
            if config.data.data_dir else no_data(config, train_images))
    auto, k = config.data.batch_per_device == "auto", config.optim.accumulate_steps
    if auto and not search:
        raise ConfigError("--batch-per-device auto is the batch search: a plan without it needs a batch")
    # as train would on the target; --memory-budget is the plan's budget, with any batch
    per_chip = None if auto else global_batch(config.replace(memory_budget=None), chips) // chips
    if (per_chip or k) * chips > data.num_train:
        raise ConfigError(f"a global batch of {(per_chip or k) * chips} on {target} is more than the "
                          f"{data.num_train} training images")
    given = config.data.memory_budget
    resolved, run_plan = resolve(config.replace(batch_per_device=per_chip or k, batch_size=None, memory_budget=None),
                                 data, task)
    # the plan searches the largest batch with any --batch-per-device: only a budget does instead of a device's own
    budget = (memory_plan.device_budget(given, devices[0], needed_by="plan --target local", alternatives=())
              if given is not None or target == "local" else
              (TARGETS[target].hbm, f"the HBM the TPU compiler gives a {devices[0].device_kind} device"))
    compiled = memory_plan.step_compiler(resolved, run_plan, mesh=make_mesh(devices), task=task)
    fit = memory_plan.fit_batch(resolved, run_plan, per_device_limit=data.num_train // chips, budget=budget,
                                compile_step=compiled) if search else None
    per_chip = per_chip or fit.per_device
    steps = {name: compiled(name, per_chip) for name in ("train", "eval", "predict")}
    per_step = per_chip * chips
    flops = {name: steps[name].flops / per_chip / 1e9 for name in ("train", "eval")}
    peak = next((t.peak_tflops for t in TARGETS.values() if t.device_kind == devices[0].device_kind), None)
    images_per_s = chips * peak * 1e12 / (flops["train"] * 1e9) if peak and flops["train"] else None
    epoch_images, usable = data.num_train // per_step * per_step, int(budget[0] * (1 - memory_plan.MARGIN))
    result = {
        "target": target, "devices": chips, "device_kind": devices[0].device_kind, "model": resolved.model.name,
        "image_size": resolved.model.image_size, "precision": resolved.model.precision, "mode": resolved.loop.mode,
        "remat": resolved.model.remat, "accumulate_steps": k, "data": data.description, "train_images": data.num_train,
        "classes": resolved.model.num_classes, "per_device_batch": per_chip, "global_batch": per_step,
        "steps_per_epoch": data.num_train // per_step, "budget_bytes": budget[0], "budget_source": budget[1],
        "usable_bytes": usable, "fits": steps["train"].bytes <= usable,
        "largest_per_device_batch": fit.per_device if fit else None,
        "search": fit.describe() if fit else "not searched (the run's batch only)",
        "steps": {n: {**dataclasses.asdict(s), "bytes": s.bytes} for n, s in steps.items()},
        "train_gflops_per_image": flops["train"], "eval_gflops_per_image": flops["eval"], "peak_tflops": peak,
        "images_per_s_at_peak": images_per_s, "epoch_seconds_at_peak": epoch_images / images_per_s if images_per_s
        else None, "epoch_images": epoch_images, "libtpu": runtime.package_version("libtpu")}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(out) / "plan.json", json.dumps(result, indent=1))
    return result


def plan_lines(p: dict) -> list[str]:
    """The plan block the command prints: every figure is one of ``plan.json``'s."""
    train, gib = p["steps"]["train"], gib_text
    where = f"{p['devices']} x {p['device_kind']}" + (", compile-only" if p["target"] != "local" else "")
    fits = "fits" if p["fits"] else "DOES NOT FIT"
    bound = (f"{p['images_per_s_at_peak']:,.0f} images/s at the bf16 peak ({p['devices']} x {p['peak_tflops']:g} "
             f"TFLOPS), an upper bound no step reaches: {p['epoch_seconds_at_peak']:.3g} s per epoch of "
             f"{p['epoch_images']:,} images" if p["images_per_s_at_peak"] else "no bf16 peak known for this device")
    return [f"plan: {p['model']} at {p['image_size']}px, {p['precision']}, {p['mode']}, remat {p['remat']}, on "
            f"{p['target']} ({where})",
            f"  data      {p['data']}: {p['train_images']:,} train images, {p['classes']} classes",
            f"  batch     {p['per_device_batch']} per device x {p['devices']} = {p['global_batch']} per step, "
            f"{p['steps_per_epoch']} steps per epoch",
            f"  train     {gib(train['bytes'])} per device of {gib(p['usable_bytes'])} usable ({fits}): arguments "
            f"{gib(train['arguments'])}, outputs {gib(train['outputs'])}, temporaries {gib(train['temporaries'])}, "
            f"code {gib(train['code'])}, donated {gib(train['aliased'])}" + (f"; {train['refused']}" if train['refused']
                                                                              else ""),
            "  eval      " + ", ".join(f"{name} {gib(p['steps'][name]['bytes'])}" for name in ("eval", "predict")),
            f"  largest   {p['search']}",
            f"  compute   {p['train_gflops_per_image']:.4g} train, {p['eval_gflops_per_image']:.4g} eval GFLOPs per "
            "image (per device, by the compiler)",
            f"  bound     {bound}",
            "  compiled  " + ", ".join(f"{name} {s['seconds']:.0f} s" for name, s in p["steps"].items())]


def plan_command(config: TrainConfig, target: str, *, out=None, train_images: int | None = None) -> dict:
    """``python -m kaggle_utils plan``: prints the block; a run batch above the budget then exits 2 naming the bytes."""
    result = plan(config, target, out=out, train_images=train_images)
    print("\n".join(plan_lines(result)))
    if not result["fits"]:
        train = result["steps"]["train"]
        raise ConfigError(f"{result['per_device_batch']} images per device: the train step needs {train['bytes']:,} "
                          f"bytes per device, more than the {result['usable_bytes']:,} usable of "
                          f"{result['budget_source']} ({result['budget_bytes']:,} bytes less a "
                          f"{memory_plan.MARGIN:.0%} margin); {result['largest_per_device_batch']} fit")
    return result
