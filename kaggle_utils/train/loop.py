"""``fit``: training steps with actions at intervals: log, evaluate, checkpoint, stop early.

``train_batches(epoch)`` is a *function* of the epoch, so a resumed run rebuilds the interrupted one's data
order and skips what it trained on. Metrics are pulled once per log, never per step; checkpoints are
written by a background thread (:class:`~.run_dir.RunFolder`); nothing diverged is saved.

It reads the config's ``loop`` section itself (:class:`~kaggle_utils.config.LoopConfig`: what it does when, how it
judges an evaluation), with ``steps_per_epoch`` filled in (``run.resolve``'s plan knows it from the data).

Size: one concern, the loop, and the progress bars it draws: apart they were two small files to open.
"""
import dataclasses
import functools
import importlib.util
import itertools
import math
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.std import tqdm  # tqdm.write: one line between whatever bars are showing

from .. import compilation
from ..config import LoopConfig
from ..parallel import local_rows
from ..precision import overflow_verdict
from .progressive import STAGE_COLUMNS, StagedSteps
from .run_dir import RunFolder, load_last
from .steps import Steps
from .tasks import Task

TIMING_COLUMNS = ("img_per_s", "seconds")  # the only columns that differ between identical runs
LOSS_SCALE_COLUMNS = ("loss_scale", "skipped_steps")  # with fp16 loss scaling: the scale, the steps it skipped
PREFETCH = 2  # batches put on the devices ahead of the step


# ---- progress bars: widgets in a notebook that has them (Kaggle's), text bars in a terminal, none in a notebook
# without ``ipywidgets`` (nbmake), where ``tqdm.auto``'s text fallback would leave carriage-return fragments in the
# saved output and the loop's line per evaluation is the progress
@functools.cache
def _bar_class():
    """The tqdm class for this process, or None where no bar renders cleanly."""
    try:
        from IPython import get_ipython  # only to ask whether this is a notebook
    except ImportError:
        return tqdm
    if type(get_ipython()).__name__ != "ZMQInteractiveShell":  # a terminal, or no IPython shell (None)
        return tqdm
    if importlib.util.find_spec("ipywidgets") is None:  # tqdm.notebook needs it to draw
        return None
    from tqdm.notebook import tqdm as notebook_tqdm  # imports ipywidgets: only in a notebook that has them

    return notebook_tqdm


def progress_bar(*, disable: bool = False, **kwargs):
    """A tqdm bar (``write`` included) for this environment; a disabled text bar where none renders."""
    cls = _bar_class()
    return tqdm(disable=True, **kwargs) if cls is None else cls(disable=disable, **kwargs)


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
    """Base for user hooks: override what you need. ``on_eval_end`` may return True (or a reason) to stop."""

    def on_run_start(self, state, history: list[dict]) -> None: ...
    def on_epoch_start(self, epoch: int) -> None: ...
    def on_log(self, step: int, scalars: Mapping[str, float]) -> None: ...
    def on_eval_end(self, row: dict, host_state) -> bool | str | None: ...
    def on_epoch_end(self, epoch: int, host_state) -> None: ...
    def on_run_end(self, result: FitResult) -> None: ...


def _as_hooks(hooks: Sequence) -> list:
    """Hooks as they are; a plain function as the ``on_eval_end`` of one."""
    return [h if any(hasattr(h, m) for m in vars(Hook) if m.startswith("on_")) else SimpleNamespace(on_eval_end=h)
            for h in hooks]


_add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))


def _accumulate(total, new):
    return new if total is None else _add(total, new)


def _is_main() -> bool:
    return jax.process_index() == 0


def evaluate(steps: Steps, state, batches: Iterable[dict], *, prefetch: int = PREFETCH, progress: bool = False,
             desc: str = "eval") -> dict:
    """Sums of the eval step over every *global* batch (``state`` on the devices), on the host; each process
    keeps its own rows of each batch, so every process runs as many steps whatever the files' sizes."""
    total = None
    bar = progress_bar(desc=desc, leave=False, disable=not (progress and _is_main()), unit="batch")
    for batch in steps.prefetch(map(local_rows, batches), prefetch):
        total = _accumulate(total, steps.evaluate(state, batch))
        bar.update(1)
    bar.close()
    if total is None:
        raise ValueError(f"{desc}: the batches were empty")
    return steps.get(total)


