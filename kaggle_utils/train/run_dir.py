"""The files of a run folder: ``last.msgpack`` (all a resume needs; with ``keep > 1`` the previous ones stay as
``ckpt-STEP`` hard links), ``best.msgpack``, ``metrics.json``, ``history.csv``; reading them back.

Process 0 writes them in a background thread in an order a kill cannot break: ``best`` before ``last`` (a
resume redoes that interval), the old ``last`` linked as a ``ckpt`` before the new one replaces it.
"""
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np
from flax import serialization

from .. import checkpoint

_INT_COLUMNS = ("epoch", "step", "stage", "image_size", "skipped_steps")


def _clean(row: dict | None) -> dict | None:
    """JSON's view of a row: NaN and infinities as null."""
    return None if row is None else {k: None if isinstance(v, float) and not math.isfinite(v) else v
                                     for k, v in row.items()}


class RunFolder:
    """The folder :func:`~kaggle_utils.train.fit` writes, off its thread: ``manifest`` goes into each checkpoint's
    JSON, ``report`` into ``metrics.json``. Every process may read (resume); only ``write=True`` writes."""

    def __init__(self, path, columns: Sequence[str], *, monitor: str, keep: int, manifest: dict | None = None,
                 report: dict | None = None, write: bool = True):
        self.path, self.columns, self.monitor, self.keep = Path(path), tuple(columns), monitor, keep
        self.manifest, self.report, self.write = dict(manifest or {}), dict(report or {}), write
        self.writes = checkpoint.BackgroundWrites()

    def save(self, state, history: list[dict], pending: dict | None, *, epoch: int, best: dict | None = None,
             reports: dict | None = None) -> None:
        """Queues ``best`` (its row, when it just improved), ``last``, then the reports (their fields, if given),
        after the previous save; ``state`` and ``pending`` are host trees the loop no longer changes."""
        if self.write:
            self.writes.submit(self._save, state, list(history), pending, epoch, best, reports)

    def _save(self, state, history, pending, epoch, best, reports) -> None:
        if best is not None:
            info = {**self.manifest, "epoch": best["epoch"], "step": best["step"], "monitor": self.monitor,
                    "value": _clean(best)[self.monitor]}
            checkpoint.save(self.path / "best.msgpack", state.variables(), manifest=info)
        last = self.path / "last.msgpack"
        if self.keep > 1:
            _keep_previous_last(self.path, last)
        payload = {"state": serialization.to_state_dict(state), "pending": {} if pending is None else pending,
                   "history": {c: np.asarray([row[c] for row in history], np.float64) for c in self.columns}}
        checkpoint.save(last, payload, manifest={**self.manifest, "epoch": epoch, "step": int(state.step)})
        kept = sorted(self.path.glob(f"ckpt-{'[0-9]' * 9}.msgpack"))  # the kept ones, oldest first (zero-padded)
        for old in kept[:max(len(kept) - (self.keep - 1), 0)]:
            old.unlink(missing_ok=True)
            checkpoint.manifest_path(old).unlink(missing_ok=True)
        if reports is not None:
            self._write_reports(history, **reports)

    def finish(self, history: list[dict], **reports) -> None:
        """Waits for the last save, then writes the reports: what a run leaves when ``fit`` returns."""
        self.writes.wait()
        if self.write and history:
            self._write_reports(history, **reports)

    def _write_reports(self, history: list[dict], *, best: dict | None, stop_reason: str, **extra) -> None:
        report = {"monitor": self.monitor, "best": _clean(best), "stop_reason": stop_reason,
                  "history": [_clean(row) for row in history], **self.report, **extra}
        checkpoint.atomic_write_text(self.path / "metrics.json", json.dumps(report, indent=2, allow_nan=False) + "\n")
        checkpoint.atomic_write_csv(self.path / "history.csv", self.columns, history)


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


def load_last(path: str | Path, template, columns: Sequence[str]) -> tuple[Any, list[dict], dict | None]:
    """(host state, history, pending training sums) from a ``last.msgpack``, every state leaf checked."""
    # a kill between last.msgpack's rename and its manifest's leaves an older manifest: a resume warns and goes on
    raw = checkpoint.load(path, accept_changed=True)
    for key in ("state", "history"):
        if key not in raw:
            raise checkpoint.CheckpointError(f"{path} is not a training checkpoint (no {key!r} entry)")
    checkpoint.check_tree(raw["state"], serialization.to_state_dict(template), what=f"training state in {path}")
    state = serialization.from_state_dict(template, raw["state"])
    state = jax.tree.map(lambda v, t: np.asarray(v, np.asarray(t).dtype), state, template)
    pending = raw.get("pending") or None
    arrays = raw["history"]
    if set(arrays) != set(columns):
        raise checkpoint.CheckpointError(f"{path} holds a history with columns {sorted(arrays)}, this run's task "
                                         f"makes {sorted(columns)}: it was written by a run with another task or "
                                         "metrics")
    history = [{c: (int(arrays[c][i]) if c in _INT_COLUMNS else float(arrays[c][i])) for c in columns}
               for i in range(len(arrays[columns[0]]))]
    return state, history, pending
