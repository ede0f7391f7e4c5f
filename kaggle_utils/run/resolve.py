"""What a config leaves open, filled in for this machine and this data, and every check that needs no data.

``resolve`` turns a config into the one a run records (classes, image size, precision, global batch, the crops
and multi-label settings chosen from the data: :mod:`.defaults`) and the :class:`~kaggle_utils.run.build.Plan` of
numbers it implies (steps, warmup, peak learning rate, lr groups, stages); ``--batch-per-device auto`` compiles the
run's train step to find its batch (:mod:`.memory_plan`). A value that cannot run is refused by its flag, never
silently replaced.
"""
import dataclasses
import json
import math
from pathlib import Path

import jax

from .. import checkpoint, models, runtime
from ..config import ConfigError, DataConfig, TrainConfig
from ..precision import choose_precision
from ..surgery import padded_width
from ..registry import TASKS
from ..train import Task, group_multipliers, history_columns, make_task, scaled_lr
from ..train.optim import default_lr, default_weight_decay
from ..train.tasks import AUTO_THRESHOLD
from ..train.writers import import_wandb
from . import memory_plan
from .build import Plan, build_model, progressive_stages
from .data import RunData
from .defaults import settle_data_defaults
from .saved import check_parent

# a task's attribute -> the task section's field it is set from (what a given task overrides in the record)
_TASK_FIELDS = {"label_smoothing": "label_smoothing", "gamma": "focal_gamma", "threshold": "threshold"}


def run_task(config: TrainConfig, task: Task | None = None) -> tuple[TrainConfig, Task]:
    """The task a run trains, built once: ``task`` (``run.train(task=...)``) or the config's, learning from the
    ``--teacher``'s field where one is given; and the config saying what it trains with. A given task's own values
    (label smoothing, focal gamma, threshold; its built-in name) are recorded in place of the defaults; one that
    contradicts a value the config changed is refused, naming both."""
    config, task = _reconciled(config, task)
    teacher = config.distill
    return config, task.with_teacher(teacher.distill_alpha, teacher.distill_temperature) if teacher.teacher else task


def _reconciled(config: TrainConfig, task: Task | None) -> tuple[TrainConfig, Task]:
    if task is None:
        return config, make_task(config.task)
    default, changes = type(config.task)(), {}
    for attribute, field in _TASK_FIELDS.items():
        if not hasattr(task, attribute):
            continue
        given, used = getattr(config.task, field), getattr(task, attribute)
        if field == "threshold" and given == "auto" and used == AUTO_THRESHOLD:
            continue  # what --threshold auto trains with: its per-class thresholds are still learnt after training
        if given != getattr(default, field) and given != used:
            raise ConfigError(f"--{field.replace('_', '-')} {given} and the task given to run.train "
                              f"({type(task).__name__}, {attribute} {used}) disagree: give one of them")
        changes[field] = used
    name = next((name for name in TASKS if type(make_task(name)) is type(task)), None)  # a built-in task's name
    if name is not None and name != config.task.task:
        if config.task.task != default.task:
            raise ConfigError(f"--task {config.task.task} and the task given to run.train ({type(task).__name__}, "
                              f"--task {name}) disagree: give one of them")
        changes["task"] = name
    return config.replace(**changes), task


def check_config(config: TrainConfig, task: Task | None = None) -> None:
    """Every check that needs no data, once per run before anything is read: each section's values and choices
    (:meth:`TrainConfig.check`), the model, the weights, the monitor (a metric of ``task``, default the config's: a
    user's task's metrics are as good a ``--monitor``). :func:`resolve` takes the config checked."""
    config.check()
    if config.model.weights:
        try:
            checkpoint.check_format(config.model.weights)
            checkpoint.check_digest(config.model.weights)
        except checkpoint.CheckpointError as err:
            raise ConfigError(f"--weights: {err}") from None
        if not models.registered(config.model.name).efficientnet:  # its own saved variables: of this model?
            _check_weights_model(config)
    own = make_task(config.task)
    columns = history_columns(task or own)
    monitor, mode = config.loop.monitor, config.loop.monitor_mode
    if monitor not in columns:
        raise ConfigError(f"--monitor {monitor!r} is not a metric of --task {config.task.task}; "
                          f"choose one of {', '.join(c for c in columns[2:] if c not in ('img_per_s', 'seconds'))}")
    # a built-in metric's direction is known: the other --monitor-mode would keep the worst epoch (a user's may
    # go either way)
    if mode != "auto" and monitor in history_columns(own) and own.mode(monitor) != mode:
        better = "lower" if own.mode(monitor) == "min" else "higher"
        raise ConfigError(f"--monitor {monitor} --monitor-mode {mode}: {better} {monitor} is better, so {mode} would "
                          f"keep the worst epoch; use --monitor-mode {own.mode(monitor)} (or auto)")
    if config.loop.wandb:
        import_wandb()  # a missing package is named before the output folder changes


