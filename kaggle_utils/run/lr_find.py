"""``--lr auto``: an LR range test (Smith 2015; fastai's ``lr_find``) picks the run's peak learning rate.

A few dozen optimizer steps from the run's own initial state and training (frozen parts, lr groups,
precision, augmentation), the rate growing geometrically from ``LR_MIN`` to ``LR_MAX`` per 256 images,
until the loss explodes; the state it trained is thrown away. The pick (:func:`pick_lr`, fastai's ``steep``)
is where the loss, smoothed by a *centred* mean (a trailing one lags), falls fastest before its minimum; a
curve that never falls ``MIN_DROP`` below its start picks nothing and the default rate stays. Why this rule:
bench/README.md, "Learning rate of a short fine-tune". The found rate is the run's ``lr`` in ``config.json``,
with a note (``lr_find``) that ``--resume`` reads instead of testing again (:func:`~.trainer.resumed_config`).
"""
import dataclasses
import itertools
import math
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from .. import checkpoint
from ..config import TrainConfig
from ..report import write_lr_find_plot
from ..train import Task, scaled_lr
from ..train.optim import default_lr
from ..train.loop import progress_bar
from .build import Plan, Training, build_model, build_training, initial_variables, train_dataset
from .data import RunData, run_data
from .resolve import check_config, resolve, run_task
from .teacher import teach

LR_MIN, LR_MAX = 1e-7, 10.0  # per 256 images: from "changes nothing" to "destroys any network"
DEFAULT_STEPS, FEWEST_DEFAULT_STEPS = 100, 40
WINDOW = 5  # points of the centred mean that smooths the curve (and of the trailing mean of the stop check)
EXPLODE_FACTOR = 4.0
MIN_DROP = 0.02  # the smoothed loss must fall 2% below its start for the curve to have a minimum worth reading
RULE = "steepest fall of the loss"
LR_FIND_CSV = "lr_find.csv"


