"""A run's progressive-learning stages (``--progressive-stages``): computed up front, each one a config.

The schedule's numbers are :mod:`kaggle_utils.train.progressive`'s; this module reads them off
a config (refusing, by flag, what cannot be staged), describes them for the plan line, and
gives each stage as the run's config with that stage's values (image size, RandAugment
magnitude, Mixup / CutMix alphas, dropout). So the functions that build a run's training
input and step from a config (``train_dataset``, ``device_augmentation``, ``build_model``)
build a stage's unchanged, and every data route (records, a converted ``--source``, each
``--augment``) and ``cv`` (a run per fold) stage the same way.
"""
from __future__ import annotations

from typing import Callable

from ..config import ConfigError, TrainConfig

__all__ = ["DEFAULT_MIN_SIZE", "check_progressive_flags", "describe_stages", "epoch_config", "progressive_stages",
           "stage_config", "stage_steps"]

DEFAULT_MIN_SIZE = 128  # the official code's ibase


def _min_size(config: TrainConfig, image_size: int) -> int:
    """``--progressive-min-size``, or 128 (at most half the image size, at least 8)."""
    from ..train.progressive import SIZE_MULTIPLE

    given = config.loop.progressive_min_size
    if given is not None:
        if not SIZE_MULTIPLE <= given < image_size:
            raise ConfigError(f"--progressive-min-size {given}: must be at least {SIZE_MULTIPLE} and smaller than "
                              f"--image-size {image_size} (the last stage's size)")
        return given
    size = min(DEFAULT_MIN_SIZE, image_size // 2)
    if size < SIZE_MULTIPLE:
        raise ConfigError(f"--progressive-stages: --image-size {image_size} is too small to grow into (the stages "
                          f"start at {SIZE_MULTIPLE} px or more); train at {2 * SIZE_MULTIPLE} px or more")
    return size


def check_progressive_flags(config: TrainConfig) -> None:
    """The checks that need no data (the image size may come from it): before anything opens the data."""
    loop = config.loop
    n = loop.progressive_stages
    if n < 0:
        raise ConfigError(f"--progressive-stages {n}: must be >= 0 (0: off)")
    if n == 0:
        given = [flag for flag, value in (("--progressive-min-size", loop.progressive_min_size is not None),
                                          ("--progressive-dropout", loop.progressive_dropout),
                                          ("--progressive-rule", loop.progressive_rule != "official")) if value]
        if given:
            raise ConfigError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --progressive-stages N "
                              "(N >= 2): without stages nothing would use them")
        return
    if n == 1:
        raise ConfigError("--progressive-stages 1: one stage is a fixed-size run; give 2 or more (the paper: 4), "
                          "or 0 (off)")
    if loop.steps is not None:
        raise ConfigError(f"--progressive-stages {n} needs --epochs, not --steps: each stage is a whole number of "
                          "epochs")
    if loop.epochs < n:
        raise ConfigError(f"--epochs {loop.epochs} cannot make --progressive-stages {n}: each stage is a whole "
                          f"number of epochs; give at least {n} epochs, or fewer stages")


def progressive_stages(config: TrainConfig) -> tuple:
    """The :class:`~kaggle_utils.train.progressive.Stage` s of a config whose image size is resolved; () when off.

    Raises :class:`ConfigError` naming the flag for a schedule that cannot be.
    """
    from ..train.progressive import progressive_schedule

    check_progressive_flags(config)
    if config.loop.progressive_stages == 0:
        return ()
    size, data = config.model.image_size, config.data
    min_size = _min_size(config, size)
    try:
        return progressive_schedule(config.loop.progressive_stages, config.loop.epochs, image_size=size,
                                    min_size=min_size, magnitude=data.randaugment_magnitude,
                                    mixup_alpha=data.mixup_alpha, cutmix_alpha=data.cutmix_alpha,
                                    drop_rate=config.model.drop_rate, schedule_dropout=config.loop.progressive_dropout,
                                    rule=config.loop.progressive_rule)
    except ValueError as err:
        raise ConfigError(f"--progressive-stages {config.loop.progressive_stages} (--progressive-min-size {min_size}, "
                          f"--image-size {size}): {err}") from None


def stage_config(config: TrainConfig, stage) -> TrainConfig:
    """``config`` with ``stage``'s training values: what builds that stage's input and train step."""
    return config.replace(image_size=stage.image_size, randaugment_magnitude=stage.magnitude,
                          mixup_alpha=stage.mixup_alpha, cutmix_alpha=stage.cutmix_alpha, drop_rate=stage.drop_rate)


def epoch_config(config: TrainConfig, stages: tuple, epoch: int) -> TrainConfig:
    """The config that trains ``epoch`` (1-based): its stage's, or ``config`` itself in a run without stages."""
    for stage in stages:
        if epoch <= stage.last_epoch:
            return stage_config(config, stage)
    return config


def stage_steps(config: TrainConfig, stages: tuple, steps, make: Callable[[TrainConfig], object]) -> tuple:
    """Each stage's compiled steps, ``make(stage's config)``; the last stage's (the run's own values) are ``steps``."""
    return tuple(steps if stage is stages[-1] else make(stage_config(config, stage)) for stage in stages)


def describe_stages(config: TrainConfig, stages: tuple) -> str:
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

    def one(stage) -> str:
        epochs = f"epoch {stage.first_epoch}" if stage.epochs == 1 else f"epochs {stage.first_epoch}-{stage.last_epoch}"
        return f"{stage.number}: {epochs} at {' '.join(show(stage) for _, show in values)}"

    asked = config.loop.progressive_stages
    merged = f" of {asked} asked, those of one size merged" if asked != len(stages) else ""
    return (f"; progressive learning in {len(stages)} stages{merged} ({config.loop.progressive_rule} rule; "
            f"{', '.join(name for name, _ in values)}; evaluation at "
            f"{data.eval_image_size or config.model.image_size}px): " + "; ".join(map(one, stages)))
