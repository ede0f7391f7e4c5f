"""What :func:`~kaggle_utils.train.fit` does when, and how it judges an evaluation: one small checked object that
a run's config maps onto (:func:`kaggle_utils.run.fit_settings`), refusing a bad value before anything compiles.
"""
import dataclasses
import math

from .tasks import Task

TIMING_COLUMNS = ("img_per_s", "seconds")  # the only columns that differ between identical runs


_RULES = [*((name, lambda v: isinstance(v, int) and v >= 1, "a positive number of steps") for name in (
    "steps_per_epoch", "epochs", "total_steps", "log_every", "eval_every", "checkpoint_every", "keep")),
          ("monitor_mode", lambda v: v in ("auto", "min", "max"), "auto, min or max"),
          ("min_delta", lambda v: v >= 0 and math.isfinite(v), "a finite number >= 0"),
          ("patience", lambda v: v >= 1, ">= 1 evaluation")]  # (field, test of a value given, the refusal's words)


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """When :func:`fit` does what, and what it watches. Give ``epochs`` (of ``steps_per_epoch`` steps) or
    ``total_steps`` (the last epoch may be shorter; filled in from ``epochs``)."""

    steps_per_epoch: int
    epochs: int | None = None
    total_steps: int | None = None
    log_every: int = 20
    eval_every: int | None = None
    checkpoint_every: int | None = None
    keep: int = 1
    monitor: str = "val_f1"
    monitor_mode: str = "auto"
    min_delta: float = 0.0
    patience: int | None = None

    def __post_init__(self):
        if (self.epochs is None) == (self.total_steps is None):
            raise ValueError("give exactly one of epochs or total_steps")
        for name, test, words in _RULES:
            value = getattr(self, name)
            if value is not None and not test(value):
                raise ValueError(f"{name} must be {words}, got {value!r}")
        if self.total_steps is None:
            object.__setattr__(self, "total_steps", self.epochs * self.steps_per_epoch)


@dataclasses.dataclass
class _Monitor:
    name: str
    mode: str
    min_delta: float
    patience: int | None

    def improves(self, row: dict, best: dict | None) -> bool:
        """Better than the best so far by more than ``min_delta``; NaN never is."""
        value = row[self.name]
        if not math.isfinite(value):
            return False
        if best is None:
            return True
        delta = value - best[self.name]
        return delta < -self.min_delta if self.mode == "min" else delta > self.min_delta

    def best_row(self, history: list[dict]) -> dict | None:
        best = None
        for row in history:
            if self.improves(row, best):
                best = row
        return best

    def early_stop(self, history: list[dict], best: dict | None) -> str | None:
        """The reason to stop once ``patience`` evaluations have passed since the best one."""
        if self.patience is None or best is None or not history:
            return None
        since = sum(1 for row in history if row["step"] > best["step"])
        if since < self.patience:
            return None
        return (f"early stopping after epoch {history[-1]['epoch']} (step {history[-1]['step']}): {self.name} did "
                f"not improve for {self.patience} evaluation(s) (best {best[self.name]:.4f} at step {best['step']})")


def make_monitor(settings: FitSettings, columns, task: Task) -> _Monitor:
    monitor = settings.monitor
    if monitor not in columns:
        raise ValueError(f"monitor {monitor!r} is not a history column of this task; choose one of "
                         f"{', '.join(c for c in columns if c not in ('epoch', 'step') + TIMING_COLUMNS)}")
    mode = task.mode(monitor) if settings.monitor_mode == "auto" else settings.monitor_mode
    return _Monitor(monitor, mode, settings.min_delta, settings.patience)
