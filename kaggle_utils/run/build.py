"""A resolved run's pieces: model, initial variables, task, optimizer, steps, state; and its loop."""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..config import ConfigError, TrainConfig
from ..precision import Precision
from .data import RunData
from .stages import epoch_config, stage_steps

# ``Plan`` in the annotations is kaggle_utils.run.resolve.Plan, not imported: resolve imports this module (the
# largest batch that fits, kaggle_utils.run.memory_plan, compiles the step built here).


def make_task(config: TrainConfig):
    from ..train import make_task as make

    return make(config.task.task, label_smoothing=config.task.label_smoothing, focal_gamma=config.task.focal_gamma,
                threshold=config.task.threshold)


def run_manifest(config: TrainConfig, plan: Plan) -> dict:
    """What every checkpoint of a run carries: enough for :func:`load_run` to rebuild its model."""
    return {"kind": "kaggle_utils run", "config": config.to_dict(), "plan": dataclasses.asdict(plan)}


def build_model(config: TrainConfig):
    """The module a run trains: the variant with a classifier of ``head_width`` outputs."""
    from ..efficientnet import create_model
    from ..surgery import padded_width
    from ..train import AXIS

    model = config.model
    return create_model(model.name, num_classes=padded_width(model.num_classes, model.head_multiple or 1),
                        dtype=Precision(model.precision).compute_dtype, drop_rate=model.drop_rate,
                        drop_path_rate=model.drop_path_rate,
                        bn_axis_name=AXIS if model.sync_bn else None, remat=model.remat == "blocks")


def initial_variables(config: TrainConfig, model) -> dict:
    """Random init, or ported weights for the backbone with a zero classifier.

    A zero head outputs equal logits, so the first loss is ln C and the first gradients reach
    the head only: timm's U(±1/sqrt(fan_out)) init, sized for 1000 outputs, gives a few
    classes large random logits that the pretrained features then spend steps unlearning.
    """
    from ..train import init_variables

    variables = init_variables(model, config.model.image_size, seed=config.seed)
    if config.model.weights is None:
        return variables
    from .. import surgery
    from ..efficientnet import efficientnet_v2_pretrained

    _, ported = efficientnet_v2_pretrained(config.model.name, config.model.weights,
                                           input_size=config.model.image_size)
    variables, report = surgery.inherit(ported, variables)
    params = dict(variables["params"])
    params["classifier"] = jax.tree.map(jnp.zeros_like, params["classifier"])
    if jax.process_index() == 0:
        print(f"--weights {Path(config.model.weights).name}: {report}; classifier starts at zero")
    return {**variables, "params": params}


def device_augmentation(config: TrainConfig) -> dict:
    """The train step's ``augment`` (device RandAugment) and ``mix`` (Mixup / CutMix) of a config."""
    from ..device_augment import MixConfig, RandAugmentConfig, make_device_augment, mix

    data = config.data
    out = {}
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
    model: object
    steps: object  # kaggle_utils.train.Steps
    state: object  # host TrainState
    schedule: object
    stage_steps: tuple = ()  # with --progressive-stages: each stage's compiled steps, in order (the last: steps)


