"""What a resolved run is built from and of: its :class:`Plan`; model, variables (a finished run's read back by
:mod:`.saved`), optimizer, steps, state; datasets.

A progressive run's stage (``--progressive-stages``; the numbers are :mod:`kaggle_utils.train.progressive`'s) is the
run's config with that stage's image size, RandAugment magnitude, Mixup / CutMix alphas and dropout, so what builds
a run's input and step from a config builds a stage's unchanged, for every data route and for ``cv``.
"""
import dataclasses
import functools
import math
from pathlib import Path
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from .. import checkpoint, models, surgery
from ..config import RANDAUGMENT_ROUTES, ConfigError, TrainConfig
from ..data import (CenterCrop, ColorJitter, HostDataset, ImgaugRandAugment, RandAugment, RandomResizedCrop, Resize,
                    load_dataset)
from ..device_augment import MixConfig, RandAugmentConfig, make_device_augment, mix
from ..efficientnet import efficientnet_v2_pretrained
from ..precision import Precision
from ..variable_trees import VariableTreeError
from ..registry import TRAIN_CROPS
from ..train import (AXIS, StepConfig, Steps, Task, TrainState, assign_lr_groups, describe_lr_groups, init_variables,
                     make_optimizer, make_schedule, make_steps, make_task)
from ..train.progressive import SIZE_MULTIPLE, Stage, progressive_schedule
from .data import RunData
from .defaults import settled
from .saved import check_parent, run_variables

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


def build_model(config: TrainConfig) -> nn.Module:
    """The module a run trains: the registered model (:mod:`kaggle_utils.models`) with ``head_width`` outputs."""
    model = config.model
    return models.build_model(model.name, num_classes=surgery.padded_width(model.num_classes, model.head_multiple or 1),
                              dtype=Precision(model.precision).compute_dtype, drop_rate=model.drop_rate,
                              drop_path_rate=model.drop_path_rate, bn_axis_name=AXIS if model.sync_bn else None,
                              remat=model.remat == "blocks")


def initial_variables(config: TrainConfig, model: nn.Module, *, pretrained: dict | None = None) -> dict:
    """Random init, ``--init-from``'s run's weights, pretrained variables, or ``--weights``: an EfficientNet's ported
    backbone, any other model's own saved variables, with a zero classifier: equal logits, so the first loss is ln C
    (timm's init, sized for 1000 outputs, gives a few classes large logits the features must unlearn;
    ``--no-zero-head`` keeps it). ``pretrained`` (``run.train(variables=...)``): every leaf whose path and shape fit
    is taken, classifier included; the others stay at their init."""
    if config.model.init_from:  # classifier included
        file = check_parent(config)
        if jax.process_index() == 0:
            print(f"--init-from {file}: {config.model.name}, {config.model.num_classes} classes, classifier kept")
        return run_variables(file, model, config)
    variables = init_variables(model, config.model.image_size, seed=config.seed)
    weights = config.model.weights
    if pretrained is None and weights is None:
        return variables
    if pretrained is None and models.registered(config.model.name).efficientnet:
        _, pretrained = efficientnet_v2_pretrained(config.model.name, weights, input_size=config.model.image_size)
    elif pretrained is None:  # another model's own variables (checkpoint.save of them; its manifest checked)
        pretrained = checkpoint.load(weights)
    variables, report = surgery.inherit(pretrained, variables)
    head = "classifier" in variables["params"]
    if jax.process_index() == 0:
        where = f"--weights {Path(weights).name}" if weights else "run.train(variables=...)"
        start = ("kept where it fits" if not weights else "zero" if config.model.zero_head and head else
                 "random (its init)")
        print(f"{where}: {report}; classifier {start}")
    if not (weights and config.model.zero_head and head):
        return variables
    return {**variables, "params": {**variables["params"],
                                    "classifier": jax.tree.map(jnp.zeros_like, variables["params"]["classifier"])}}


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
        schedule = make_schedule(optim, plan.peak_lr, plan.total_steps, warmup_steps=plan.warmup_steps,
                                 steps_per_epoch=plan.steps_per_epoch)
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
        groups = assign_lr_groups(variables["params"], model.lr_parts(), layer_decay=optim.layer_decay,
                                  head_lr_mult=optim.head_lr_mult)
    tx = make_optimizer(schedule, optim, tx=tx, frozen=frozen, lr_multipliers=groups)
    step_config = StepConfig(num_classes=config.model.num_classes, mean=plan.mean, std=plan.std,
                             task=task or make_task(config.task), optim=optim, tta_flip=config.task.tta)

    def steps_of(run_config: TrainConfig) -> Steps:  # the run's steps, or a stage's (its dropout and augmentation)
        rate = run_config.model.drop_rate
        stepped = model if rate == config.model.drop_rate else model.clone(drop_rate=rate)
        trained = surgery.freeze_batchnorm(stepped, list(config.model.freeze)) if config.model.freeze else stepped
        augmented = dataclasses.replace(step_config, **device_augmentation(run_config))
        return make_steps(trained, tx, augmented, mode=mode or config.loop.mode, mesh=mesh)

    steps = steps_of(config)
    state = functools.partial(steps.init_state, seed=config.seed,
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
        ("RandAugment magnitude", lambda s: f"m {s.magnitude:.3g}", data.augment in RANDAUGMENT_ROUTES),
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
        return CenterCrop(size, crop_pct=pct, interpolation=config.data.interpolation)
    return Resize(size, config.data.interpolation) if size != stored_size else None


def train_crop(config: TrainConfig, stored_size: int) -> RandomResizedCrop | Resize | None:
    """Training: ``--train-crop``'s (:data:`~kaggle_utils.registry.TRAIN_CROPS`, ``auto`` settled from the data by
    run.resolve): timm's RandomResizedCrop (area ``--crop-scale``), the whole image flipped half the time (``flip``),
    a resize, or as stored."""
    return TRAIN_CROPS[settled(config, "train_crop")].build(config.model.image_size, stored_size,
                                                            config.data.crop_scale, config.data.interpolation)


def train_dataset(config: TrainConfig, plan: Plan, data: RunData, epoch: int) -> HostDataset:
    """This process's training batches for ``epoch``: repeated, shuffled by epoch, cropped, host-augmented (imgaug's
    RandAugment takes the magnitude rounded; colour jitter its strength)."""
    augment, magnitude = config.data.augment, config.data.randaugment_magnitude
    host_augment = (RandAugment(magnitude=magnitude) if augment == "randaugment" else
                    ImgaugRandAugment(m=round(magnitude)) if augment == "imgaug" else
                    ColorJitter(config.data.color_jitter) if augment == "color-jitter" else None)
    return load_dataset(data.splits["train"], image_size=data.stored_size,
                        batch_size=plan.global_batch // jax.process_count(), training=True,
                        seed=config.seed * 100_003 + epoch, crop=train_crop(config, data.stored_size),
                        augment=host_augment, skip_errors=config.data.skip_errors, select=data.select.get("train"),
                        fields=data.fields, multi_label_classes=config.model.num_classes if data.multi_label else None,
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

