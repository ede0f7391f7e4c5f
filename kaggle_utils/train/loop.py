"""``fit``: training steps with actions at intervals: log, evaluate, checkpoint, stop early.

In the order a reader meets them:

* An epoch is ``steps_per_epoch`` steps over ``train_batches(epoch)``: a *function* of the
  epoch number, so a resumed run rebuilds exactly the data order of the interrupted one (seed
  the shuffle with the epoch) and skips the batches it already trained on.
* What happens when is one :class:`FitSettings` (the loop's part of a run's config).
* Actions happen at step intervals: every ``log_every`` steps the summed step metrics are
  pulled from the device (one sync per log, never one per step) and sent to the writers;
  evaluation happens every ``eval_every`` steps (default: at each epoch end) and adds a history
  row; a checkpoint is written at every evaluation and every ``checkpoint_every`` steps, keeping
  the last ``keep`` plus the best. A run killed mid-epoch loses at most ``checkpoint_every``
  steps and ``resume=True`` continues from there with the same data order, keys, schedule and
  history.
* What is measured is the steps' :class:`~kaggle_utils.train.tasks.Task`: the history columns
  are ``train_<metric>`` and ``val_<metric>`` of its metrics. Any of them can be ``monitor``-ed,
  with a ``monitor_mode`` and a ``min_delta``; ``patience`` counts evaluations.
* Nothing diverged is ever saved: the loss is checked at every pull, the parameters and the
  validation loss before every write (:class:`TrainingDiverged`).
* ``hooks``: objects with any of the :class:`Hook` methods (or plain functions
  ``(row, host_state) -> stop?``, called after each evaluation) run user code at the start and
  end of the run, of each epoch, after each evaluation and log step, without editing the loop.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.std import tqdm  # tqdm.write: one line between whatever bars are showing

from .. import compilation
from ..parallel import local_rows
from ..precision import overflow_verdict
from . import run_dir
from .progress import progress_bar
from .progressive import STAGE_COLUMNS, StagedSteps
from .settings import TIMING_COLUMNS, FitSettings, make_monitor
from .steps import Steps
from .tasks import Task
from .writers import close_writers

__all__ = ["TIMING_COLUMNS", "FitResult", "FitSettings", "Hook", "TrainingDiverged", "evaluate", "fit",
           "history_columns"]



LOSS_SCALE_COLUMNS = ("loss_scale", "skipped_steps")  # with fp16 loss scaling: the scale, the steps it skipped


def history_columns(task: Task, *, loss_scaling: bool = False, staged: bool = False) -> tuple[str, ...]:
    """``staged``: a progressive run's rows also say their stage and its image size."""
    return ("epoch", "step", *(STAGE_COLUMNS if staged else ()), *(f"train_{m}" for m in task.metric_names(full=False)),
            *(f"val_{m}" for m in task.metric_names(full=True)), "lr",
            *(LOSS_SCALE_COLUMNS if loss_scaling else ()), *TIMING_COLUMNS)



class TrainingDiverged(RuntimeError):
    """The loss, the validation loss or a parameter became NaN or infinite; nothing of it was saved."""


@dataclasses.dataclass
class FitResult:
    state: Any  # host (numpy) TrainState after the last step
    history: list[dict]
    best: dict | None  # history row of the best evaluation by the monitored metric
    stop_reason: str
    best_sums: dict | None = None  # the validation sums of that evaluation, when this call made it (a report's counts)


class Hook:
    """Base for user hooks: override what you need. ``on_eval_end`` may return True to stop."""

    def on_run_start(self, state, history: list[dict]) -> None: ...
    def on_epoch_start(self, epoch: int) -> None: ...
    def on_log(self, step: int, scalars: Mapping[str, float]) -> None: ...
    def on_eval_end(self, row: dict, host_state) -> bool | None: ...
    def on_epoch_end(self, epoch: int, host_state) -> None: ...
    def on_run_end(self, result: FitResult) -> None: ...


class _EvalFunction(Hook):
    def __init__(self, fn: Callable):
        self.fn = fn

    def on_eval_end(self, row, host_state):
        return self.fn(row, host_state)


