"""A run or CV folder in words and pictures (the end of a run or a prediction, ``report OUT``), rebuilt from the
files a run wrote, with no model and no data: the same lines for a finished, resumed or later-reported run; and
what a ``tune`` study found, from ``OUT/tune.json``.
"""
import json
import re
import statistics
from pathlib import Path
from typing import Sequence

from .. import checkpoint
from .curves import CURVES_FILE, IMPORTANCE_FILE, write_curves
from .tables import COUNTS_FILE, PER_CLASS_FILE, counts_record, read_counts, write_per_class

METRICS_FILE = "metrics.json"
_FOLD = re.compile(r"^fold(\d+)$")


class ReportError(checkpoint.CheckpointError):
    """Not a run (or CV) folder of the kit, or a run file that cannot be read: a kind of unreadable run."""


def read_metrics(out: Path) -> dict:
    path = Path(out) / METRICS_FILE
    try:
        report = json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{out} is not a run folder of the kit (no {METRICS_FILE})") from None
    except ValueError as err:
        raise ReportError(f"{path} is not valid JSON ({err})") from None
    if not isinstance(report, dict) or not isinstance(report.get("history"), list):
        raise ReportError(f"{path} has no 'history' list: not a metrics file written by the kit")
    return report


def fold_folders(path: Path) -> list[Path]:
    """The ``foldK/`` run folders of a CV folder, in fold order (empty for anything else)."""
    found = [(int(m.group(1)), p) for p in Path(path).iterdir()
             if p.is_dir() and (m := _FOLD.match(p.name)) and (p / METRICS_FILE).is_file()]
    return [p for _, p in sorted(found)]


def redraw(out: Path) -> list[str]:
    """``curves.png`` and ``per_class.csv`` of one run folder again; one line per file or per reason it is not."""
    out = Path(out)
    report = read_metrics(out)
    lines = []
    try:
        lines.append(f"wrote {write_curves(out, report, title=out.name)}")
    except ModuleNotFoundError as err:
        lines.append(f"no {CURVES_FILE}: {err.name} is not installed (pip install matplotlib)")
    try:
        counts = read_counts(out)
    except ValueError as err:
        lines.append(f"no {PER_CLASS_FILE}: {err}")
    else:
        lines.append(f"wrote {write_per_class(out, counts)}" if counts is not None else
                     f"no {PER_CLASS_FILE}: the run stored no validation counts ({COUNTS_FILE}; a run before "
                     "reporting, or a task with neither a confusion matrix nor per-class counts)")
    return lines


def finish_run(out: str | Path, sums: dict, class_names: Sequence[str], best: dict | None) -> list[str]:
    """The end of a run: the best evaluation's validation ``sums`` stored as ``val_counts.json`` (so a report never
    evaluates again), then ``curves.png`` and ``per_class.csv`` drawn; the lines saying what was written."""
    record = counts_record(sums, class_names, best)
    if record is not None:
        checkpoint.atomic_write_text(Path(out) / COUNTS_FILE, json.dumps(record) + "\n")
    return redraw(Path(out))


def _best(report: dict) -> tuple[str, float | None]:
    """``best MONITOR V at epoch E, step S (its other validation scores)`` of a run's metrics, and V (None: there is
    no best row)."""
    best, monitor = report.get("best"), report.get("monitor", "?")
    value = best.get(monitor) if best else None
    if value is None:
        return f"best: none ({monitor} was never finite); stop: {report.get('stop_reason')}", None
    others = [f"{k} {v:.4g}" for k, v in best.items() if k.startswith("val_") and k != monitor
              and isinstance(v, (int, float))]
    return (f"best {monitor} {value:.4f} at epoch {best['epoch']}, step {best['step']}"
            + (f" ({', '.join(others)})" if others else "")), float(value)