def build_training(config: TrainConfig, plan: Plan, model, variables, *, task=None, mesh=None,
                   mode: str | None = None, schedule=None) -> Training:
    """Task (``task``, default the config's), optimizer (frozen parts), steps and initial state of a resolved config.

    ``variables`` may be abstract (``jax.ShapeDtypeStruct`` leaves, ``variable_trees.abstract_variables``):
    the state is then abstract too, enough to compile the steps without initialising anything
    (:mod:`kaggle_utils.run.memory_plan`). ``mode`` (default the config's) and ``mesh`` as for ``make_steps``.
    ``schedule``: the learning rate by step instead of the plan's warmup and cosine (the LR range test's sweep).
    """
    from .. import surgery
    from ..train import StepConfig, assign_lr_groups, create_train_state, make_optimizer, make_steps, warmup_cosine

    if schedule is None:
        schedule = warmup_cosine(plan.peak_lr, plan.total_steps, warmup_steps=plan.warmup_steps)
    frozen = None
    if config.model.freeze:
        try:
            frozen = surgery.freeze_mask(variables["params"], list(config.model.freeze))
        except surgery.SurgeryError as err:
            raise ConfigError(f"--freeze: {err}") from None
    groups = None
    if plan.lr_multipliers is not None:
        groups = assign_lr_groups(variables["params"], layer_decay=config.optim.layer_decay,
                                  head_lr_mult=config.optim.head_lr_mult)
    tx = make_optimizer(schedule, weight_decay=config.optim.weight_decay, clip_norm=config.optim.clip_norm,
                        frozen=frozen, lr_multipliers=groups)
    step_config = StepConfig(num_classes=config.model.num_classes, mean=plan.mean, std=plan.std,
                             task=task or make_task(config), ema_decay=config.optim.ema_decay or 0.999,
                             tta_flip=config.task.tta, accumulate_steps=config.optim.accumulate_steps)

    def steps_of(run_config: TrainConfig):  # the run's steps, or a stage's (its dropout, augmentation and mixing)
        rate = run_config.model.drop_rate
        stepped = model if rate == config.model.drop_rate else model.clone(drop_rate=rate)
        trained = surgery.freeze_batchnorm(stepped, list(config.model.freeze)) if config.model.freeze else stepped
        augmented = dataclasses.replace(step_config, **device_augmentation(run_config))
        return make_steps(trained, tx, augmented, mode=mode or config.loop.mode, mesh=mesh)

    steps = steps_of(config)
    state = functools.partial(create_train_state, tx=tx, seed=config.seed, ema=config.optim.ema_decay > 0,
                              loss_scale=Precision(config.model.precision).loss_scaling)
    abstract = any(isinstance(leaf, jax.ShapeDtypeStruct) for leaf in jax.tree.leaves(variables))
    return Training(model, steps, jax.eval_shape(state, variables) if abstract else jax.device_get(state(variables)),
                    schedule, stage_steps(config, plan.stages, steps, steps_of))


def host_augment(config: TrainConfig):
    """The input pipeline's augmentation at ``--randaugment-magnitude`` (None: there is none, or it runs on the device).

    imgaug's RandAugment takes an integer magnitude: the flag's value, rounded.
    """
    from ..data import ImgaugRandAugment, RandAugment

    augment, magnitude = config.data.augment, config.data.randaugment_magnitude
    if augment == "randaugment":
        return RandAugment(magnitude=magnitude)
    return ImgaugRandAugment(m=round(magnitude)) if augment == "imgaug" else None


def train_transform(config: TrainConfig, stored_size: int):
    """The training crop of images stored at ``stored_size`` (None: as stored)."""
    from ..data import RandomResizedCrop, Resize

    size = config.model.image_size
    if config.data.train_crop == "random-resized":
        return RandomResizedCrop(size)
    return Resize(size) if size != stored_size else None


def eval_transform(config: TrainConfig, stored_size: int):
    """Evaluation and prediction: a center crop by ``crop_pct``, a resize to the eval size, or as stored."""
    from ..data import CenterCrop, Resize

    size = config.data.eval_image_size or config.model.image_size
    if config.data.crop_pct is not None:
        return CenterCrop(size, crop_pct=config.data.crop_pct)
    return Resize(size) if size != stored_size else None


def multi_label_classes(config: TrainConfig, data: RunData) -> int | None:
    """The width of the multi-hot label rows a run on ``data`` reads (its classes), or None: integer labels."""
    return config.model.num_classes if data.multi_label else None