def _as_hooks(hooks: Sequence) -> list[Hook]:
    return [h if any(hasattr(h, m) for m in vars(Hook) if m.startswith("on_")) else _EvalFunction(h)
            for h in hooks]


_add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))


def _accumulate(total, new):
    return new if total is None else _add(total, new)


def _is_main() -> bool:
    return jax.process_index() == 0


def evaluate(steps: Steps, state, batches: Iterable[dict], *, prefetch: int = 2, progress: bool = False,
             desc: str = "eval") -> dict:
    """Sums of the eval step over every *global* batch (``state`` already on the devices), on the host.

    Every process reads the whole split and keeps its own rows of each batch, so every process
    runs the same number of steps whatever the files' sizes.
    """
    total = None
    bar = progress_bar(desc=desc, leave=False, disable=not (progress and _is_main()), unit="batch")
    for batch in steps.prefetch(map(local_rows, batches), prefetch):
        total = _accumulate(total, steps.evaluate(state, batch))
        bar.update(1)
    bar.close()
    if total is None:
        raise ValueError(f"{desc}: the batches were empty")
    return steps.get(total)


def fit(steps: Steps, state, train_batches: Callable[[int], Iterable[dict]], settings: FitSettings, *,
        val_batches: Callable[[], Iterable[dict]] | None = None, out_dir: str | Path | None = None,
        lr_schedule: Callable[[int], float] | None = None, hooks: Sequence = (), writers: Sequence = (),
        resume: bool = False, manifest: dict | None = None, progress: bool = True, prefetch: int = 2,
        stages: Sequence = ()) -> FitResult:
    """Trains ``state`` (a host TrainState) as ``settings`` say; returns the final host state and the history.

    ``val_batches()`` yields the validation split; without it the validation columns are NaN
    and ``settings.monitor`` should be a training column. ``manifest`` (e.g. the run's config)
    goes into the JSON written beside each checkpoint. ``stages``: ``(Stage, Steps)`` pairs of a
    progressive run (:mod:`~kaggle_utils.train.progressive`): each stage's epochs train with its
    own steps (``steps`` then only evaluates), its rows and scalars carry ``stage`` and
    ``image_size``, and its first step reports its compile time.
    """
    task = steps.config.task
    columns = history_columns(task, loss_scaling=state.loss_scale is not None, staged=bool(stages))
    watch = make_monitor(settings, columns, task)
    staged = StagedSteps(stages, epochs=-(-settings.total_steps // settings.steps_per_epoch)) if stages else None
    loop = _Loop(steps, task, columns, watch, settings, train_batches, val_batches, _as_hooks(hooks), list(writers),
                 out_dir=Path(out_dir) if out_dir is not None else None, manifest=dict(manifest or {}),
                 lr_schedule=lr_schedule, progress=progress, prefetch=prefetch, staged=staged)
    try:
        return loop.run(state, resume=resume)
    finally:
        close_writers(loop.writers)


class _Loop:
    """The state of one ``fit`` call; ``run`` is the loop, the rest are its actions."""

    def __init__(self, steps, task, columns, watch, settings: FitSettings, train_batches, val_batches, hooks,
                 writers, *, out_dir, manifest, lr_schedule, progress, prefetch, staged=None):
        self.steps, self.task, self.columns, self.watch = steps, task, columns, watch
        self.train_batches, self.val_batches, self.hooks, self.writers = train_batches, val_batches, hooks, writers
        self.out_dir, self.manifest, self.keep = out_dir, manifest, settings.keep
        self.steps_per_epoch, self.total_steps = settings.steps_per_epoch, settings.total_steps
        self.log_every, self.eval_every = settings.log_every, settings.eval_every
        self.checkpoint_every = settings.checkpoint_every
        self.lr_schedule, self.prefetch = lr_schedule, prefetch
        self.write = out_dir is not None and _is_main()
        self.show = progress and _is_main()
        self.history: list[dict] = []
        self.pending = None  # device sums of the train steps since the last history row
        self.window = None  # device sums since the last log
        self.best = self.best_sums = None
        self.stop_reason = "completed"
        self.staged, self.stage = staged, None  # progressive: the StagedSteps, the stage now training
        self.stage_compile_s: dict[str, float] = {}  # stage number -> its first step's compiling, in this process

    # ---- bookkeeping
    def _epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch + 1

    def _epoch_end(self, epoch: int) -> int:
        return min(epoch * self.steps_per_epoch, self.total_steps)

    def _lr(self, step: int) -> float:
        return float(self.lr_schedule(step)) if self.lr_schedule is not None else float("nan")

    def _call_hooks(self, method: str, *args) -> list:
        return [getattr(h, method)(*args) for h in self.hooks if hasattr(h, method)]

    # ---- the loop
    def run(self, state, *, resume: bool) -> FitResult:
        last = self.out_dir / "last.msgpack" if self.out_dir is not None else None
        pending_host = None
        if resume and last is not None and last.is_file():
            state, self.history, pending_host = run_dir.load_last(last, state, self.columns)
            if _is_main():
                tqdm.write(f"resumed from {last}: {len(self.history)} evaluation(s) done, step {int(state.step)}")
        if self.write:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        self.best = self.watch.best_row(self.history)
        self.stop_reason = self.watch.early_stop(self.history, self.best) or "completed"
        dev_state = self.steps.put_state(state)
        self.pending = self.steps.put_state(pending_host) if pending_host else None
        host_state = state
        self.clock = {"log": time.perf_counter(), "row": time.perf_counter()}
        self.compiled_before, self.first_step_done = compilation.seconds(), False
        self.first_step_from = (self.clock["row"], self.compiled_before)  # (time, compile seconds) it is timed from
        self._call_hooks("on_run_start", state, self.history)
        step = int(state.step)
        while step < self.total_steps and self.stop_reason == "completed":
            dev_state, host_state, step = self._run_epoch(dev_state, host_state, step)
        if self.write and self.history:  # also after a resume that found the run already complete
            self._write_reports()
        if _is_main() and self.stop_reason != "completed":
            tqdm.write(self.stop_reason)
        result = FitResult(state=host_state, history=self.history, best=self.best, stop_reason=self.stop_reason,
                           best_sums=self.best_sums)
        self._call_hooks("on_run_end", result)
        return result

    def _run_epoch(self, dev_state, host_state, step: int):
        epoch = self._epoch_of(step)
        end = self._epoch_end(epoch)
        done_before = step - (epoch - 1) * self.steps_per_epoch  # > 0 when resuming mid-epoch
        self._call_hooks("on_epoch_start", epoch)
        bar = progress_bar(total=end - (epoch - 1) * self.steps_per_epoch, initial=done_before,
                           desc=f"epoch {epoch}/{self._epoch_of(self.total_steps - 1)}", disable=not self.show,
                           unit="step")
        train = self._enter_stage(epoch)
        batches = itertools.islice(self.train_batches(epoch), done_before, done_before + end - step)
        clock = self.clock
        for batch in self.steps.prefetch(batches, self.prefetch):
            dev_state, metrics = train(dev_state, batch)
            self.pending, self.window = _accumulate(self.pending, metrics), _accumulate(self.window, metrics)
            step += 1
            if not self.first_step_done:
                self._report_first_step(metrics)
            bar.update(1)
            if step % self.log_every == 0 or step == end:
                self._log(dev_state, step, epoch, bar, clock)
            evaluate_now = (step % self.eval_every == 0) if self.eval_every else step == end
            evaluate_now = evaluate_now or step == self.total_steps
            save_now = evaluate_now or bool(self.checkpoint_every and step % self.checkpoint_every == 0)
            if save_now:
                host_state = self._host_state(dev_state, step)
            if evaluate_now:
                self._evaluate(dev_state, host_state, step, epoch, clock)
            if save_now:
                self._checkpoint(host_state, epoch, fresh_row=evaluate_now)
            if self.stop_reason != "completed":
                break
        bar.close()
        if step < end and self.stop_reason == "completed":
            raise ValueError(f"train data for epoch {epoch} ran out after {step - (epoch - 1) * self.steps_per_epoch}"
                             f" of {end - (epoch - 1) * self.steps_per_epoch} steps: use repeat=True or fewer steps "
                             "per epoch")
        if step == end:
            self._call_hooks("on_epoch_end", epoch, host_state)
        return dev_state, host_state, step

    def _enter_stage(self, epoch: int):
        """The train step of ``epoch``; a progressive run's stage changing here has its first step timed again."""
        if self.staged is None:
            return self.steps.train
        stage, steps = self.staged.at(epoch)
        if stage != self.stage:
            self.stage, self.first_step_done = stage, False
            self.first_step_from = (time.perf_counter(), compilation.seconds())
        return steps.train

    # ---- actions
    def _log(self, dev_state, step: int, epoch: int, bar, clock) -> None:
        host = self.steps.get(self.window)  # the one device -> host sync of the window
        sums, optim = host["task"], host["optim"]
        _check_finite(float(sums["loss_sum"]), "training loss", epoch=epoch, step=step)
        seconds = max(time.perf_counter() - clock["log"], 1e-9)
        running = self.task.finish(sums, full=False)
        n = max(int(optim["steps"]), 1)  # the steps applied (fp16 loss scaling may skip some)
        scalars = {**{f"train/{k}": v for k, v in running.items()},
                   **{k: float(v) / n for k, v in optim.items() if k not in ("steps", "skipped")},
                   "train/img_per_s": int(sums["count"]) / seconds}
        scale = None if dev_state.loss_scale is None else self.steps.get(dev_state.loss_scale)
        scalars.update(_loss_scale_figures(scale))
        scalars.update(StagedSteps.fields(self.stage) if self.stage is not None else {})
        if scale is not None:
            stuck = overflow_verdict(scale)
            if stuck:
                raise TrainingDiverged(f"{stuck} by step {step} (epoch {epoch}): skipped steps change nothing, so "
                                       "the checkpoints hold the last good state (try --precision bf16 or fp32, or "
                                       "a lower --lr)")
        scalars["lr"] = self._lr(step - scalars.get("skipped_steps", 0))
        bar.set_postfix(loss=f"{running['loss']:.4f}", acc=f"{running['acc']:.3f}",
                        img_s=f"{scalars['train/img_per_s']:.0f}")
        self._emit(step, scalars)
        self._call_hooks("on_log", step, scalars)
        self.window, clock["log"] = None, time.perf_counter()

    def _emit(self, step: int, scalars: dict) -> None:
        if _is_main():
            for writer in self.writers:
                writer.write(step, scalars)

    def _evaluate(self, dev_state, host_state, step: int, epoch: int, clock) -> None:
        train_seconds = time.perf_counter() - clock["row"]
        train_sums = self.steps.get(self.pending)["task"]
        train = self.task.finish(train_sums, full=False)
        row = {"epoch": epoch, "step": step, **{c: float("nan") for c in self.columns[2:]}}
        row.update(StagedSteps.fields(self.stage) if self.stage is not None else {})
        row.update({f"train_{k}": v for k, v in train.items() if f"train_{k}" in row})
        row["img_per_s"] = int(train_sums["count"]) / max(train_seconds, 1e-9)
        sums = None
        if self.val_batches is not None:
            started = time.perf_counter()
            sums = evaluate(self.steps, dev_state, self.val_batches(), prefetch=self.prefetch, progress=self.show)
            val = self.task.finish(sums)
            _check_finite(val["loss"], "validation loss", epoch=epoch, step=step)
            row.update({f"val_{k}": v for k, v in val.items()})
            self._emit(step, {**{f"val/{k}": v for k, v in val.items()},
                              "val/img_per_s": int(sums["count"]) / (time.perf_counter() - started)})
        row.update(_loss_scale_figures(host_state.loss_scale))
        row["lr"] = self._lr(step - row.get("skipped_steps", 0))  # the schedule counts applied steps only
        row["seconds"] = time.perf_counter() - clock["row"]
        clock["row"] = time.perf_counter()
        self.pending = None
        self.history.append(row)
        improved = self.watch.improves(row, self.best)
        if improved:
            self.best, self.best_sums = row, sums
            if self.write:
                run_dir.save_best(self.out_dir, host_state.variables(), row, monitor=self.watch.name,
                                  manifest=self.manifest)
        if _is_main():
            tqdm.write(_format_row(row, self.watch.name, improved))
        if any(bool(stop) for stop in self._call_hooks("on_eval_end", row, host_state)):
            self.stop_reason = f"stopped by a hook after epoch {epoch} (step {step})"
        else:
            self.stop_reason = self.watch.early_stop(self.history, self.best) or self.stop_reason

    def _host_state(self, dev_state, step: int):
        """The state pulled to the host, refused if any parameter is NaN or infinite (it would be saved)."""
        host_state = self.steps.get(dev_state)
        if not all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(host_state.params)):
            raise TrainingDiverged(f"a parameter became NaN or infinite by step {step}; stopped before writing "
                                   "anything, so the checkpoints hold the last good state")
        return host_state

    def _checkpoint(self, host_state, epoch: int, *, fresh_row: bool) -> None:
        if self.write:
            pending = None if self.pending is None else self.steps.get(self.pending)
            run_dir.save_last(self.out_dir, host_state, self.history, self.columns, pending, epoch=epoch,
                              manifest=self.manifest, keep=self.keep)
            if fresh_row:
                self._write_reports()

    def _report_first_step(self, metrics) -> None:
        """One line: how long the first step (of the run, or of each stage) took and how much of it was compiling.

        One sync, once per stage; a stage's compile seconds also go to ``metrics.json``.
        """
        jax.block_until_ready(metrics)
        self.first_step_done = True
        started, compiled_before = self.first_step_from
        took, compiled = time.perf_counter() - started, compilation.seconds() - compiled_before
        where = ""
        if self.stage is not None:
            self.stage_compile_s[str(self.stage.number)] = round(compiled, 3)
            where = f"stage {self.stage.number}/{self.staged.count} at {self.stage.image_size}px: "
        if _is_main():
            tqdm.write(f"{where}first step after {took:.1f} s, {compiled:.1f} s of it compiling")

    def compile_seconds(self) -> float:
        """Seconds this run has spent compiling (train, eval and anything else it ran) since it began."""
        return compilation.seconds() - self.compiled_before

    def _write_reports(self) -> None:
        run_dir.write_reports(self.out_dir, self.history, self.columns, best=self.best, monitor=self.watch.name,
                              stop_reason=self.stop_reason, extra={"compile_s": round(self.compile_seconds(), 3),
                                                                   **self._stage_report()})

    def _stage_report(self) -> dict:
        """metrics.json's ``stage_compile_s``: each stage's first-step compiling in this process (a resumed run
        reports the stages it compiled itself)."""
        return {} if self.staged is None else {"stage_compile_s": dict(self.stage_compile_s)}


def _loss_scale_figures(scale) -> dict:
    """The history columns / scalars of fp16's host loss scale (none without loss scaling)."""
    if scale is None:
        return {}
    return {"loss_scale": float(scale.scale), "skipped_steps": int(scale.skipped)}


def _check_finite(value: float, what: str, *, epoch: int, step: int) -> None:
    if not math.isfinite(value):
        raise TrainingDiverged(f"{what} became {value} in epoch {epoch} (by step {step}); stopped before writing "
                               "anything, so the checkpoints hold the last good state")


def _format_row(row: dict, monitor: str, improved: bool) -> str:
    shown = [f"epoch {row['epoch']} step {row['step']}"]
    for key, value in row.items():
        if key in ("epoch", "step", "seconds") or (isinstance(value, float) and math.isnan(value)):
            continue
        shown.append(f"{key} {value:.4g}" if key != "img_per_s" else f"{value:.0f} img/s")
    return " | ".join(shown) + (f"  * best {monitor}" if improved else "")