def report_command(path: str | Path) -> list[str]:
    """Redraws a run folder, or each fold of a CV folder; the lines to print. Raises :class:`ReportError`."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path} is not a folder (give a run folder or a CV folder of foldK/ run folders)")
    folds = [path] if (path / METRICS_FILE).is_file() else fold_folders(path)
    if not folds:
        raise ReportError(f"{path} is neither a run folder (no {METRICS_FILE}) nor a CV folder "
                          f"(no fold0/, fold1/, ... holding {METRICS_FILE})")
    lines, values = [], []
    for fold in folds:
        line, value = _best(read_metrics(fold))
        lines += [*redraw(fold), f"{fold.name}: {line}"]
        values.append(value)
    known = [v for v in values if v is not None]
    if len(known) > 1:
        lines.append(f"mean of the folds' best scores over {len(known)} folds: {statistics.mean(known):.4f} +- "
                     f"{statistics.stdev(known):.4f} (std)")
    return lines


# --------------------------------------------------------------------------- the blocks a run and a prediction end with

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


def _time_lines(report: dict, wall_s: float | None) -> list[str]:
    """Total time; the first interval (it pays the compile) against the later ones; training images/s."""
    history = report.get("history") or []
    seconds = [row["seconds"] for row in history if row.get("seconds") is not None]
    parts = [f"{_duration(wall_s)} total" if wall_s is not None else f"{_duration(sum(seconds))} in the loop"]
    if "compile_s" in report and report["compile_s"] is not None:
        parts.append(f"compile {_duration(report['compile_s'])}")
    if report.get("checkpoint_s") is not None:  # the training thread's part; the writes are a background thread's
        parts.append(f"checkpoints {report['checkpoint_s']:.1f} s of the training thread")
    if seconds:
        unit = "epoch" if len({row["epoch"] for row in history}) == len(history) else "evaluation interval"
        parts.append(f"first {unit} {_duration(seconds[0])} (with compile)")
        if len(seconds) > 1:
            parts.append(f"later ones {_duration(statistics.mean(seconds[1:]))} on average")
    lines = ["time: " + ", ".join(parts)]
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
    head = (f"run finished: {out} (step {last.get('step', 0)}, epoch {last.get('epoch', 0)}; "
            f"{report.get('stop_reason', '?')})")
    return _block(head, [_best(report)[0], *_time_lines(report, wall_s), _file_line(out), *next_steps])


def _model_line(member, tta: bool | None) -> str:
    """One model of a prediction (a ``run.Member``): its checkpoint and when it was saved, weight, size, TTA."""
    try:
        saved = json.loads(checkpoint.manifest_path(member.file).read_text())
    except (OSError, ValueError, TypeError):
        saved = {}
    when = f"step {saved['step']}" if saved.get("step") is not None else ""
    if saved.get("monitor") and saved.get("value") is not None:
        when += f", {saved['monitor']} {saved['value']:.4f}"
    config = member.config
    flip = config.task.tta if tta is None else tta
    return (f"  {member.file or member.path}" + (f" ({when})" if when else "") + f": weight {member.weight:.3f}, "
            f"{config.data.eval_image_size or config.model.image_size} px, " + ("flip TTA" if flip else "no TTA"))


def prediction_lines(out: str | Path, members: Sequence, *, tta: bool | None, rows: int, test: str,
                     wall_s: float | None = None, next_steps: Sequence[str] = ()) -> list[str]:
    """The block ``predict`` ends with: the ``run.Member`` s of the mean (``tta``: as given, None: each run's own)."""
    kind = "the weighted mean" if len({round(m.weight, 9) for m in members}) > 1 else "the mean"
    head = (f"predicted: {rows} test images of {test} with {len(members)} model(s), {kind} of their probabilities"
            if len(members) > 1 else f"predicted: {rows} test images of {test} with one model")
    body = [_model_line(m, tta) for m in members]
    if wall_s is not None:
        body.append(f"time: {_duration(wall_s)} total (reading the models, compiling, predicting)")
    return _block(head, [*body, _file_line(Path(out), ("submission.csv", "probabilities.csv")), *next_steps])


def _block(head: str, body: list[str]) -> list[str]:
    rule = "-" * min(max(len(head), 40), 100)
    return [rule, head, *body, rule]


def _cell(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def tune_lines(out: str | Path) -> list[str]:
    """The trials as a table, the best one with its flags, the flags' importance, the command that trains it."""
    out = Path(out)
    record = json.loads((out / "tune.json").read_text())
    trials, best = record["trials"], record["best"]
    names = sorted({name for trial in trials for name in trial["params"]})
    states = ", ".join(f"{sum(t['state'] == s for t in trials)} {s}" for s in sorted({t["state"] for t in trials}))
    lines = [f"tune: {len(trials)} trials in {out} ({states}); objective {record['monitor']} ({record['direction']})",
             "  ".join(f"{c:>12}" for c in ("trial", "state", "value", *names))]
    for trial in trials:
        cells = (trial["trial"], trial["state"], trial["value"], *(trial["params"].get(n) for n in names))
        lines.append("  ".join(f"{_cell(c):>12}" for c in cells))
    if best is None:
        return lines + ["best: none (no trial finished with a finite value)"]
    lines.append(f"best: trial {best['trial']}, {record['monitor']} {best['value']:.4f}: "
                 + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in best["params"].items()))
    if record["importance"]:
        lines.append(f"importance ({out / IMPORTANCE_FILE}): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in record["importance"].items()))
    return lines + [f"next: python -m kaggle_utils train --config {out / 'best_config.json'} --out {out}/best "
                    "(flags override the file, e.g. more --epochs)"]