def fit(steps: Steps, state, train_batches: Callable[[int], Iterable[dict]], settings: LoopConfig, *,
        val_batches: Callable[[], Iterable[dict]] | None = None, out_dir: str | Path | None = None,
        lr_schedule: Callable[[int], float] | None = None, hooks: Sequence = (), writers: Sequence = (),
        resume: bool = False, manifest: dict | None = None, report: dict | None = None, progress: bool = True,
        stages: Sequence = ()) -> FitResult:
    """Trains ``state`` (a host TrainState) as ``settings`` say (the config's ``loop`` section, ``steps_per_epoch``
    given: ``--epochs`` of it, or ``--steps``); returns the final host state and the history.

    ``val_batches()`` yields the validation split (without it the ``val_`` columns are NaN). ``manifest``
    goes into each checkpoint's JSON, ``report`` into ``metrics.json``; ``writers`` get the scalars (their
    caller closes them). ``stages``: ``(Stage, Steps)`` of a progressive run (:mod:`.progressive`): each
    stage trains with its own steps, its rows say ``stage`` and ``image_size``, its first step is timed.
    """
    if settings.steps_per_epoch is None:
        raise ValueError("fit needs the loop's steps_per_epoch (run.resolve's plan has it: the training examples // "
                         "the global batch)")
    settings.check()  # its own refusals, named, before any step (a run checked its config already: cheap again)
    loop = _Loop(steps, state, settings, train_batches, val_batches, lr_schedule=lr_schedule,
                 hooks=_as_hooks(hooks), writers=list(writers), progress=progress and _is_main(), stages=stages)
    folder = None
    if out_dir is not None:
        folder = RunFolder(out_dir, loop.columns, monitor=settings.monitor, keep=settings.keep_checkpoints,
                           manifest=manifest,
                           report=report, write=_is_main())
    return loop.run(state, folder, resume=resume)


