"""``fit``: epochs of training steps, evaluation, history, checkpoints, resume, early stopping.

One function and a few helpers, in the order a reader meets them:

* An epoch is ``steps_per_epoch`` steps over ``train_batches(epoch)``: a *function* of the
  epoch number, so a resumed run rebuilds exactly the data order of the interrupted one
  (seed the shuffle with the epoch).
* Step metrics are sums kept on the device and pulled every ``log_every`` steps (one sync per
  pull, never one per step); the tqdm bar shows loss, accuracy and images/s.
* After each epoch: evaluation over the whole validation split (exact counts, padding
  masked), a history row, then the files, written by process 0 only and each atomically:
  ``best.msgpack`` (variables of the best epoch by ``monitor``), ``last.msgpack`` (the whole
  training state and the history: the resume point), ``metrics.json`` and ``history.csv``.
* ``resume=True`` restores ``last.msgpack``: step, optimizer state (hence the schedule), RNG
  and history; best epoch and early-stopping patience are recomputed from the history.
* A non-finite loss stops training with :class:`TrainingDiverged` before anything is written,
  so ``last.msgpack`` stays the last good state.
* ``callbacks``: functions ``(row, state) -> stop?`` called at each epoch end, for anything else.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization
from tqdm.auto import tqdm

from .. import checkpoint
from ..metrics import summarize
from .steps import Steps

__all__ = ["HISTORY_COLUMNS", "TIMING_COLUMNS", "FitResult", "TrainingDiverged", "evaluate", "fit",
           "load_last", "monitor_mode"]

HISTORY_COLUMNS = ("epoch", "step", "train_loss", "train_acc", "val_loss", "val_acc", "val_f1", "lr",
                   "img_per_s", "seconds")
TIMING_COLUMNS = ("img_per_s", "seconds")  # the only columns that differ between identical runs
_INT_COLUMNS = ("epoch", "step")


class TrainingDiverged(RuntimeError):
    """The training loss became NaN or infinite; the last checkpoint is the last good state."""


@dataclasses.dataclass
class FitResult:
    state: Any  # host (numpy) TrainState after the last completed epoch
    history: list[dict]
    best: dict | None  # history row of the best epoch by the monitored metric
    stop_reason: str


def monitor_mode(monitor: str) -> str:
    """Losses are minimised, everything else (accuracy, F1) maximised."""
    return "min" if "loss" in monitor else "max"


_add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))


def _accumulate(total, new):
    return new if total is None else _add(total, new)


def _is_main() -> bool:
    return jax.process_index() == 0


def evaluate(steps: Steps, state, batches: Iterable[dict], *, prefetch: int = 2, progress: bool = False,
             desc: str = "eval") -> dict:
    """Sums of the eval step over every batch (``state`` already on the devices), on the host."""
    total = None
    bar = tqdm(desc=desc, leave=False, disable=not (progress and _is_main()), unit="batch")
    for batch in steps.prefetch(batches, prefetch):
        total = _accumulate(total, steps.evaluate(state, batch))
        bar.update(1)
    bar.close()
    if total is None:
        raise ValueError(f"{desc}: the batches were empty")
    return steps.get(total)


# --------------------------------------------------------------------------- files


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _history_to_arrays(history: Sequence[dict]) -> dict:
    return {c: np.asarray([row[c] for row in history], np.float64) for c in HISTORY_COLUMNS}


def _history_from_arrays(arrays: dict) -> list[dict]:
    n = len(arrays[HISTORY_COLUMNS[0]])
    return [{c: (int(arrays[c][i]) if c in _INT_COLUMNS else float(arrays[c][i])) for c in HISTORY_COLUMNS}
            for i in range(n)]


def _write_reports(out_dir: Path, history: list[dict], best: dict | None, monitor: str, stop_reason: str) -> None:
    clean = lambda row: None if row is None else {k: _json_safe(v) for k, v in row.items()}  # noqa: E731
    report = {"monitor": monitor, "best": clean(best), "stop_reason": stop_reason,
              "history": [clean(row) for row in history]}
    checkpoint.atomic_write_text(out_dir / "metrics.json", json.dumps(report, indent=2, allow_nan=False) + "\n")
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=HISTORY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    checkpoint.atomic_write_text(out_dir / "history.csv", text.getvalue())


def load_last(path: str | Path, template) -> tuple[Any, list[dict]]:
    """(host state, history) from a ``last.msgpack``, every state key and shape checked."""
    raw = checkpoint.load(path)
    for key in ("state", "history"):
        if key not in raw:
            raise checkpoint.CheckpointError(f"{path} is not a training checkpoint (no {key!r} entry)")
    checkpoint.check_tree(raw["state"], serialization.to_state_dict(template), what=f"training state in {path}")
    state = serialization.from_state_dict(template, raw["state"])
    state = jax.tree.map(lambda v, t: np.asarray(v, np.asarray(t).dtype), state, template)
    return state, _history_from_arrays(raw["history"])


def _improves(row: dict, best: dict | None, monitor: str) -> bool:
    """Strictly better than the best so far (an equal score is no improvement); NaN never is."""
    value = row[monitor]
    if not math.isfinite(value):
        return False
    if best is None:
        return True
    return value < best[monitor] if monitor_mode(monitor) == "min" else value > best[monitor]


def _best_row(history: list[dict], monitor: str) -> dict | None:
    best = None
    for row in history:
        if _improves(row, best, monitor):
            best = row
    return best


# --------------------------------------------------------------------------- the loop


def _train_epoch(steps: Steps, state, batches, n_steps: int, *, epoch: int, log_every: int, bar, prefetch: int):
    """``n_steps`` train steps; returns the state and the epoch's summed metrics (host)."""
    total = window = None  # device-side sums: of the epoch, and since the last pull
    window_start, done = time.perf_counter(), 0
    for batch in steps.prefetch(itertools.islice(batches, n_steps), prefetch):
        state, metrics = steps.train(state, batch)
        total, window = _accumulate(total, metrics), _accumulate(window, metrics)
        done += 1
        bar.update(1)
        if done % log_every == 0 or done == n_steps:
            host = steps.get(window)  # the one device -> host sync of the window
            _check_finite(float(host["loss_sum"]), epoch=epoch, step=done)
            images_per_s = int(host["count"]) / max(time.perf_counter() - window_start, 1e-9)
            running = summarize(host)
            bar.set_postfix(loss=f"{running['loss']:.4f}", acc=f"{running['acc']:.3f}", img_s=f"{images_per_s:.0f}")
            window, window_start = None, time.perf_counter()
    if done < n_steps:
        raise ValueError(f"train data for epoch {epoch} ran out after {done} of {n_steps} steps: "
                         f"use repeat=True or fewer steps per epoch")
    return state, steps.get(total)