def _check_weights_model(config: TrainConfig) -> None:
    """A model's own ``--weights`` (``checkpoint.save(path, variables, manifest={"model": NAME})``): refused where
    the manifest names another model (an EfficientNet's ported weights are checked as they are read)."""
    path = checkpoint.manifest_path(config.model.weights)
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # no manifest: the leaves are matched by path and shape, and the report says what was taken
    named = recorded.get("model") if isinstance(recorded, dict) else None
    named = recorded.get("config", {}).get("model", {}).get("name") if named is None and isinstance(recorded, dict) \
        else named
    if isinstance(named, str) and named != config.model.name:
        raise ConfigError(f"--weights {config.model.weights}: its manifest {path.name} says they are {named}'s "
                          f"variables, not --model {config.model.name}'s")


def global_batch(config: TrainConfig, devices: int | None = None) -> int:
    """The global batch of ``--batch-size`` or ``--batch-per-device`` (default 16 per device, at least 64) on
    ``devices`` (default this machine's; a plan's target has its own)."""
    n, data = devices or jax.device_count(), config.data
    size = data.global_batch(n)
    flag = "--batch-per-device" if data.batch_per_device is not None else "--batch-size"
    if size < 1 or size % n or size % jax.process_count():
        where = f" ({jax.local_device_count()} per process x {jax.process_count()} process(es))" if not devices else ""
        raise ConfigError(f"{flag} gives a global batch of {size}, which must be a positive multiple of the {n} "
                          f"devices{where}, e.g. {DataConfig().global_batch(n)}")
    return size


def resolve(config: TrainConfig, data: RunData, task: Task | None = None) -> tuple[TrainConfig, Plan]:
    """``config`` (checked: :func:`check_config`) with nothing left open for this machine and data, and the
    :class:`Plan` it implies. ``auto``'s batch (the largest whose compiled train step fits) is recorded as the global
    ``batch_size``: a resume keeps it."""
    if config.data.batch_per_device != "auto":
        return _resolve(config, data, task)
    k = config.optim.accumulate_steps
    provisional, plan = _resolve(config.replace(batch_per_device=k, memory_budget=None), data, task)
    fit = memory_plan.fit_batch(provisional.replace(memory_budget=config.data.memory_budget), plan, task=task,
                                per_device_limit=data.num_train // jax.device_count())
    config, plan = _resolve(config.replace(batch_per_device=fit.per_device, memory_budget=None), data, task)
    return config, dataclasses.replace(plan, batch_fit=fit.describe())


def _resolve(config: TrainConfig, data: RunData, task: Task | None) -> tuple[TrainConfig, Plan]:
    precision, precision_reason = choose_precision(config.model.precision)
    if data.class_names and len(data.class_names) <= data.max_label:
        raise ConfigError(f"--class-names names {len(data.class_names)} classes but the data holds label "
                          f"{data.max_label}")
    weights, parent, optim = config.model.weights, config.model.init_from, config.optim
    config = config.replace(
        data_dir=data.description, class_names=data.class_names, id_column=data.columns[0],
        label_column=data.columns[1], num_classes=config.model.num_classes or data.max_label + 1,
        image_size=config.model.image_size or data.stored_size, precision=precision.name,
        batch_size=global_batch(config), batch_per_device=None, lr=optim.lr or default_lr(optim.optimizer),
        weight_decay=default_weight_decay(optim.optimizer) if optim.weight_decay is None else optim.weight_decay,
        head_multiple=config.model.head_multiple or (128 if runtime.current_platform() == "tpu" else 1),
        weights=str(Path(weights).resolve()) if weights else None,
        init_from=str(Path(parent).resolve()) if parent else None)
    check_parent(config)
    config, chosen = settle_data_defaults(config, data)
    batch, k = config.data.batch_size, config.optim.accumulate_steps
    per_device = batch // jax.device_count()
    if per_device % k:
        raise ConfigError(f"--accumulate-steps {k} does not divide the {per_device} images per device of the global "
                          f"batch {batch}: choose a divisor, or another batch")
    steps_per_epoch = config.loop.steps_per_epoch or data.num_train // batch
    if steps_per_epoch < 1:
        raise ConfigError(f"--batch-size {batch} is larger than the {data.num_train} training examples")
    total = config.loop.total_steps(steps_per_epoch)
    optim, cfg = config.optim, models.registered(config.model.name)
    warmup = min(round(optim.warmup_epochs * steps_per_epoch), int(optim.warmup_max_fraction * total))
    multipliers = None
    if optim.layer_decay is not None or optim.head_lr_mult != 1.0:
        model = build_model(config)
        if not hasattr(model, "lr_parts"):
            raise ConfigError(f"--layer-decay / --head-lr-mult read a model's lr_parts(); --model {config.model.name} "
                              "declares none (see EfficientNet.lr_parts)")
        multipliers = group_multipliers(model.lr_parts(), layer_decay=optim.layer_decay,
                                        head_lr_mult=optim.head_lr_mult)
    plan = Plan(device_count=jax.device_count(), global_batch=batch, per_device_batch=per_device,
                steps_per_epoch=steps_per_epoch, total_steps=total, warmup_steps=warmup,
                peak_lr=math.nan if optim.lr == "auto" else scaled_lr(optim.lr, batch),
                head_width=padded_width(config.model.num_classes, config.model.head_multiple),
                mean=tuple(cfg.mean), std=tuple(cfg.std), lr_multipliers=multipliers,
                precision_reason=precision_reason, stages=progressive_stages(config), data_defaults=chosen)
    return config, plan
