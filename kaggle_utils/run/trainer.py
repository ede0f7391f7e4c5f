"""``train(config, out)``: one whole run into a folder; the job, notebook 04 and any runner of several runs call it.

In the spirit of the Flax ImageNet example's ``train_and_evaluate(config, workdir)``. Every
check that can refuse the run (values, data, labels, test ids, model, weights, frozen parts,
monitor, the output folder's own run) runs before anything in ``out`` is written or removed:
a refused ``--overwrite`` leaves the previous run whole. Then, with ``lr="auto"``, the LR range
test (:mod:`.lr_find`; not on ``--resume``, which reads the rate found before from config.json),
the loop, then the test split predicted by the best checkpoint. The folder's pictures and tables (``curves.png``,
``per_class.csv``) come from :mod:`kaggle_utils.report`, called once at the end; what a caller
does around it (flags, words) is presentation.
"""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from .. import checkpoint, compilation, outdir
from ..config import TrainConfig
from ..train.writers import close_writers
from .build import build_model, build_training, fit_run, initial_variables, model_size, open_writers
from .data import RunData, commit_conversion, data_root, open_data
from .lr_find import reuse_found_lr, settle_lr
from .memory_plan import recorded_batch
from .resolve import Plan, check_config, resolve
from .saved import write_config

__all__ = ["RunResult", "predict_test_split", "train"]


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run did: its resolved config and plan, the loop's result, and the files it wrote."""

    out: Path
    config: TrainConfig  # resolved: what config.json records
    plan: Plan
    fit: object  # kaggle_utils.train.FitResult: history, best row, stop reason, final host state
    steps: object  # the compiled kaggle_utils.train.Steps, for more evaluation or prediction in-process
    submission: Path | None = None  # None without a test split
    test_ids: tuple[str, ...] = ()

    @property
    def best(self) -> dict | None:
        return self.fit.best

    @property
    def model_size(self) -> dict:
        """``params_trainable``, ``params_frozen``, ``gflops_per_image`` (one forward at the run's size, XLA's count)."""
        return self.plan.model_size

    @property
    def history(self) -> list[dict]:
        return self.fit.history


def _owned(out: Path):
    """The lock on ``out`` (process 0; the others write nothing)."""
    return outdir.owned(out) if jax.process_index() == 0 else contextlib.nullcontext(out)


def train(config: TrainConfig, out: str | Path, *, task=None, hooks: Sequence = (), writers: Sequence = (),
          data: RunData | None = None, resume: bool = False, overwrite: bool = False,
          progress: bool = True) -> RunResult:
    """Trains ``config`` into the folder ``out`` and predicts its test split; see the module docstring.

    ``task``: a :class:`~kaggle_utils.train.Task` instead of the config's (e.g. with
    ``with_metric``: its metrics can then be the ``monitor``). ``data``: a :class:`RunData`
    already opened (``open_data``) for this config, so its checks are not repeated.
    ``hooks`` and ``writers`` as for :func:`~kaggle_utils.train.fit`.
    """
    check_config(config, task)
    out = Path(out)
    lr_note = None
    main = jax.process_index() == 0
    with _owned(out), (contextlib.nullcontext(data.root) if data is not None else data_root(config, out)) as root:
        data = data if data is not None else open_data(config, root)
        chosen, batch_note = recorded_batch(config, out) if resume else (config, "")
        resolved, plan = resolve(chosen, data, task)
        plan = dataclasses.replace(plan, batch_fit=batch_note) if batch_note else plan
        if resume:  # --lr auto: the rate this run's range test found, kept in config.json
            resolved, plan, lr_note = reuse_found_lr(out, resolved, plan)
        model = build_model(resolved)
        variables = initial_variables(resolved, model)
        training = build_training(resolved, plan, model, variables, task=task)
        plan = dataclasses.replace(plan, model_size=model_size(resolved, model, variables))
        if main:  # every check passed: only now may the folder change
            outdir.prepare(out, resolved, resume=resume, overwrite=overwrite)
            checkpoint.remove_stale_temp_files(out)  # half-written files of a run killed mid-write
        compilation.enable_cache(resolved.loop.compile_cache or out / "jax_cache")
        data = commit_conversion(data, out)  # a --source conversion made for this run becomes OUT/data
        if resolved.optim.lr == "auto":
            resolved, plan, training, lr_note = settle_lr(resolved, plan, data, model, variables, out, task=task,
                                                          progress=progress)
        if main:
            print(plan.describe(resolved))
            write_config(out, resolved, plan, given=config, notes={"lr_find": lr_note} if lr_note else None)
        opened = open_writers(resolved, out)  # closed last: W&B then uploads the pictures and tables
        try:
            result = fit_run(resolved, plan, data, training, out, resume=resume, progress=progress, hooks=hooks,
                             writers=[*writers, *opened])
            best = _best_variables(out, result)
            # ---- reporting (presentation, above run/: a lazy import): val_counts.json, curves.png, per_class.csv
            from ..report import finish_run
            finish_run(out, resolved, plan, data, training.steps, best)
            # ----
            path, ids = None, ()
            if data.splits["test"]:
                path, ids = predict_test_split(training.steps, best, data.splits["test"], resolved,
                                               batch_size=plan.global_batch, stored_size=data.stored_size,
                                               out_dir=out)
        finally:
            close_writers(opened)
    return RunResult(out, resolved, plan, result, training.steps, path, tuple(str(i) for i in ids))


def _best_variables(out: Path, result) -> dict:
    """The best checkpoint's variables on every process (only process 0 has the file)."""
    final = result.state.variables()
    if result.best is None:
        return final
    if jax.process_index() == 0:
        variables = checkpoint.load(out / "best.msgpack", target=final)
    else:
        variables = jax.tree.map(np.zeros_like, final)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        variables = multihost_utils.broadcast_one_to_all(variables)
    return variables


def predict_test_split(steps, variables, files, config: TrainConfig, *, batch_size: int, stored_size: int,
                       out_dir: str | Path) -> tuple[Path, list[str]]:
    """``out_dir/submission.csv`` and ``probabilities.csv`` of a test split as ``config`` evaluates and names it."""
    from .predict import predict_member, write_predictions

    ids, probs = predict_member(steps, variables, files, config, batch_size=batch_size, stored_size=stored_size)
    path, _ = write_predictions(out_dir, ids, probs, config)
    return path, ids
