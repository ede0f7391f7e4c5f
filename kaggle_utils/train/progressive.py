"""Progressive learning (EfficientNetV2, Tan & Le 2021): the image size and the regularisation grow by stage.

Stage ``i`` of ``N`` (from 0) covers the epochs up to ``floor(E (i + 1) / N)`` and trains at::

    size      = min_size + (image_size - min_size) f_i   rounded to a multiple of SIZE_MULTIPLE (8)
      f_i     = (i + 1) / N      "official": google/automl's code (no stage at min_size)
      f_i     = i / (N - 1)      "paper": the paper's Algorithm 1 (the first stage at min_size)
    magnitude = linspace(min(5, end), end, N)[i]       (RandAugment; the official code's start)
    alphas    = linspace(0, alpha, N)[i]                (mixup and cutmix)
    dropout   = linspace(min(0.1, end), end, N)[i]      (the paper's V2-S 0.1 -> 0.3, if scheduled)

ending at the run's own values, so the last stage trains as the fixed-size run would. Rounding keeps
sizes few and tile-friendly (V2-S's 171, 214, 257, 300 become 168, 216, 256, 300); neighbouring
stages it makes one size are one stage (the later one's values). Each stage's train step is its own
compiled program (shapes, magnitude, mixing and dropout are static in it); :class:`StagedSteps`
tells the loop which one trains an epoch. Pure numbers and a lookup; no data, no config.
"""
import dataclasses
import math
from typing import Sequence

SIZE_MULTIPLE = 8
RULES = {"official": lambda i, n: (i + 1) / n, "paper": lambda i, n: i / (n - 1)}  # stage i's share of the growth
STAGE_COLUMNS = ("stage", "image_size")  # history columns of a staged run
MAGNITUDE_START, DROPOUT_START = 5.0, 0.1  # the official code's RandAugment start; the paper's V2-S dropout start


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a progressive run: its epochs and the values its train step is built with."""

    number: int  # 1-based, as the history's ``stage`` column
    first_epoch: int  # 1-based
    epochs: int
    image_size: int
    magnitude: float
    mixup_alpha: float
    cutmix_alpha: float
    drop_rate: float

    @property
    def last_epoch(self) -> int:
        return self.first_epoch + self.epochs - 1


def _linspace(start: float, end: float, count: int, i: int) -> float:
    """``numpy.linspace(start, end, count)[i]`` in plain floats, the last one exactly ``end``."""
    return end if i == count - 1 else start + (end - start) * i / (count - 1)


def _stage_size(min_size: int, image_size: int, fraction: float) -> int:
    if fraction >= 1:
        return image_size
    raw = min_size + (image_size - min_size) * fraction
    rounded = SIZE_MULTIPLE * math.floor(raw / SIZE_MULTIPLE + 0.5)
    return min(max(rounded, SIZE_MULTIPLE), image_size)


def progressive_schedule(stages: int, epochs: int, *, image_size: int, min_size: int, magnitude: float,
                         mixup_alpha: float = 0.0, cutmix_alpha: float = 0.0, drop_rate: float = 0.0,
                         schedule_dropout: bool = False, rule: str = "official") -> tuple[Stage, ...]:
    """The stages of an ``epochs``-epoch run ending at the given values (see the module docstring): ``stages`` of
    them, fewer where sizes coincide (merged); ValueError for a schedule that cannot be."""
    if stages < 2:
        raise ValueError(f"{stages} stage(s): progressive learning needs at least 2 (one stage is a fixed-size run)")
    if epochs < stages:
        raise ValueError(f"{epochs} epoch(s) cannot make {stages} stages: each stage is a whole number of epochs")
    if not SIZE_MULTIPLE <= min_size < image_size:
        raise ValueError(f"min_size {min_size} must be in [{SIZE_MULTIPLE}, image_size {image_size})")
    out, first = [], 1
    for i in range(stages):
        last = (epochs * (i + 1)) // stages
        size = _stage_size(min_size, image_size, RULES[rule](i, stages))
        if out and out[-1].image_size == size:  # rounded to one size: one stage, the later one's values
            first = out.pop().first_epoch
        dropout = _linspace(min(DROPOUT_START, drop_rate), drop_rate, stages, i) if schedule_dropout else drop_rate
        out.append(Stage(number=len(out) + 1, first_epoch=first, epochs=last - first + 1, image_size=size,
                         magnitude=_linspace(min(MAGNITUDE_START, magnitude), magnitude, stages, i),
                         mixup_alpha=_linspace(0.0, mixup_alpha, stages, i),
                         cutmix_alpha=_linspace(0.0, cutmix_alpha, stages, i), drop_rate=dropout))
        first = last + 1
    if len(out) < 2:
        raise ValueError(f"every stage from {min_size} to {image_size} px rounds to {image_size} px (multiples of "
                         f"{SIZE_MULTIPLE}): no size to grow through; give a smaller min_size")
    return tuple(out)


class StagedSteps:
    """Which compiled steps train which epoch: ``(stage, steps)`` pairs whose stages cover the run's epochs in order."""

    def __init__(self, stages: Sequence[tuple[Stage, object]], *, epochs: int):
        self.stages = tuple(stages)
        expected = 1
        for stage, _ in self.stages:
            if stage.first_epoch != expected or stage.epochs < 1:
                raise ValueError(f"stage {stage.number} starts at epoch {stage.first_epoch} with {stage.epochs} "
                                 f"epoch(s); the stages must follow each other from epoch 1")
            expected = stage.last_epoch + 1
        if not self.stages or expected <= epochs:
            raise ValueError(f"the stages cover epochs 1-{expected - 1} of a {epochs}-epoch run")

    def at(self, epoch: int) -> tuple[Stage, object]:
        """The stage of ``epoch`` (1-based) and the steps that train it."""
        for stage, steps in self.stages:
            if epoch <= stage.last_epoch:
                return stage, steps
        raise ValueError(f"epoch {epoch} is past the last stage (epoch {self.stages[-1][0].last_epoch})")

    @staticmethod
    def fields(stage: Stage) -> dict[str, int]:
        """The history columns and logged scalars of ``stage``."""
        return {"stage": stage.number, "image_size": stage.image_size}
