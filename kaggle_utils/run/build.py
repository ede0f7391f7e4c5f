"""What a resolved run is built from and of: its :class:`Plan`; model, variables, optimizer, steps, state; datasets;
a finished run's checkpoint read back (``--init-from``, :func:`~kaggle_utils.run.load_run`).

A progressive run's stage (``--progressive-stages``; the numbers are :mod:`kaggle_utils.train.progressive`'s) is the
run's config with that stage's image size, RandAugment magnitude, Mixup / CutMix alphas and dropout, so what builds
a run's input and step from a config builds a stage's unchanged, for every data route and for ``cv``.
"""
import dataclasses
import functools
import json
import math
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from .. import checkpoint, models, surgery
from ..config import ConfigError, TrainConfig
from ..data import CenterCrop, HostDataset, ImgaugRandAugment, RandAugment, RandomResizedCrop, Resize, load_dataset
from ..device_augment import MixConfig, RandAugmentConfig, make_device_augment, mix
from ..efficientnet import efficientnet_v2_pretrained
from ..precision import Precision
from ..variable_trees import VariableTreeError, abstract_variables
from ..train import (AXIS, StepConfig, Steps, Task, TrainState, assign_lr_groups, create_train_state,
                     describe_lr_groups, init_variables, make_optimizer, make_schedule, make_steps)
from ..train import make_task as task_named
from ..train.progressive import SIZE_MULTIPLE, Stage, progressive_schedule
from .data import RunData
from .defaults import settled

DEFAULT_MIN_SIZE = 128  # --progressive-min-size's default: the official code's ibase


@dataclasses.dataclass(frozen=True)
class Plan:
    """The numbers a resolved config implies on this machine (:func:`~kaggle_utils.run.resolve`); in config.json."""

    device_count: int
    global_batch: int
    per_device_batch: int
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    peak_lr: float  # NaN while lr is "auto": the LR range test (run.lr_find) has not found it yet
    head_width: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    lr_multipliers: dict[str, float] | None = None  # per part of the network (--layer-decay, --head-lr-mult)
    precision_reason: str = ""  # why --precision is what it is on this machine
    batch_fit: str = ""  # with --batch-per-device auto: the batch chosen, bytes vs budget, compiles and seconds
    stages: tuple[Stage, ...] = ()  # --progressive-stages, in order
    model_size: dict | None = None  # parameters and GFLOPs per image (:func:`model_size`), once the model is built
    data_defaults: tuple[str, ...] = ()  # each choice made from the data, with its reason (:mod:`.defaults`)

    def describe(self, config: TrainConfig) -> str:
        found = math.isfinite(self.peak_lr)  # NaN: --lr auto, before the range test
        lr = f"{self.peak_lr:.3g} ({config.optim.lr:g} per 256 images)" if found else "auto (a range test finds it)"
        groups = f"; {describe_lr_groups(self.peak_lr, self.lr_multipliers)}" if self.lr_multipliers and found else ""
        k = config.optim.accumulate_steps
        pieces = f" in {k} micro-batches of {self.per_device_batch // k}" if k > 1 else ""
        optim, model = config.optim, config.model
        return (f"global batch {self.global_batch} = {self.per_device_batch} per device{pieces} x {self.device_count} "
                f"device(s); {optim.optimizer}, {optim.schedule} schedule, peak learning rate {lr}{groups}; "
                f"{self.total_steps} steps ({self.steps_per_epoch} per epoch, warmup {self.warmup_steps}); "
                f"{model.name} at {model.image_size}px{_size_text(self.model_size)}, {model.num_classes} classes; "
                f"{Precision(model.precision).describe()} ({self.precision_reason})"
                f"{describe_stages(config, self.stages)}"
                + (f"; {self.batch_fit}" if self.batch_fit else "")
                + (f"; chosen from the data: {'; '.join(self.data_defaults)}" if self.data_defaults else ""))


def _size_text(size: dict | None) -> str:
    if not size:
        return ""

    def count(n: int) -> str:
        return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"

    frozen = f", {count(size['params_frozen'])} frozen" if size["params_frozen"] else ""
    flops = f", {size['gflops_per_image']:.3g} GFLOPs per image" if size["gflops_per_image"] is not None else ""
    return f" ({count(size['params_trainable'] + size['params_frozen'])} parameters{frozen}{flops})"


def make_task(config: TrainConfig) -> Task:
    task = config.task
    return task_named(task.task, label_smoothing=task.label_smoothing, focal_gamma=task.focal_gamma,
                      threshold=0.5 if task.threshold == "auto" else task.threshold)  # auto: learnt after training


