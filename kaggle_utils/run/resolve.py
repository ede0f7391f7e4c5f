"""What a config leaves open, filled in for this machine and this data; the numbers it implies.

``None`` in a config always means "the default" and a value the user gave is used or refused
(named by its flag), never silently replaced.
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax

from .. import runtime
from ..precision import Precision, choose_precision
from ..config import ConfigError, DataConfig, TrainConfig, flag_of
from .build import make_task, run_manifest  # noqa: F401 (kept importable from here)
from .data import RunData
from .stages import check_progressive_flags, describe_stages, progressive_stages

# AdamW peak per 256 images. A short fine-tune of pretrained weights trains best at the from-scratch rate
# too: 2e-3 under-trained every set of bench/README.md's "Learning rate of a short fine-tune"
SCRATCH_LR, FINETUNE_LR = 1e-2, 1e-2
MIN_LR_FIND_STEPS = 10  # fewer points than this make no curve to read a rate from


@dataclasses.dataclass(frozen=True)
class Plan:
    """The numbers a resolved config implies on this machine; printed at start, kept in config.json."""

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
    stages: tuple = ()  # --progressive-stages: kaggle_utils.train.progressive.Stage of each stage, in order
    model_size: dict | None = None  # parameters and GFLOPs per image (run.build.model_size), once the model is built

    def describe(self, config: TrainConfig) -> str:
        from ..train import describe_lr_groups

        found = math.isfinite(self.peak_lr)  # NaN: --lr auto, before the range test
        groups = f"; {describe_lr_groups(self.peak_lr, self.lr_multipliers)}" if self.lr_multipliers and found else ""
        k = config.optim.accumulate_steps
        pieces = f" in {k} micro-batches of {self.per_device_batch // k}" if k > 1 else ""
        return (f"global batch {self.global_batch} = {self.per_device_batch} per device{pieces} x {self.device_count} "
                f"device(s); peak learning rate {_lr_text(self.peak_lr, config.optim.lr)}{groups}; "
                f"{self.total_steps} steps ({self.steps_per_epoch} per epoch, warmup {self.warmup_steps}); "
                f"{config.model.name} at {config.model.image_size}px{_size_text(self.model_size)}, "
                f"{config.model.num_classes} classes; "
                f"{Precision(config.model.precision).describe()} ({self.precision_reason})"
                f"{describe_stages(config, self.stages)}"
                + (f"; {self.batch_fit}" if self.batch_fit else ""))


def _size_text(size: dict | None) -> str:
    if not size:
        return ""

    def count(n: int) -> str:
        return f"{n / 1e6:.1f} M" if n >= 1e6 else f"{n:,}"

    frozen = f", {count(size['params_frozen'])} frozen" if size["params_frozen"] else ""
    flops = f", {size['gflops_per_image']:.3g} GFLOPs per image" if size["gflops_per_image"] is not None else ""
    return f" ({count(size['params_trainable'] + size['params_frozen'])} parameters{frozen}{flops})"


def _lr_text(peak_lr: float, lr: float | str) -> str:
    if lr == "auto":
        return "auto (the LR range test finds it)"
    return f"{peak_lr:.3g} ({lr:g} per 256 images)"


def global_batch(config: TrainConfig) -> int:
    n = jax.device_count()
    data = config.data
    if data.batch_size is not None and data.batch_per_device is not None:
        raise ConfigError("--batch-size (global) and --batch-per-device exclude each other: give one")
    if data.batch_per_device == "auto":
        raise ConfigError("--batch-per-device auto is chosen by run.resolve (it compiles the train step); "
                          "global_batch needs a number")
    if isinstance(data.batch_per_device, str):
        raise ConfigError(f"--batch-per-device {data.batch_per_device!r}: must be a number or auto")
    size = data.batch_per_device * n if data.batch_per_device is not None else data.batch_size
    size = runtime.global_batch(n) if size is None else size
    flag = "--batch-per-device" if data.batch_per_device is not None else "--batch-size"
    if size < 1 or size % n or size % jax.process_count():
        raise ConfigError(f"{flag} gives a global batch of {size}, which must be a positive multiple of the {n} "
                          f"devices ({jax.local_device_count()} per process x {jax.process_count()} process(es)), "
                          f"e.g. {runtime.global_batch(n)}")
    return size


def _check_values(config: TrainConfig) -> None:
    """Values no run can use, named by flag; ``None`` always means "the default", never a given 0."""
    positive = {"epochs": config.loop.epochs, "steps": config.loop.steps,
                "steps_per_epoch": config.loop.steps_per_epoch, "eval_every": config.loop.eval_every,
                "checkpoint_every": config.loop.checkpoint_every, "keep_checkpoints": config.loop.keep_checkpoints,
                "log_every": config.loop.log_every, "patience": config.loop.patience,
                "num_classes": config.model.num_classes, "image_size": config.model.image_size,
                "head_multiple": config.model.head_multiple, "accumulate_steps": config.optim.accumulate_steps}
    for name, value in positive.items():
        if value is not None and value < 1:
            raise ConfigError(f"{flag_of(name)} {value}: must be at least 1")
    lr = config.optim.lr
    if isinstance(lr, str) and lr != "auto" or isinstance(lr, bool):
        raise ConfigError(f"--lr {lr!r}: must be a finite number > 0 (per 256 images) or 'auto'")
    steps = config.optim.lr_find_steps
    if steps is not None and steps < MIN_LR_FIND_STEPS:
        raise ConfigError(f"--lr-find-steps {steps}: must be at least {MIN_LR_FIND_STEPS} (the range test's curve)")
    for name, value in {"lr": None if lr == "auto" else lr, "clip_norm": config.optim.clip_norm,
                        "memory_budget": config.data.memory_budget}.items():
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{flag_of(name)} {value}: must be a finite number > 0")
    for name, value, low, high in (("label_smoothing", config.task.label_smoothing, 0, 1),
                                   ("drop_rate", config.model.drop_rate, 0, 1),
                                   ("drop_path_rate", config.model.drop_path_rate, 0, 1),
                                   ("ema_decay", config.optim.ema_decay, 0, 1),
                                   ("warmup_max_fraction", config.optim.warmup_max_fraction, 0, 1)):
        if not low <= value < high:
            raise ConfigError(f"{flag_of(name)} {value}: must be in [{low}, {high})")
    if not 0 <= config.data.randaugment_magnitude <= 30:
        raise ConfigError(f"--randaugment-magnitude {config.data.randaugment_magnitude}: must be in [0, 30] (imgaug's "
                          "scale)")
    if config.data.augment == "none" and config.data.randaugment_magnitude != DataConfig.randaugment_magnitude:
        raise ConfigError("--randaugment-magnitude needs --augment randaugment, imgaug or randaugment-device: with "
                          "--augment none nothing would use it")
    if config.optim.weight_decay < 0 or config.optim.warmup_epochs < 0:
        raise ConfigError("--weight-decay and --warmup-epochs must be >= 0")
    for name in ("mixup_alpha", "cutmix_alpha"):
        if getattr(config.data, name) < 0:
            raise ConfigError(f"{flag_of(name)} {getattr(config.data, name)}: must be >= 0 (0: off)")
    for name in ("mix_prob", "mix_switch_prob"):
        if not 0 <= getattr(config.data, name) <= 1:
            raise ConfigError(f"{flag_of(name)} {getattr(config.data, name)}: must be in [0, 1]")
    if not 0 < config.data.val_fraction < 1:
        raise ConfigError(f"--val-fraction {config.data.val_fraction}: must be in (0, 1)")
    repeated = sorted({name for name in config.data.class_names if config.data.class_names.count(name) > 1})
    if repeated:
        raise ConfigError(f"--class-names repeats {', '.join(map(repr, repeated))}: the submission could not tell "
                          "those classes apart; give each class its own name")
    from ..train import check_lr_group_values

    check_lr_group_values(config.optim.layer_decay, config.optim.head_lr_mult)
    if config.model.freeze and not config.model.weights:
        raise ConfigError("--freeze needs --weights (freezing a randomly initialised network is a mistake)")
    if config.model.weights:
        from .. import checkpoint

        try:
            checkpoint.check_format(config.model.weights)
            checkpoint.check_digest(config.model.weights)
        except checkpoint.CheckpointError as err:
            raise ConfigError(f"--weights: {err}") from None
    from ..efficientnet import resolve_name

    try:
        resolve_name(config.model.name)
    except ValueError as err:
        raise ConfigError(f"--model: {err}") from None


def check_config(config: TrainConfig, task=None) -> None:
    """Every check that needs no data: values, model name, monitor against the metrics of ``task``.

    ``task`` (default: the config's) may be a user's task with metrics of its own, which are
    then as good a ``--monitor`` as the built-in ones.
    """
    from ..train import history_columns

    _check_values(config)
    check_progressive_flags(config)
    task = task or make_task(config)
    columns = history_columns(task)
    if config.loop.monitor not in columns:
        raise ConfigError(f"--monitor {config.loop.monitor!r} is not a metric of --task {config.task.task}; "
                          f"choose one of {', '.join(c for c in columns[2:] if c not in ('img_per_s', 'seconds'))}")
    _check_monitor_mode(config)
    if not 0 < config.task.threshold < 1:
        raise ConfigError(f"--threshold {config.task.threshold}: must be in (0, 1)")
    if config.loop.wandb:
        from ..train.writers import import_wandb

        import_wandb()  # a missing package is named before the output folder changes


def _check_monitor_mode(config: TrainConfig) -> None:
    """A built-in metric's direction is known: the opposite --monitor-mode would keep the worst epoch.

    A user's metric may go either way, so only the config's own task's columns are checked.
    """
    from ..train import Task, history_columns

    monitor, mode = config.loop.monitor, config.loop.monitor_mode
    if mode == "auto" or monitor not in history_columns(make_task(config)) or Task.monitor_mode(monitor) == mode:
        return
    better = "lower" if Task.monitor_mode(monitor) == "min" else "higher"
    raise ConfigError(f"--monitor {monitor} --monitor-mode {mode}: {better} {monitor} is better, so {mode} would keep "
                      f"the worst epoch; use --monitor-mode {Task.monitor_mode(monitor)} (or auto)")


def resolve(config: TrainConfig, data: RunData, task=None) -> tuple[TrainConfig, Plan]:
    """``config`` with nothing left open for this machine and data, and the numbers it implies.

    ``--batch-per-device auto`` becomes the largest batch whose compiled train step fits the
    device (:mod:`kaggle_utils.run.memory_plan`; the plan says how it was found). The resolved
    config records it as the global ``batch_size``, so a resumed run keeps it.
    """
    if config.data.batch_per_device != "auto":
        if config.data.memory_budget is not None:
            raise ConfigError(f"--memory-budget {config.data.memory_budget:g} is read only with --batch-per-device "
                              "auto: give both, or neither")
        return _resolve(config, data, task)
    from .memory_plan import fit_batch

    k = config.optim.accumulate_steps
    provisional, plan = _resolve(config.replace(batch_per_device=k), data, task)  # the step's shapes but the batch
    fit = fit_batch(provisional, plan, task=task, per_device_limit=data.num_train // jax.device_count())
    config, plan = _resolve(config.replace(batch_per_device=fit.per_device), data, task)
    return config, dataclasses.replace(plan, batch_fit=fit.describe())


def _resolve(config: TrainConfig, data: RunData, task=None) -> tuple[TrainConfig, Plan]:
    from ..efficientnet import pretrained_cfg
    from ..surgery import padded_width

    check_config(config, task)
    image_size = config.model.image_size or data.stored_size
    if config.data.crop_pct is not None and not 0 < config.data.crop_pct <= 1:
        raise ConfigError(f"--crop-pct {config.data.crop_pct}: must be in (0, 1]")
    platform = runtime.current_platform()
    precision, precision_reason = choose_precision(config.model.precision)
    if data.class_names and len(data.class_names) <= data.max_label:
        raise ConfigError(f"--class-names names {len(data.class_names)} classes but the data holds label "
                          f"{data.max_label}")
    config = config.replace(
        data_dir=data.description, class_names=data.class_names, id_column=data.columns[0],
        label_column=data.columns[1], num_classes=config.model.num_classes or data.max_label + 1,
        image_size=image_size, precision=precision.name, batch_size=global_batch(config),
        batch_per_device=None, lr=config.optim.lr or (FINETUNE_LR if config.model.weights else SCRATCH_LR),
        head_multiple=config.model.head_multiple or (128 if platform == "tpu" else 1),
        weights=str(Path(config.model.weights).resolve()) if config.model.weights else None)
    batch = config.data.batch_size
    per_device, k = batch // jax.device_count(), config.optim.accumulate_steps
    if per_device % k:
        raise ConfigError(f"--accumulate-steps {k} does not divide the {per_device} images per device of the global "
                          f"batch {batch}: choose a divisor, or another batch")
    steps_per_epoch = config.loop.steps_per_epoch or data.num_train // batch
    if steps_per_epoch < 1:
        raise ConfigError(f"--batch-size {batch} is larger than the {data.num_train} training examples")
    total = config.loop.steps or config.loop.epochs * steps_per_epoch
    warmup = min(round(config.optim.warmup_epochs * steps_per_epoch), int(config.optim.warmup_max_fraction * total))
    cfg = pretrained_cfg(config.model.name)
    from ..train import scaled_lr

    plan = Plan(device_count=jax.device_count(), global_batch=batch, per_device_batch=batch // jax.device_count(),
                steps_per_epoch=steps_per_epoch, total_steps=total, warmup_steps=warmup,
                peak_lr=math.nan if config.optim.lr == "auto" else scaled_lr(config.optim.lr, batch),
                head_width=padded_width(config.model.num_classes, config.model.head_multiple),
                mean=tuple(cfg["mean"]), std=tuple(cfg["std"]), lr_multipliers=_lr_multipliers(config),
                precision_reason=precision_reason, stages=progressive_stages(config))
    return config, plan


def _lr_multipliers(config: TrainConfig) -> dict[str, float] | None:
    """Each part's lr multiplier, or None where the whole network learns at one rate."""
    from ..efficientnet import create_model
    from ..train import group_multipliers

    optim = config.optim
    if optim.layer_decay is None and optim.head_lr_mult == 1.0:
        return None
    stages = len(create_model(config.model.name).stages)
    return group_multipliers(stages, layer_decay=optim.layer_decay, head_lr_mult=optim.head_lr_mult)
