"""The blocks a run and a prediction end with: what was done, how well, time, the files, the next command.

Why a block: a terminal run used to end on one ``wrote submission.csv`` line (nothing at all
without a test split), so a user had to open ``metrics.json`` to learn whether the run was
any good. Everything here is read from the run folder, so the same lines describe a finished
run, a resumed one, or a folder reported later. ``predict`` ends the same way
(:func:`prediction_lines`): which checkpoints with which weights and TTA, how many rows, the files.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Sequence

from .curves import CURVES_FILE
from .folder import read_metrics
from .tables import PER_CLASS_FILE

__all__ = ["FILES", "next_lines", "prediction_lines", "summary_lines"]

# the files a user looks for, in the order they are named; anything else in the folder is the run's own
FILES = ("submission.csv", "probabilities.csv", CURVES_FILE, PER_CLASS_FILE, "metrics.json", "history.csv",
         "best.msgpack", "last.msgpack", "config.json", "lr_find.png", "lr_find.csv", "tensorboard/", "data/")


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


def _best_line(report: dict) -> str:
    best, monitor = report.get("best"), report.get("monitor", "?")
    if not best or best.get(monitor) is None:
        return f"best: none ({monitor} was never finite); stop: {report.get('stop_reason')}"
    others = [f"{k} {best[k]:.4g}" for k in best
              if k.startswith("val_") and k != monitor and isinstance(best[k], (int, float))]
    return (f"best {monitor} {best[monitor]:.4f} at epoch {best['epoch']}, step {best['step']}"
            + (f" ({', '.join(others)})" if others else ""))


def _time_lines(report: dict, wall_s: float | None) -> list[str]:
    """Total time; the first interval (it pays the compile) against the later ones; training images/s."""
    history = report.get("history") or []
    seconds = [row["seconds"] for row in history if row.get("seconds") is not None]
    lines = []
    total = f"{_duration(wall_s)} total" if wall_s is not None else f"{_duration(sum(seconds))} in the loop"
    parts = [total]
    if "compile_s" in report and report["compile_s"] is not None:
        parts.append(f"compile {_duration(report['compile_s'])}")
    if report.get("checkpoint_s") is not None:  # pulling the state, waiting for a previous write: the rest is a thread's
        parts.append(f"checkpoints {report['checkpoint_s']:.1f} s of the training thread")
    if seconds:
        unit = "epoch" if len({row["epoch"] for row in history}) == len(history) else "evaluation interval"
        parts.append(f"first {unit} {_duration(seconds[0])} (with compile)")
        if len(seconds) > 1:
            parts.append(f"later ones {_duration(statistics.mean(seconds[1:]))} on average")
    lines.append("time: " + ", ".join(parts))
    speeds = [row["img_per_s"] for row in history if row.get("img_per_s") is not None]
    if speeds:
        speed = (f"{statistics.median(speeds[1:]):.0f} images/s training (median after the first interval)"
                 if len(speeds) > 1 else f"{speeds[0]:.0f} images/s training (first interval, with compile)")
        lines.append("speed: " + speed)
    return lines


def _file_line(out: Path, files: Sequence[str] = FILES) -> str:
    shown = []
    for name in files:
        path = out / name.rstrip("/")
        if not (path.is_dir() if name.endswith("/") else path.is_file()):
            continue
        if name in ("submission.csv", "probabilities.csv"):
            with open(path) as f:
                rows = sum(1 for _ in f) - 1
            name = f"{name} ({rows} rows)"
        shown.append(name)
    return f"files in {out}: " + ", ".join(shown)


def next_lines(out: Path, *, data_dir: str | None, submission: bool) -> list[str]:
    """What to run next: submit, or predict with this run; without a test split, look at the curves first."""
    out = Path(out)
    data = data_dir if data_dir and Path(data_dir, "test").is_dir() else (
        str(out / "data") if (out / "data" / "test").is_dir() else "DIR")
    predict = f"python -m kaggle_utils predict --checkpoint {out} --data-dir {data} --out {out}/predict"
    if submission:
        return [f"next: submit {out}/submission.csv, or predict again (another test split, --tta):", f"  {predict}"]
    return [f"next: look at {out}/{CURVES_FILE} (live: tensorboard --logdir {out}/tensorboard), then predict a "
            "test split:", f"  {predict}"]


def summary_lines(out: str | Path, *, wall_s: float | None = None, next_steps: Sequence[str] = ()) -> list[str]:
    """The end-of-run block of the run folder ``out`` (``wall_s``: the run's total time, if measured)."""
    out = Path(out)
    report = read_metrics(out)
    history = report.get("history") or []
    last = history[-1] if history else {}
    head = f"run finished: {out} (step {last.get('step', 0)}, epoch {last.get('epoch', 0)}; {report.get('stop_reason', '?')})"
    body = [_best_line(report), *_time_lines(report, wall_s), _file_line(out), *next_steps]
    rule = "-" * min(max(len(head), 40), 100)
    return [rule, head, *body, rule]


def _model_line(model: dict) -> str:
    """One model of a prediction: its checkpoint (and where it was saved), weight, evaluation size, TTA."""
    saved = f"step {model['step']}" if model.get("step") is not None else ""
    if model.get("monitor") and model.get("value") is not None:
        saved += f", {model['monitor']} {model['value']:.4f}"
    return (f"  {model['checkpoint']}" + (f" ({saved})" if saved else "") + f": weight {model['weight']:.3f}, "
            f"{model['image_size']} px, " + ("flip TTA" if model["tta"] else "no TTA"))


def prediction_lines(out: str | Path, models: Sequence[dict], *, rows: int, test: str, wall_s: float | None = None,
                     next_steps: Sequence[str] = ()) -> list[str]:
    """The block ``predict`` ends with.

    ``models``: one dict per checkpoint of the mean (``checkpoint``, ``weight``, ``tta``,
    ``image_size``, and from its manifest ``step``, ``monitor``, ``value`` when known).
    """
    out = Path(out)
    kind = "the weighted mean" if len({round(m["weight"], 9) for m in models}) > 1 else "the mean"
    head = (f"predicted: {rows} test images of {test} with {len(models)} model(s), {kind} of their probabilities"
            if len(models) > 1 else f"predicted: {rows} test images of {test} with one model")
    body = [_model_line(m) for m in models]
    if wall_s is not None:
        body.append(f"time: {_duration(wall_s)} total (reading the models, compiling, predicting)")
    body += [_file_line(out, ("submission.csv", "probabilities.csv")), *next_steps]
    rule = "-" * min(max(len(head), 40), 100)
    return [rule, head, *body, rule]