def build_model(config: TrainConfig) -> nn.Module:
    """The module a run trains: the registered model (:mod:`kaggle_utils.models`) with ``head_width`` outputs."""
    model = config.model
    return models.build_model(model.name, num_classes=surgery.padded_width(model.num_classes, model.head_multiple or 1),
                              dtype=Precision(model.precision).compute_dtype, drop_rate=model.drop_rate,
                              drop_path_rate=model.drop_path_rate, bn_axis_name=AXIS if model.sync_bn else None,
                              remat=model.remat == "blocks")


def initial_variables(config: TrainConfig, model: nn.Module) -> dict:
    """Random init, ``--init-from``'s run's weights, or ported weights for the backbone with a zero classifier: equal
    logits, so the first loss is ln C (timm's init, sized for 1000 outputs, gives a few classes large logits the
    features must unlearn; ``--no-zero-head`` keeps it)."""
    if config.model.init_from:  # classifier included
        file = check_parent(config)
        if jax.process_index() == 0:
            print(f"--init-from {file}: {config.model.name}, {config.model.num_classes} classes, classifier kept")
        return run_variables(file, model, config)
    variables = init_variables(model, config.model.image_size, seed=config.seed)
    if config.model.weights is None:
        return variables
    _, ported = efficientnet_v2_pretrained(config.model.name, config.model.weights, input_size=config.model.image_size)
    variables, report = surgery.inherit(ported, variables)
    if jax.process_index() == 0:
        print(f"--weights {Path(config.model.weights).name}: {report}; classifier starts at "
              f"{'zero' if config.model.zero_head else 'random (timm init)'}")
    if not config.model.zero_head:
        return variables
    return {**variables, "params": {**variables["params"],
                                    "classifier": jax.tree.map(jnp.zeros_like, variables["params"]["classifier"])}}


# --------------------------------------------------------------------------- a finished run's checkpoint


def checkpoint_file(path: Path) -> Path:
    """The checkpoint a run folder is read from (its best, else its last); a file as itself."""
    if path.is_dir():
        for name in ("best.msgpack", "last.msgpack"):
            if (path / name).is_file():
                return path / name
        raise checkpoint.CheckpointError(f"{path} holds no best.msgpack or last.msgpack: not a run folder of the kit")
    if not path.is_file():
        raise checkpoint.CheckpointError(f"{path} does not exist")
    return path


def run_config(file: Path) -> TrainConfig:
    """The config of the run that wrote checkpoint ``file`` (its manifest)."""
    manifest_file = checkpoint.manifest_path(file)
    if not manifest_file.is_file():
        raise checkpoint.CheckpointError(f"{file} has no manifest {manifest_file.name} beside it: cannot tell which "
                                         "run wrote it")
    manifest = json.loads(manifest_file.read_text())
    if "config" not in manifest:
        what = manifest.get("model") if isinstance(manifest.get("model"), str) else None
        raise checkpoint.CheckpointError(
            f"{file} is not a checkpoint of a training run" + (f": it holds ported {what} weights (weights_port); "
                                                               f"fine-tune them with train --weights {file}"
                                                               if what else " (its manifest has no 'config')"))
    return TrainConfig.from_dict(manifest["config"], where=f"{manifest_file} config")