def _check_finite(loss_sum: float, *, epoch: int, step: int) -> None:
    if not math.isfinite(loss_sum):
        raise TrainingDiverged(f"training loss became {loss_sum} in epoch {epoch} (by step {step} of the epoch); "
                               f"stopped before writing anything, so last.msgpack is the last good state")


def fit(steps: Steps, state, train_batches: Callable[[int], Iterable[dict]], *, steps_per_epoch: int,
        epochs: int | None = None, total_steps: int | None = None,
        val_batches: Callable[[], Iterable[dict]] | None = None, out_dir: str | Path | None = None,
        monitor: str = "val_f1", patience: int | None = None, log_every: int = 20,
        lr_schedule: Callable[[int], float] | None = None, callbacks: Sequence[Callable] = (),
        resume: bool = False, manifest: dict | None = None, progress: bool = True, prefetch: int = 2) -> FitResult:
    """Trains ``state`` (a host TrainState) and returns the final host state and the history.

    Give ``epochs`` (of ``steps_per_epoch`` steps) or ``total_steps`` (the last epoch may be
    shorter). ``val_batches()`` yields the validation split; without it the history has NaN
    validation columns and ``monitor`` should be a training column. ``manifest`` (e.g. the
    model configuration) goes into the JSON written beside each checkpoint.
    """
    if (epochs is None) == (total_steps is None):
        raise ValueError("give exactly one of epochs or total_steps")
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    if monitor not in HISTORY_COLUMNS:
        raise ValueError(f"monitor {monitor!r} is not a history column {HISTORY_COLUMNS}")
    total_steps = epochs * steps_per_epoch if epochs is not None else total_steps
    num_epochs = -(-total_steps // steps_per_epoch)
    out_dir = Path(out_dir) if out_dir is not None else None
    write = out_dir is not None and _is_main()
    if write:
        out_dir.mkdir(parents=True, exist_ok=True)
    manifest = dict(manifest or {})
    show = progress and _is_main()  # bars
    report = _is_main()  # one line per epoch

    history: list[dict] = []
    last_path = out_dir / "last.msgpack" if out_dir is not None else None
    if resume and last_path is not None and last_path.is_file():
        state, history = load_last(last_path, state)
        if report:
            tqdm.write(f"resumed from {last_path}: {len(history)} epoch(s) done, step {int(state.step)}")
    dev_state = steps.put_state(state)
    host_state = state
    best = _best_row(history, monitor)
    stop_reason = _early_stop(history, best, monitor, patience) or "completed"  # a resumed run may be done

    for epoch in range(len(history) + 1, num_epochs + 1):
        if stop_reason != "completed":
            break
        start = time.perf_counter()
        n_steps = min(steps_per_epoch, total_steps - (epoch - 1) * steps_per_epoch)
        bar = tqdm(total=n_steps, desc=f"epoch {epoch}/{num_epochs}", disable=not show, unit="step")
        train_start = time.perf_counter()
        dev_state, train_sums = _train_epoch(steps, dev_state, train_batches(epoch), n_steps, epoch=epoch,
                                             log_every=log_every, bar=bar, prefetch=prefetch)
        train_seconds = time.perf_counter() - train_start
        bar.close()
        row = {"epoch": epoch, "step": 0, **{c: float("nan") for c in HISTORY_COLUMNS[2:]}}
        train = summarize(train_sums, "train_")
        row.update(train_loss=train["train_loss"], train_acc=train["train_acc"],
                   img_per_s=train["train_count"] / train_seconds)
        if val_batches is not None:
            val = summarize(evaluate(steps, dev_state, val_batches(), prefetch=prefetch, progress=show), "val_")
            row.update(val_loss=val["val_loss"], val_acc=val["val_acc"], val_f1=val["val_f1"])
        host_state = steps.get(dev_state)
        row["step"] = int(host_state.step)
        row["lr"] = float(lr_schedule(row["step"])) if lr_schedule is not None else float("nan")
        row["seconds"] = time.perf_counter() - start
        history.append(row)
        improved = _improves(row, best, monitor)
        if improved:
            best = row
        if write:
            _save_epoch(out_dir, host_state, history, best if improved else None, monitor, manifest)
        if report:
            tqdm.write(_format_row(row, monitor, improved))
        if any(bool(cb(row, host_state)) for cb in list(callbacks)):
            stop_reason = f"stopped by a callback after epoch {epoch}"
        else:
            stop_reason = _early_stop(history, best, monitor, patience) or stop_reason
        if write:
            _write_reports(out_dir, history, best, monitor, stop_reason)
    if write and history:  # also after a resume that found the run already complete
        _write_reports(out_dir, history, best, monitor, stop_reason)
    if report and stop_reason != "completed":
        tqdm.write(stop_reason)
    return FitResult(state=host_state, history=history, best=best, stop_reason=stop_reason)


def _early_stop(history: list[dict], best: dict | None, monitor: str, patience: int | None) -> str | None:
    """The reason to stop when ``patience`` epochs have passed since the best one, else None."""
    if patience is None or best is None or history[-1]["epoch"] - best["epoch"] < patience:
        return None
    return (f"early stopping after epoch {history[-1]['epoch']}: {monitor} did not improve for {patience} "
            f"epoch(s) (best {best[monitor]:.4f} at epoch {best['epoch']})")


def _save_epoch(out_dir: Path, state, history: list[dict], new_best: dict | None, monitor: str,
                manifest: dict) -> None:
    # best first: a kill between the two writes resumes from the previous epoch and redoes this one
    if new_best is not None:
        info = {**manifest, "epoch": new_best["epoch"], "step": new_best["step"], "monitor": monitor,
                "value": _json_safe(new_best[monitor])}
        checkpoint.save(out_dir / "best.msgpack", state.variables(), manifest=info)
    last = {"state": serialization.to_state_dict(state), "history": _history_to_arrays(history)}
    checkpoint.save(out_dir / "last.msgpack", last, manifest={**manifest, "epoch": history[-1]["epoch"],
                                                               "step": history[-1]["step"]})


def _format_row(row: dict, monitor: str, improved: bool) -> str:
    shown = ", ".join(f"{k} {row[k]:.4f}" for k in ("train_loss", "train_acc", "val_loss", "val_acc", "val_f1")
                      if math.isfinite(row[k]))
    mark = f" (best {monitor})" if improved else ""
    return f"epoch {row['epoch']}: {shown}, {row['img_per_s']:.0f} img/s, {row['seconds']:.1f}s{mark}"