class _Loop:
    """The state of one ``fit`` call; ``run`` is the loop, the rest are its actions."""

    def __init__(self, steps: Steps, state, settings: LoopConfig, train_batches, val_batches, *, lr_schedule,
                 hooks: list, writers: list, progress: bool, stages: Sequence):
        self.steps, self.settings, self.task = steps, settings, steps.config.task
        self.total_steps = settings.total_steps(settings.steps_per_epoch)
        self.train_batches, self.val_batches, self.lr_schedule = train_batches, val_batches, lr_schedule
        self.hooks, self.writers, self.show = hooks, writers, progress
        self.columns = history_columns(self.task, loss_scaling=state.loss_scale is not None, staged=bool(stages))
        if settings.monitor not in self.columns:
            raise ValueError(f"monitor {settings.monitor!r} is not a history column of this task; choose one of "
                             f"{', '.join(c for c in self.columns if c not in ('epoch', 'step') + TIMING_COLUMNS)}")
        self.mode = self.task.mode(settings.monitor) if settings.monitor_mode == "auto" else settings.monitor_mode
        self.staged = StagedSteps(stages, epochs=self._epoch_of(self.total_steps - 1)) if stages else None
        self.stage = None  # progressive: the stage now training
        self.stage_compile_s: dict[str, float] = {}  # stage number -> its first step's compiling, in this process
        self.folder: RunFolder | None = None
        self.history: list[dict] = []
        self.pending = None  # device sums of the train steps since the last history row
        self.window = None  # device sums since the last log
        self.best = self.best_sums = None
        self.stop_reason = "completed"
        self.checkpoint_s = 0.0  # the training thread's time on checkpoints: pulling the state, waiting for a write

    def _epoch_of(self, step: int) -> int:
        return step // self.settings.steps_per_epoch + 1

    def _lr(self, step: int) -> float:
        return float(self.lr_schedule(step)) if self.lr_schedule is not None else float("nan")

    def _call_hooks(self, method: str, *args) -> list:
        return [getattr(h, method)(*args) for h in self.hooks if hasattr(h, method)]

    def _improves(self, row: dict, best: dict | None) -> bool:
        """Better than the best so far by more than ``min_delta``; NaN never is."""
        monitor, min_delta = self.settings.monitor, self.settings.min_delta
        if not math.isfinite(row[monitor]):
            return False
        if best is None:
            return True
        delta = row[monitor] - best[monitor]
        return delta < -min_delta if self.mode == "min" else delta > min_delta

    def _early_stop(self) -> str | None:
        """The reason to stop once ``patience`` evaluations have passed since the best one."""
        patience, best, last = self.settings.patience, self.best, self.history[-1] if self.history else None
        if patience is None or best is None or sum(row["step"] > best["step"] for row in self.history) < patience:
            return None
        return (f"early stopping after epoch {last['epoch']} (step {last['step']}): {self.settings.monitor} did not "
                f"improve for {patience} evaluation(s) (best {best[self.settings.monitor]:.4f} at step {best['step']})")

    def _emit(self, step: int, scalars: dict) -> None:
        if _is_main():
            for writer in self.writers:
                writer.write(step, scalars)

    # ---- the loop
    def run(self, state, folder: RunFolder | None, *, resume: bool) -> FitResult:
        self.folder = folder
        pending_host = None
        if resume and folder is not None and (folder.path / "last.msgpack").is_file():
            state, self.history, pending_host = load_last(folder.path / "last.msgpack", state, self.columns)
            if _is_main():
                tqdm.write(f"resumed from {folder.path / 'last.msgpack'}: {len(self.history)} evaluation(s) done, "
                           f"step {int(state.step)}")
        if folder is not None and folder.write:
            folder.path.mkdir(parents=True, exist_ok=True)
        for row in self.history:  # the best of a resumed run's rows
            self.best = row if self._improves(row, self.best) else self.best
        self.stop_reason = self._early_stop() or "completed"
        dev_state = self.steps.put_state(state)
        self.pending = self.steps.put_state(pending_host) if pending_host else None
        host_state = state
        self.clock = {"log": time.perf_counter(), "row": time.perf_counter()}
        self.compiled_before = compilation.seconds()
        self.first_step_from = (self.clock["row"], self.compiled_before)  # (time, compile seconds); None once reported
        self._call_hooks("on_run_start", state, self.history)
        step = int(state.step)
        try:
            while step < self.total_steps and self.stop_reason == "completed":
                dev_state, host_state, step = self._run_epoch(dev_state, host_state, step)
        except BaseException:
            if folder is not None:  # the save under way completes: it is what a resumed run starts from
                folder.writes.wait(raise_error=False)
            raise
        if folder is not None:  # also after a resume that found the run already complete
            started = time.perf_counter()
            folder.finish(self.history, **self._reports())
            self.checkpoint_s += time.perf_counter() - started
        if self.best is not None:  # the best row once more, for comparing runs (TensorBoard's hparams, W&B)
            self._emit(self.history[-1]["step"], {f"best/{k}": v for k, v in self.best.items()
                                                  if k.startswith(("train_", "val_"))})
        if _is_main() and self.stop_reason != "completed":
            tqdm.write(self.stop_reason)
        result = FitResult(state=host_state, history=self.history, best=self.best, stop_reason=self.stop_reason,
                           best_sums=self.best_sums)
        self._call_hooks("on_run_end", result)
        return result

    def _run_epoch(self, dev_state, host_state, step: int):
        settings, epoch = self.settings, self._epoch_of(step)
        start, end = (epoch - 1) * settings.steps_per_epoch, min(epoch * settings.steps_per_epoch, self.total_steps)
        self._call_hooks("on_epoch_start", epoch)
        bar = progress_bar(total=end - start, initial=step - start, disable=not self.show, unit="step",
                           desc=f"epoch {epoch}/{self._epoch_of(self.total_steps - 1)}")
        train = self._enter_stage(epoch)
        batches = itertools.islice(self.train_batches(epoch), step - start, end - start)  # a resumed epoch skips
        for batch in self.steps.prefetch(batches, PREFETCH):
            dev_state, metrics = train(dev_state, batch)
            self.pending, self.window = _accumulate(self.pending, metrics), _accumulate(self.window, metrics)
            step += 1
            if self.first_step_from is not None:
                self._report_first_step(metrics)
            bar.update(1)
            if step % settings.log_every == 0 or step == end:
                self._log(dev_state, step, epoch, bar)
            evaluate_now = (step % settings.eval_every == 0) if settings.eval_every else step == end
            evaluate_now = evaluate_now or step == self.total_steps
            if evaluate_now or (settings.checkpoint_every and step % settings.checkpoint_every == 0):
                host_state = self._save_point(dev_state, step, epoch, evaluate_now)
            if self.stop_reason != "completed":
                break
        bar.close()
        if step < end and self.stop_reason == "completed":
            raise ValueError(f"train data for epoch {epoch} ran out after {step - start} of {end - start} steps: use "
                             "repeat=True or fewer steps per epoch")
        if step == end:
            self._call_hooks("on_epoch_end", epoch, host_state)
        return dev_state, host_state, step

    def _enter_stage(self, epoch: int):
        """The train step of ``epoch``; a progressive run's stage changing here has its first step timed again."""
        if self.staged is None:
            return self.steps.train
        stage, steps = self.staged.at(epoch)
        if stage != self.stage:
            self.stage, self.first_step_from = stage, (time.perf_counter(), compilation.seconds())
        return steps.train

    # ---- actions
    def _log(self, dev_state, step: int, epoch: int, bar) -> None:
        host = self.steps.get(self.window)  # the one device -> host sync of the window
        sums, optim = host["task"], host["optim"]
        _check_finite(float(sums["loss_sum"]), "training loss", epoch=epoch, step=step)
        seconds = max(time.perf_counter() - self.clock["log"], 1e-9)
        running = self.task.finish(sums, full=False)
        n = max(int(optim["steps"]), 1)  # the steps applied (fp16 loss scaling may skip some)
        scalars = {**{f"train/{k}": v for k, v in running.items()},
                   **{k: float(v) / n for k, v in optim.items() if k not in ("steps", "skipped")},
                   "train/img_per_s": int(sums["count"]) / seconds}
        scale = None if dev_state.loss_scale is None else self.steps.get(dev_state.loss_scale)
        scalars.update(_loss_scale_figures(scale))
        scalars.update(StagedSteps.fields(self.stage) if self.stage is not None else {})
        if scale is not None and (stuck := overflow_verdict(scale)):
            raise TrainingDiverged(f"{stuck} by step {step} (epoch {epoch}): skipped steps change nothing, so the "
                                   "checkpoints hold the last good state (try --precision bf16 or fp32, or a "
                                   "lower --lr)")
        scalars["lr"] = self._lr(step - scalars.get("skipped_steps", 0))
        bar.set_postfix(loss=f"{running['loss']:.4f}", acc=f"{running['acc']:.3f}",
                        img_s=f"{scalars['train/img_per_s']:.0f}")
        self._emit(step, scalars)
        self._call_hooks("on_log", step, scalars)
        self.window, self.clock["log"] = None, time.perf_counter()

    def _save_point(self, dev_state, step: int, epoch: int, evaluate_now: bool):
        """The state pulled to the host (refused if a parameter is NaN or infinite), evaluated if it is time, saved."""
        started = time.perf_counter()
        host_state = self.steps.get(dev_state)
        if not all(np.isfinite(leaf).all() for leaf in jax.tree.leaves(host_state.params)):
            raise TrainingDiverged(f"a parameter became NaN or infinite by step {step}; stopped before writing "
                                   "anything, so the checkpoints hold the last good state")
        self.checkpoint_s += time.perf_counter() - started
        improved = self._evaluate(dev_state, host_state, step, epoch) if evaluate_now else False
        if self.folder is not None and self.folder.write:
            started = time.perf_counter()
            pending = None if self.pending is None else self.steps.get(self.pending)
            self.folder.save(host_state, self.history, pending, epoch=epoch, best=self.best if improved else None,
                             reports=self._reports() if evaluate_now else None)
            self.checkpoint_s += time.perf_counter() - started
        if evaluate_now:  # after the save is queued: a hook that stops the run stops it after this save
            stops = [stop for stop in self._call_hooks("on_eval_end", self.history[-1], host_state) if stop]
            if stops:
                self.stop_reason = (stops[0] if isinstance(stops[0], str) else
                                    f"stopped by a hook after epoch {epoch} (step {step})")
        return host_state

    def _evaluate(self, dev_state, host_state, step: int, epoch: int) -> bool:
        """Adds the history row of ``step``; True when it is the best so far."""
        train_seconds = time.perf_counter() - self.clock["row"]
        train_sums = self.steps.get(self.pending)["task"]
        train = self.task.finish(train_sums, full=False)
        row = {"epoch": epoch, "step": step, **{c: float("nan") for c in self.columns[2:]}}
        row.update(StagedSteps.fields(self.stage) if self.stage is not None else {})
        row.update({f"train_{k}": v for k, v in train.items() if f"train_{k}" in row})
        row["img_per_s"] = int(train_sums["count"]) / max(train_seconds, 1e-9)
        scalars = {"epoch": epoch, **{f"train_epoch/{k}": v for k, v in train.items()}}
        sums = None
        if self.val_batches is not None:
            started = time.perf_counter()
            sums = evaluate(self.steps, dev_state, self.val_batches(), progress=self.show)
            val = self.task.finish(sums)
            _check_finite(val["loss"], "validation loss", epoch=epoch, step=step)
            row.update({f"val_{k}": v for k, v in val.items()})
            scalars.update({**{f"val/{k}": v for k, v in val.items()},
                            "val/img_per_s": int(sums["count"]) / (time.perf_counter() - started)})
        self._emit(step, scalars)
        row.update(_loss_scale_figures(host_state.loss_scale))
        row["lr"] = self._lr(step - row.get("skipped_steps", 0))  # the schedule counts applied steps only
        row["seconds"] = time.perf_counter() - self.clock["row"]
        self.clock["row"] = time.perf_counter()
        self.pending = None
        self.history.append(row)
        improved = self._improves(row, self.best)
        if improved:
            self.best, self.best_sums = row, sums
        if _is_main():
            tqdm.write(_format_row(row, self.settings.monitor, improved))
        self.stop_reason = self._early_stop() or self.stop_reason
        return improved

    def _report_first_step(self, metrics) -> None:
        """One line (one sync) per run or stage: its first step's seconds, and how many of them were compiling."""
        jax.block_until_ready(metrics)
        (started, compiled_before), self.first_step_from = self.first_step_from, None
        took, compiled = time.perf_counter() - started, compilation.seconds() - compiled_before
        where = ""
        if self.stage is not None:
            self.stage_compile_s[str(self.stage.number)] = round(compiled, 3)
            where = f"stage {self.stage.number}/{len(self.staged.stages)} at {self.stage.image_size}px: "
        if _is_main():
            tqdm.write(f"{where}first step after {took:.1f} s, {compiled:.1f} s of it compiling")

    def _reports(self) -> dict:
        """``metrics.json`` besides the history: best, stop reason, this process's compiling (and each stage's),
        the training thread's seconds on checkpoints."""
        stages = {} if self.staged is None else {"stage_compile_s": dict(self.stage_compile_s)}
        return {"best": self.best, "stop_reason": self.stop_reason, "checkpoint_s": round(self.checkpoint_s, 3),
                "compile_s": round(compilation.seconds() - self.compiled_before, 3), **stages}


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