def run_variables(file: Path, model: nn.Module, config: TrainConfig) -> dict:
    """The evaluation variables (EMA weights where kept) of checkpoint ``file``, checked leaf by leaf with ``model``."""
    raw = checkpoint.load(file)
    if "state" in raw:  # last.msgpack / ckpt-*.msgpack: the whole training state
        state = raw["state"]
        raw = {"params": state.get("ema_params") or state["params"], "batch_stats": state.get("batch_stats", {})}
    variables = {k: raw[k] for k in ("params", "batch_stats") if k in raw}
    if "classifier" in variables["params"]:  # cut to the classes, padded to this run's --head-multiple (a TPU's 128)
        classes = config.model.num_classes
        width = surgery.padded_width(classes, config.model.head_multiple)
        head = jax.tree.map(lambda v: np.pad(np.asarray(v)[..., :classes], [(0, 0)] * (np.ndim(v) - 1) +
                                             [(0, width - classes)]), variables["params"]["classifier"])
        variables["params"] = {**variables["params"], "classifier": head}
    size = config.model.image_size
    template = abstract_variables(model, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    checkpoint.check_tree(variables, template, what=f"checkpoint {file} for {config.model.name} with "
                                                   f"{config.model.num_classes} classes")
    return jax.tree.map(lambda v, t: np.asarray(v, t.dtype), variables, template)


def check_parent(config: TrainConfig) -> Path | None:
    """The checkpoint ``--init-from`` names, refused (naming both) unless its model and classes are this run's.

    Unlike ``--weights`` (ported weights, a new head) and ``--resume`` (the same run continued): a second stage
    at a larger size, more epochs, a lower rate, another split, the classifier kept."""
    if config.model.init_from is None:
        return None
    try:
        file = checkpoint_file(Path(config.model.init_from))
        parent = run_config(file)
    except checkpoint.CheckpointError as err:
        raise ConfigError(f"--init-from: {err}") from None
    names = (parent.data.class_names, config.data.class_names)
    names = names if all(names) else ((), ())  # compared where both runs name their classes
    for what, theirs, ours in (("--model", parent.model.name, config.model.name), ("class names", *names),
                               ("classes", parent.model.num_classes, config.model.num_classes)):
        if theirs != ours:
            raise ConfigError(f"--init-from {file}: its run trained {what} {theirs}, this run has {ours}; the "
                              "classifier is kept, so both must match (--weights starts a new head)")
    return file


def device_augmentation(config: TrainConfig) -> dict:
    """The train step's ``augment`` (device RandAugment) and ``mix`` (Mixup / CutMix) of a config."""
    data, out = config.data, {}
    if data.augment == "randaugment-device":
        out["augment"] = make_device_augment(RandAugmentConfig(magnitude=data.randaugment_magnitude))
    if data.mixup_alpha > 0 or data.cutmix_alpha > 0:
        # the task has smoothed the targets already; mixing only blends them
        mixing = MixConfig(num_classes=config.model.num_classes, mixup_alpha=data.mixup_alpha,
                           cutmix_alpha=data.cutmix_alpha, prob=data.mix_prob, switch_prob=data.mix_switch_prob,
                           label_smoothing=0.0, multi_label=config.task.task == "multilabel")
        out["mix"] = functools.partial(mix, config=mixing)
    return out


class Training(NamedTuple):
    model: nn.Module
    steps: Steps
    state: TrainState  # on the host (abstract when built from abstract variables)
    schedule: optax.Schedule
    stage_steps: tuple[Steps, ...] = ()  # with --progressive-stages: each stage's steps, in order (the last: steps)


def build_training(config: TrainConfig, plan: Plan, model: nn.Module, variables: dict, *, task: Task | None = None,
                   mesh: jax.sharding.Mesh | None = None, mode: str | None = None,
                   schedule: optax.Schedule | None = None,
                   tx: optax.GradientTransformation | Callable[[optax.Schedule], optax.GradientTransformation] | None
                   = None) -> Training:
    """Task (default the config's), optimizer (frozen parts, lr groups), steps and initial state.

    Abstract ``variables`` (``jax.ShapeDtypeStruct`` leaves) give an abstract state: enough to compile the
    steps (:mod:`.memory_plan`). ``schedule``: the rate by step instead of the plan's (the LR range test's).
    ``tx``: an optax transform instead of the config's optimizer and schedule, or a function of the schedule
    returning one (the history's ``lr`` is then the schedule's); ``--freeze`` and the lr groups still apply.
    """
    optim = config.optim
    if schedule is None:
        schedule = make_schedule(optim.schedule, plan.peak_lr, plan.total_steps, warmup_steps=plan.warmup_steps,
                                 end_factor=optim.end_lr_factor, decay_rate=optim.decay_rate,
                                 decay_steps=round(optim.decay_epochs * plan.steps_per_epoch) if optim.decay_epochs
                                 else None)
    if isinstance(tx, optax.GradientTransformation):
        schedule = None  # the transform's own rate, which the history cannot know
    elif tx is not None:
        tx = tx(schedule)
    frozen = groups = None
    if config.model.freeze:
        try:
            frozen = surgery.freeze_mask(variables["params"], list(config.model.freeze))
        except surgery.SurgeryError as err:
            raise ConfigError(f"--freeze: {err}") from None
    if plan.lr_multipliers is not None:
        groups = assign_lr_groups(variables["params"], model.lr_parts(), layer_decay=config.optim.layer_decay,
                                  head_lr_mult=config.optim.head_lr_mult)
    tx = make_optimizer(schedule, optimizer=tx or optim.optimizer, weight_decay=optim.weight_decay,
                        clip_norm=optim.clip_norm, b1=optim.b1, b2=optim.b2, momentum=optim.momentum,
                        nesterov=optim.nesterov, frozen=frozen, lr_multipliers=groups)
    step_config = StepConfig(num_classes=config.model.num_classes, mean=plan.mean, std=plan.std,
                             task=task or make_task(config), ema_decay=config.optim.ema_decay or 0.999,
                             tta_flip=config.task.tta, accumulate_steps=config.optim.accumulate_steps)

    def steps_of(run_config: TrainConfig) -> Steps:  # the run's steps, or a stage's (its dropout and augmentation)
        rate = run_config.model.drop_rate
        stepped = model if rate == config.model.drop_rate else model.clone(drop_rate=rate)
        trained = surgery.freeze_batchnorm(stepped, list(config.model.freeze)) if config.model.freeze else stepped
        augmented = dataclasses.replace(step_config, **device_augmentation(run_config))
        return make_steps(trained, tx, augmented, mode=mode or config.loop.mode, mesh=mesh)

    steps = steps_of(config)
    state = functools.partial(create_train_state, tx=tx, seed=config.seed, ema=config.optim.ema_decay > 0,
                              loss_scale=Precision(config.model.precision).loss_scaling)
    abstract = any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(variables))
    staged = tuple(steps if stage is plan.stages[-1] else steps_of(stage_config(config, stage))  # the last: the run's
                   for stage in plan.stages)
    return Training(model, steps, jax.eval_shape(state, variables) if abstract else jax.device_get(state(variables)),
                    schedule, staged)


