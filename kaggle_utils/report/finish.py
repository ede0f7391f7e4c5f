"""The end of a training run: the best checkpoint's validation counts stored, then the pictures and tables.

Why evaluate again: the loop keeps only the finished metrics of each evaluation, not the
confusion counts behind them, and the best checkpoint may be several evaluations old. One more
pass over the validation split with the best variables gives the exact counts of the checkpoint
that ``submission.csv`` is predicted with (through the run's own evaluation crop, as during
training); they are stored in ``val_counts.json`` so that a report never has to do this again.
"""
from __future__ import annotations

from pathlib import Path

import jax

from .folder import read_metrics, redraw
from .tables import counts_record, write_counts

__all__ = ["finish_run", "validation_sums"]


def validation_sums(config, plan, data, steps, variables) -> dict:
    """The evaluation step's sums over the whole validation split for ``variables`` (every process calls it)."""
    from ..run.build import val_dataset
    from ..train import evaluate, inference_state

    batches = val_dataset(config, plan, data)
    try:
        return evaluate(steps, steps.put_state(inference_state(variables)), batches, desc="best checkpoint on val")
    finally:
        batches.close()


def finish_run(out: str | Path, config, plan, data, steps, best_variables) -> list[str]:
    """Stores the best checkpoint's validation counts and draws ``curves.png`` and ``per_class.csv``.

    Called by :func:`kaggle_utils.run.train` on every process (the evaluation is collective);
    process 0 writes. Returns the lines saying what was written (empty on other processes).
    """
    out = Path(out)
    sums = validation_sums(config, plan, data, steps, best_variables)
    if jax.process_index() != 0:
        return []
    record = counts_record(sums, config.data.class_names, read_metrics(out).get("best"))
    if record is not None:
        write_counts(out, record)
    return redraw(out)
