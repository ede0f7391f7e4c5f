"""The files of a run folder: checkpoints (last K + best), history, and reading them back.

* ``last.msgpack``: the whole training state, the history and the training statistics
  gathered since the last history row: everything a resumed run needs to continue mid-epoch
  and write the same history. With ``keep > 1`` the previous ``last`` files stay as
  ``ckpt-STEP.msgpack`` (hard links, so keeping them costs no copy), the newest ``keep - 1``.
* ``best.msgpack``: the model variables of the best evaluation by the monitored metric.
* ``metrics.json`` and ``history.csv``: the history, one row per evaluation.

Each file is written atomically and beside a JSON manifest (:mod:`kaggle_utils.checkpoint`), by
process 0 only. Order matters where a kill can fall between two writes: ``best`` before
``last`` (a resumed run redoes that interval and writes the same ``best`` again), the old
``last`` linked as a ``ckpt`` before the new one replaces it.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
from flax import serialization

from .. import checkpoint

__all__ = ["CHECKPOINT_PATTERN", "load_last", "previous_checkpoints", "save_best", "save_last", "write_reports"]

CHECKPOINT_PATTERN = re.compile(r"^ckpt-(\d+)\.msgpack$")
_INT_COLUMNS = ("epoch", "step", "stage", "image_size", "skipped_steps")


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _clean(row: dict | None) -> dict | None:
    return None if row is None else {k: _json_safe(v) for k, v in row.items()}


def write_reports(out_dir: Path, history: list[dict], columns: Sequence[str], *, best: dict | None, monitor: str,
                  stop_reason: str, extra: dict | None = None) -> None:
    report = {"monitor": monitor, "best": _clean(best), "stop_reason": stop_reason,
              "history": [_clean(row) for row in history], **(extra or {})}
    checkpoint.atomic_write_text(out_dir / "metrics.json", json.dumps(report, indent=2, allow_nan=False) + "\n")
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    writer.writerows(history)
    checkpoint.atomic_write_text(out_dir / "history.csv", text.getvalue())


def _history_to_arrays(history: Sequence[dict], columns: Sequence[str]) -> dict:
    return {c: np.asarray([row[c] for row in history], np.float64) for c in columns}


def _history_from_arrays(arrays: dict, columns: Sequence[str], path) -> list[dict]:
    if set(arrays) != set(columns):
        raise checkpoint.CheckpointError(
            f"{path} holds a history with columns {sorted(arrays)}, this run's task makes {sorted(columns)}: "
            "it was written by a run with another task or metrics")
    n = len(arrays[columns[0]])
    return [{c: (int(arrays[c][i]) if c in _INT_COLUMNS else float(arrays[c][i])) for c in columns}
            for i in range(n)]


def save_best(out_dir: Path, variables: Any, row: dict, *, monitor: str, manifest: dict) -> None:
    info = {**manifest, "epoch": row["epoch"], "step": row["step"], "monitor": monitor,
            "value": _json_safe(row[monitor])}
    checkpoint.save(out_dir / "best.msgpack", variables, manifest=info)


def previous_checkpoints(out_dir: Path) -> list[Path]:
    """The kept ``ckpt-STEP.msgpack`` files, oldest first."""
    found = [(int(m.group(1)), p) for p in out_dir.glob("ckpt-*.msgpack") if (m := CHECKPOINT_PATTERN.match(p.name))]
    return [p for _, p in sorted(found)]


def _keep_previous_last(out_dir: Path, last: Path) -> None:
    """Links the current ``last`` (and its manifest) as ``ckpt-STEP`` before it is replaced."""
    manifest = checkpoint.manifest_path(last)
    if not last.is_file() or not manifest.is_file():
        return
    step = json.loads(manifest.read_text()).get("step")
    if not isinstance(step, int):
        return
    kept = out_dir / f"ckpt-{step:09d}.msgpack"
    for src, dst in ((last, kept), (manifest, checkpoint.manifest_path(kept))):
        if dst.exists():
            continue
        try:
            os.link(src, dst)  # the file is replaced by rename, never rewritten: a link is a safe copy
        except OSError:
            shutil.copyfile(src, dst)


def save_last(out_dir: Path, state: Any, history: list[dict], columns: Sequence[str], pending: dict | None, *,
              epoch: int, manifest: dict, keep: int) -> None:
    """The resume point; with ``keep > 1`` the previous ones stay as ``ckpt-STEP`` files."""
    last = out_dir / "last.msgpack"
    if keep > 1:
        _keep_previous_last(out_dir, last)
    payload = {"state": serialization.to_state_dict(state), "history": _history_to_arrays(history, columns),
               "pending": {} if pending is None else pending}
    checkpoint.save(last, payload, manifest={**manifest, "epoch": epoch, "step": int(state.step)})
    kept = previous_checkpoints(out_dir)
    for old in kept[:max(len(kept) - (keep - 1), 0)]:
        old.unlink(missing_ok=True)
        checkpoint.manifest_path(old).unlink(missing_ok=True)


def load_last(path: str | Path, template, columns: Sequence[str]) -> tuple[Any, list[dict], dict | None]:
    """(host state, history, pending training sums) from a ``last.msgpack``, every state leaf checked."""
    raw = checkpoint.load(path)
    for key in ("state", "history"):
        if key not in raw:
            raise checkpoint.CheckpointError(f"{path} is not a training checkpoint (no {key!r} entry)")
    if "loss_scale" not in raw["state"]:  # written before states could keep fp16's loss scale
        raw["state"]["loss_scale"] = None
    checkpoint.check_tree(raw["state"], serialization.to_state_dict(template), what=f"training state in {path}")
    state = serialization.from_state_dict(template, raw["state"])
    state = jax.tree.map(lambda v, t: np.asarray(v, np.asarray(t).dtype), state, template)
    pending = raw.get("pending") or None
    if pending is not None and "task" not in pending:  # written before the step grouped its outputs
        optim = {k: pending.pop(k) for k in ("grad_norm", "param_norm", "steps")}
        pending = {"task": pending, "optim": optim}
    return state, _history_from_arrays(raw["history"], columns, path), pending
