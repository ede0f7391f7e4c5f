"""What a ``tune`` study found, from ``OUT/tune.json``: the block the command ends with, ``importance.png``."""
import json
from pathlib import Path

from .curves import new_figure, save_png

IMPORTANCE_FILE = "importance.png"


def write_importance(out: str | Path, importance: dict, monitor: str) -> Path | None:
    """A bar per searched flag: how much of the objective's variance it explains (Optuna's fANOVA); None: no bars."""
    if not importance:
        return None
    figure = new_figure(6, 1 + 0.4 * len(importance))
    axes = figure.add_subplot()
    axes.barh(list(importance)[::-1], list(importance.values())[::-1])
    axes.set_xlabel(f"importance for {monitor} (Optuna's fANOVA)")
    return save_png(figure, Path(out) / IMPORTANCE_FILE)


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