def train_dataset(config: TrainConfig, plan: Plan, data: RunData, epoch: int):
    """This process's training batches for ``epoch`` (repeated, host-augmented), as :func:`fit_run` reads them."""
    from ..data import load_dataset

    return load_dataset(data.splits["train"], image_size=data.stored_size,
                        batch_size=plan.global_batch // jax.process_count(), training=True,
                        seed=config.seed * 100_003 + epoch, crop=train_transform(config, data.stored_size),
                        augment=host_augment(config), skip_errors=config.data.skip_errors,
                        select=data.selected("train"), multi_label_classes=multi_label_classes(config, data),
                        deterministic=config.data.deterministic)


def val_dataset(config: TrainConfig, plan: Plan, data: RunData):
    """The validation split in order, whole, through the run's evaluation crop: what every evaluation of a run reads."""
    from ..data import load_dataset

    return load_dataset(data.splits["val"], image_size=data.stored_size, batch_size=plan.global_batch,
                        skip_errors=config.data.skip_errors, crop=eval_transform(config, data.stored_size),
                        select=data.selected("val"), multi_label_classes=multi_label_classes(config, data))


def fit_settings(config: TrainConfig, plan: Plan):
    """The loop's settings of a resolved config: its intervals, monitor and length on this machine."""
    from ..train import FitSettings

    loop = config.loop
    return FitSettings(steps_per_epoch=plan.steps_per_epoch, total_steps=plan.total_steps, log_every=loop.log_every,
                       eval_every=loop.eval_every, checkpoint_every=loop.checkpoint_every,
                       keep=loop.keep_checkpoints, monitor=loop.monitor, monitor_mode=loop.monitor_mode,
                       min_delta=loop.min_delta, patience=loop.patience)


def open_writers(config: TrainConfig, out_dir: str | Path) -> list:
    """The writers ``config`` asks for (process 0): TensorBoard in ``out_dir/tensorboard`` with the flags as its
    HParams, W&B (``--wandb``); the caller closes them (W&B then uploads the run folder's pictures and tables)."""
    from ..train import TensorBoardWriter, WandbWriter

    loop, writers = config.loop, []
    if jax.process_index() == 0 and loop.tensorboard:
        writers.append(TensorBoardWriter(Path(out_dir) / "tensorboard", hparams=config.flat()))
    if jax.process_index() == 0 and loop.wandb:
        writers.append(WandbWriter(out_dir, project=loop.wandb, config=config.flat(), artifact=loop.wandb_artifact))
    return writers


def model_size(config: TrainConfig, model, variables) -> dict:
    """Parameters (trainable and ``--freeze``-frozen) and GFLOPs of one image's evaluation forward at the run's
    size, as XLA's cost analysis of the lowered forward counts them (None where the backend gives no count)."""
    from ..surgery import count_flops, param_table
    from ..variable_trees import VariableTreeError

    table = param_table(variables, frozen=list(config.model.freeze) or None)
    size = config.model.image_size
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), variables)
    try:
        flops = count_flops(model, shapes, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    except VariableTreeError:
        flops = None
    return {"params_trainable": table.trainable, "params_frozen": table.frozen,
            "gflops_per_image": None if flops is None else round(flops / 1e9, 4)}


def fit_run(config: TrainConfig, plan: Plan, data: RunData, training: Training, out_dir: str | Path | None, *,
            resume: bool = False, progress: bool = True, hooks=(), writers=()):
    """The loop over ``data`` with the config's settings, ``writers`` (:func:`open_writers`) and files in ``out_dir``."""
    from ..train import fit

    def train_batches(epoch):  # with --progressive-stages: at the epoch's stage's size and augmentation
        dataset = train_dataset(epoch_config(config, plan.stages, epoch), plan, data, epoch)
        try:
            yield from dataset
        finally:
            dataset.close()

    val = val_dataset(config, plan, data)
    return fit(training.steps, training.state, train_batches, fit_settings(config, plan),
               val_batches=lambda: iter(val), out_dir=out_dir, lr_schedule=training.schedule, hooks=hooks,
               writers=writers, resume=resume, manifest=run_manifest(config, plan), progress=progress,
               report={"model": plan.model_size} if plan.model_size else None,
               stages=tuple(zip(plan.stages, training.stage_steps)))