@dataclasses.dataclass(frozen=True)
class LrFinding:
    """One range test: the curve (a point per applied step), the rate it picked, why it stopped."""

    lrs: tuple[float, ...]  # per 256 images, the rate of each step
    losses: tuple[float, ...]  # the training loss of each step's batch
    smoothed: tuple[float, ...]
    lr: float  # the pick, per 256 images (the default rate when the loss never fell)
    min_loss_lr: float | None  # where the smoothed loss is lowest; None: it never fell
    stop: str  # why the test ended
    global_batch: int
    rule: str = RULE

    @property
    def found(self) -> bool:
        return self.min_loss_lr is not None

    def describe(self) -> str:
        """The log's line: what was picked and by which rule (or why nothing was)."""
        if not self.found:
            return (f"LR range test: the loss never fell by {MIN_DROP:.0%} over {len(self.lrs)} steps ({self.stop}); "
                    f"keeping the default {self.lr:g} per 256 images")
        return (f"LR range test: --lr {self.lr:.3g} per 256 images (peak {self.lr * self.global_batch / 256:.3g} at "
                f"batch {self.global_batch}), {self.rule}, lowest loss at {self.min_loss_lr:.3g}; {len(self.lrs)} "
                f"steps, {self.stop}")

    def text_curve(self, width: int = 40) -> str:
        """A row per decade of the sweep (and the minimum and the pick): rate, smoothed loss, a bar."""
        lrs, smoothed = np.asarray(self.lrs), np.asarray(self.smoothed)
        rows = {int(np.argmin(np.abs(np.log10(lrs) - d))) for d in range(-7, 2) if lrs[0] <= 10.0 ** d <= lrs[-1]}
        marks = {int(np.argmin(np.abs(lrs - self.min_loss_lr))): "  <- lowest",
                 int(np.argmin(np.abs(np.log(lrs / self.lr)))): "  <- picked"} if self.found else {}
        finite = smoothed[np.isfinite(smoothed)]
        low, span = float(finite.min()), max(float(finite.max() - finite.min()), 1e-12)
        bar = lambda v: "#" * (1 + round((width - 1) * (v - low) / span)) if math.isfinite(v) else "!"  # noqa: E731
        return "\n".join(f"  lr {lrs[i]:8.2e}  loss {smoothed[i]:8.4f} {bar(smoothed[i])}{marks.get(i, '')}"
                         for i in sorted(rows | set(marks) | {len(lrs) - 1}))

    def note(self) -> dict:
        """What config.json keeps of the test (``lr_find``): the found rate and how it was found."""
        return {"lr": self.lr, "found": self.found, "rule": self.rule, "steps": len(self.lrs),
                "min_loss_lr": self.min_loss_lr, "stop": self.stop, "sweep": [LR_MIN, LR_MAX]}

    def write(self, out: str | Path) -> list[Path]:
        """``OUT/lr_find.csv`` (the curve's numbers) and ``OUT/lr_find.png``, each written atomically."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        rows = [[step, f"{lr:.6g}", f"{lr * self.global_batch / 256:.6g}", f"{loss:.6g}", f"{smoothed:.6g}"]
                for step, (lr, loss, smoothed) in enumerate(zip(self.lrs, self.losses, self.smoothed))]
        checkpoint.atomic_write_csv(out / LR_FIND_CSV, ["step", "lr", "peak_lr", "loss", "smoothed_loss"], rows)
        return [out / LR_FIND_CSV, write_lr_find_plot(out, self)]


# --------------------------------------------------------------------------- the curve and the rule


def smooth(losses, window: int = WINDOW) -> np.ndarray:
    """Centred mean over ``window`` neighbours (fewer at the ends); no lag, unlike a trailing average."""
    losses, half = np.asarray(losses, np.float64), window // 2
    return np.array([losses[max(0, i - half):i + half + 1].mean() for i in range(len(losses))])


def exploded(losses, factor: float = EXPLODE_FACTOR, window: int = WINDOW) -> bool:
    """The stop check after each step: a non-finite loss, or the trailing mean above ``factor`` x its lowest."""
    if not math.isfinite(losses[-1]):
        return True
    if len(losses) < window:
        return False
    trailing = np.convolve(np.asarray(losses, np.float64), np.ones(window) / window, mode="valid")
    return bool(trailing[-1] > factor * trailing.min())


def pick_lr(lrs, losses, window: int = WINDOW) -> tuple[float | None, float | None]:
    """``(picked rate, rate of the lowest smoothed loss)``; ``(None, None)`` when it never fell. The pick: the
    steepest fall (``d loss / d log lr`` most negative) up to the lowest point; non-finite losses left out."""
    lrs, losses = np.asarray(lrs, np.float64), np.asarray(losses, np.float64)
    keep = np.isfinite(losses)
    lrs, losses = lrs[keep], losses[keep]
    if len(losses) < window:
        return None, None
    smoothed = smooth(losses, window)
    low = int(np.argmin(smoothed))
    if smoothed[low] > (1 - MIN_DROP) * smoothed[0]:
        return None, None
    slope = np.gradient(smoothed[:low + 1], np.log(lrs[:low + 1]))  # low >= 1: the loss fell
    return float(lrs[int(np.argmin(slope))]), float(lrs[low])


# --------------------------------------------------------------------------- the test


def range_test(config: TrainConfig, plan: Plan, data: RunData, model: nn.Module, variables: dict, *,
               task: Task | None = None, steps: int | None = None, mesh: jax.sharding.Mesh | None = None,
               progress: bool = False) -> LrFinding:
    """The range test from ``variables`` (left as they are) with a resolved run's optimizer and steps, for
    ``steps`` steps (default ``DEFAULT_STEPS``, or the run's length when shorter, at least ``FEWEST_DEFAULT_STEPS``)."""
    count = steps or config.optim.lr_find_steps or int(min(DEFAULT_STEPS, max(FEWEST_DEFAULT_STEPS,
                                                                                plan.total_steps)))
    rates = np.geomspace(LR_MIN, LR_MAX, count)  # as many points per decade everywhere
    peaks = jnp.asarray(rates * plan.global_batch / 256, jnp.float32)
    schedule = lambda applied: peaks[jnp.minimum(applied, count - 1)]  # noqa: E731  (AdamW's count: applied steps)
    training = build_training(config, plan, model, variables, task=task, mesh=mesh, schedule=schedule)
    compiled = training.steps
    state = compiled.put_state(training.state)
    lrs, losses, stop = [], [], f"reached {LR_MAX:g}"
    dataset = train_dataset(config, plan, data, epoch=0)  # not epoch 1's order: the run reads that one
    bar = progress_bar(total=count, desc="lr range test", leave=False, disable=not progress, unit="step")
    try:
        for batch in compiled.prefetch(itertools.islice(dataset, count)):
            state, metrics = compiled.train(state, batch)
            host = compiled.get(metrics)
            bar.update(1)
            if int(host["optim"]["steps"]) == 0:  # fp16 loss scaling skipped the step: it applied no rate
                continue
            lrs.append(float(rates[len(lrs)]))
            losses.append(float(compiled.config.task.finish(host["task"], full=False)["loss"]))
            if exploded(losses):
                stop = f"stopped at {lrs[-1]:.2g}: the loss exploded"
                break
    finally:
        bar.close()
        dataset.close()
    return _finding(config, plan, lrs, losses, stop)


def _finding(config: TrainConfig, plan: Plan, lrs: list, losses: list, stop: str) -> LrFinding:
    picked, at_min = pick_lr(lrs, losses)
    # 3 significant digits: a rate a user can type as --lr to repeat the run, no false precision
    picked = float(f"{picked:.3g}") if picked is not None else default_lr(config.optim.optimizer)
    finite = [(lr, loss) for lr, loss in zip(lrs, losses) if math.isfinite(loss)]
    lrs, losses = [lr for lr, _ in finite], [loss for _, loss in finite]
    return LrFinding(tuple(lrs), tuple(losses), tuple(float(v) for v in smooth(losses)), picked, at_min, stop,
                     plan.global_batch)


def settle_lr(config: TrainConfig, plan: Plan, data: RunData, model: nn.Module, variables: dict,
              out: str | Path, *, task: Task | None = None, progress: bool = True
              ) -> tuple[TrainConfig, Plan, Training, dict]:
    """A run's range test, reported (log lines; ``lr_find.csv``/``.png`` in ``out`` on process 0): the config and
    plan with the found rate, the run's training built afresh from ``variables`` with it, config.json's note."""
    finding = range_test(config, plan, data, model, variables, task=task, progress=progress)
    if jax.process_index() == 0:
        print(finding.describe())
        print(finding.text_curve())
        finding.write(out)
    plan = dataclasses.replace(plan, peak_lr=scaled_lr(finding.lr, plan.global_batch))
    config = config.replace(lr=finding.lr)
    return config, plan, build_training(config, plan, model, variables, task=task), finding.note()


def find_lr(config: TrainConfig, data: RunData | None = None, *, task: Task | None = None,
            out: str | Path | None = None, steps: int | None = None, progress: bool = True) -> LrFinding:
    """The range test of ``config`` alone, for a notebook (``data``: opened here unless given; nothing written
    unless ``out`` is given). Use the pick with ``config.replace(lr=finding.lr)``."""
    config, task = run_task(config.replace(lr="auto"), task)
    check_config(config, task)
    with (tempfile.TemporaryDirectory(prefix="kaggle_utils_lr_find_") as staging,
          run_data(config, staging, data) as data):
        data = teach(config, data)  # a teacher's fields: what the task reads
        resolved, plan = resolve(config, data, task)
        model = build_model(resolved)
        finding = range_test(resolved, plan, data, model, initial_variables(resolved, model), task=task,
                             steps=steps, progress=progress)
    if out is not None and jax.process_index() == 0:
        finding.write(out)
    return finding
