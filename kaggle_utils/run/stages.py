"""A run's progressive-learning stages (``--progressive-stages``), each one the run's config with that stage's values.

The schedule's numbers are :mod:`kaggle_utils.train.progressive`'s. A stage is the config with its
image size, RandAugment magnitude, Mixup / CutMix alphas and dropout, so the functions that build a
run's input and step from a config build a stage's unchanged, for every data route and for ``cv``.
"""
from typing import Callable

from ..config import ConfigError, TrainConfig
from ..train import Steps
from ..train.progressive import SIZE_MULTIPLE, Stage, progressive_schedule

DEFAULT_MIN_SIZE = 128  # the official code's ibase


def _min_size(config: TrainConfig, image_size: int) -> int:
    """``--progressive-min-size``, or 128 (at most half the image size, at least 8)."""
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


def progressive_stages(config: TrainConfig) -> tuple[Stage, ...]:
    """The stages of a config whose image size is resolved; () when off. Refuses, by flag, what cannot be staged."""
    if config.loop.progressive_stages == 0:
        return ()
    size, data, loop = config.model.image_size, config.data, config.loop
    min_size = _min_size(config, size)
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


def stage_steps(config: TrainConfig, stages: tuple[Stage, ...], steps: Steps,
                make: Callable[[TrainConfig], Steps]) -> tuple[Steps, ...]:
    """Each stage's compiled steps, ``make(stage's config)``; the last stage's (the run's own values) are ``steps``."""
    return tuple(steps if stage is stages[-1] else make(stage_config(config, stage)) for stage in stages)


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