# --------------------------------------------------------------------------- --progressive-stages


def progressive_stages(config: TrainConfig) -> tuple[Stage, ...]:
    """The stages of a config whose image size is resolved; () when off. Refuses, by flag, what cannot be staged.
    The first stage's size: ``--progressive-min-size``, or 128 (at most half the image size, at least 8)."""
    if config.loop.progressive_stages == 0:
        return ()
    size, data, loop = config.model.image_size, config.data, config.loop
    given = loop.progressive_min_size
    min_size = min(DEFAULT_MIN_SIZE, size // 2) if given is None else given
    if given is not None and not SIZE_MULTIPLE <= min_size < size:
        raise ConfigError(f"--progressive-min-size {min_size}: must be at least {SIZE_MULTIPLE} and smaller than "
                          f"--image-size {size} (the last stage's size)")
    if min_size < SIZE_MULTIPLE:
        raise ConfigError(f"--progressive-stages: --image-size {size} is too small to grow into (the stages "
                          f"start at {SIZE_MULTIPLE} px or more); train at {2 * SIZE_MULTIPLE} px or more")
    try:
        return progressive_schedule(loop.progressive_stages, loop.epochs, image_size=size, min_size=min_size,
                                    magnitude=data.randaugment_magnitude, mixup_alpha=data.mixup_alpha,
                                    cutmix_alpha=data.cutmix_alpha, drop_rate=config.model.drop_rate,
                                    schedule_dropout=loop.progressive_dropout, rule=loop.progressive_rule)
    except ValueError as err:  # stages merged into one: every size rounds to the same
        raise ConfigError(f"--progressive-stages {loop.progressive_stages} (--progressive-min-size {min_size}, "
                          f"--image-size {size}): {err}") from None


def stage_config(config: TrainConfig, stage: Stage) -> TrainConfig:
    """``config`` with ``stage``'s training values: what builds that stage's input and train step."""
    return config.replace(image_size=stage.image_size, randaugment_magnitude=stage.magnitude,
                          mixup_alpha=stage.mixup_alpha, cutmix_alpha=stage.cutmix_alpha, drop_rate=stage.drop_rate)


def epoch_config(config: TrainConfig, stages: tuple[Stage, ...], epoch: int) -> TrainConfig:
    """The config that trains ``epoch`` (1-based): its stage's, or ``config`` itself in a run without stages."""
    stage = next((stage for stage in stages if epoch <= stage.last_epoch), None)
    return config if stage is None else stage_config(config, stage)


def describe_stages(config: TrainConfig, stages: tuple[Stage, ...]) -> str:
    """The plan line's part about the stages: epochs and the values that change (those the run uses)."""
    if not stages:
        return ""
    data = config.data
    values = [(name, show) for name, show, used in (
        ("size", lambda s: f"{s.image_size}px", True),
        ("RandAugment magnitude", lambda s: f"m {s.magnitude:.3g}", data.augment != "none"),
        ("mixup alpha", lambda s: f"mixup {s.mixup_alpha:.3g}", data.mixup_alpha > 0),
        ("cutmix alpha", lambda s: f"cutmix {s.cutmix_alpha:.3g}", data.cutmix_alpha > 0),
        ("dropout", lambda s: f"dropout {s.drop_rate:.3g}", config.loop.progressive_dropout)) if used]

    def one(stage: Stage) -> str:
        epochs = f"epoch {stage.first_epoch}" if stage.epochs == 1 else f"epochs {stage.first_epoch}-{stage.last_epoch}"
        return f"{stage.number}: {epochs} at {' '.join(show(stage) for _, show in values)}"

    asked = config.loop.progressive_stages
    merged = f" of {asked} asked, those of one size merged" if asked != len(stages) else ""
    return (f"; progressive learning in {len(stages)} stages{merged} ({config.loop.progressive_rule} rule; "
            f"{', '.join(name for name, _ in values)}; evaluation at {data.eval_image_size or config.model.image_size}"
            "px): " + "; ".join(map(one, stages)))


# --------------------------------------------------------------------------- the run's reading of its splits


def eval_crop(config: TrainConfig, stored_size: int) -> CenterCrop | Resize | None:
    """Evaluation and prediction: a center crop by ``crop_pct``, a resize to the eval size, or as stored."""
    size, pct = config.data.eval_image_size or config.model.image_size, settled(config, "crop_pct")
    if pct is not None:
        return CenterCrop(size, crop_pct=pct)
    return Resize(size) if size != stored_size else None


def train_crop(config: TrainConfig, stored_size: int) -> RandomResizedCrop | Resize | None:
    """Training: RandomResizedCrop (area ``--crop-scale``), the whole image flipped (``flip``), a resize, or as is."""
    size, scale, crop = config.model.image_size, config.data.crop_scale, settled(config, "train_crop")
    if crop != "none":  # flip: the whole (square) image's box
        return RandomResizedCrop(size, **(dict(scale=(1.0, 1.0), ratio=(1.0, 1.0)) if crop == "flip" else
                                          {} if scale == "auto" else {"scale": (scale, 1.0)}))
    return Resize(size) if size != stored_size else None


def train_dataset(config: TrainConfig, plan: Plan, data: RunData, epoch: int) -> HostDataset:
    """This process's training batches for ``epoch``: repeated, shuffled by epoch, cropped, host-augmented (imgaug's
    RandAugment takes the magnitude rounded)."""
    augment, magnitude = config.data.augment, config.data.randaugment_magnitude
    host_augment = (RandAugment(magnitude=magnitude) if augment == "randaugment" else
                    ImgaugRandAugment(m=round(magnitude)) if augment == "imgaug" else None)
    return load_dataset(data.splits["train"], image_size=data.stored_size,
                        batch_size=plan.global_batch // jax.process_count(), training=True,
                        seed=config.seed * 100_003 + epoch, crop=train_crop(config, data.stored_size),
                        augment=host_augment, skip_errors=config.data.skip_errors, select=data.select.get("train"),
                        multi_label_classes=config.model.num_classes if data.multi_label else None,
                        deterministic=config.data.deterministic)


def eval_dataset(config: TrainConfig, data: RunData, split: str, *, batch_size: int,
                 with_records: bool = False) -> HostDataset:
    """A labelled split in order, whole, through the evaluation crop: every evaluation of a run reads it, and a
    CV fold's out-of-fold prediction (``with_records``: each row's ``file#index``)."""
    return load_dataset(data.splits[split], image_size=data.stored_size, batch_size=batch_size,
                        crop=eval_crop(config, data.stored_size),
                        skip_errors=config.data.skip_errors, select=data.select.get(split), with_records=with_records,
                        multi_label_classes=config.model.num_classes if data.multi_label else None)


def val_dataset(config: TrainConfig, plan: Plan, data: RunData) -> HostDataset:
    """The validation split as every evaluation of the run reads it."""
    return eval_dataset(config, data, "val", batch_size=plan.global_batch)


def model_size(config: TrainConfig, model: nn.Module, variables: dict) -> dict:
    """Parameters (trainable and ``--freeze``-frozen) and GFLOPs of one image's evaluation forward at the run's
    size, as XLA's cost analysis of the lowered forward counts them (None where the backend gives no count)."""
    table = surgery.param_table(variables, frozen=list(config.model.freeze) or None)
    size = config.model.image_size
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), variables)
    try:
        flops = surgery.count_flops(model, shapes, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    except VariableTreeError:
        flops = None
    return {"params_trainable": table.trainable, "params_frozen": table.frozen,
            "gflops_per_image": None if flops is None else round(flops / 1e9, 4)}

