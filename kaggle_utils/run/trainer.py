"""``train(config, out)``: one whole run into a folder, top to bottom: check, open the data, resolve, build, fit, write.

In the spirit of the Flax ImageNet example's ``train_and_evaluate(config, workdir)``: the job, notebook 04,
:func:`~kaggle_utils.run.cross_validate` and any runner of several runs call it. Every check that can refuse
the run (values, data, labels, test ids, model, weights, frozen parts, monitor, the folder's own run) runs
before anything in ``out`` is written or removed, so a refused ``--overwrite`` leaves the previous run whole.
"""
import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np
import optax
from jax.experimental import multihost_utils

from .. import checkpoint, compilation, models, outdir, report
from ..config import ConfigError, TrainConfig, overrides
from ..data import HostDataset
from ..train import (FitResult, Hook, MetricWriter, Steps, Task, TensorBoardWriter, WandbWriter, evaluate, fit,
                     inference_state)
from ..train.writers import close_writers
from . import thresholds
from .build import (Plan, Training, build_model, build_training, epoch_config, initial_variables, model_size,
                    train_dataset, val_dataset)
from .data import RunData, commit_conversion, run_data
from .lr_find import settle_lr
from .predict import labelled_probabilities, predict_split, write_predictions
from .resolve import check_config, resolve, run_task
from .saved import import_recorded_model
from .teacher import describe as describe_teaching, teach


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run did: its resolved config and plan, the loop's result, and the files it wrote."""

    out: Path
    config: TrainConfig  # resolved: what config.json records
    plan: Plan
    fit: FitResult  # history, best row, stop reason, final host state
    steps: Steps  # compiled, for more evaluation or prediction in-process
    submission: Path | None = None  # None without a test split
    test_ids: tuple[str, ...] = ()

    @property
    def best(self) -> dict | None:
        return self.fit.best

    @property
    def history(self) -> list[dict]:
        return self.fit.history


def train(config: TrainConfig, out: str | Path, *, task: Task | None = None,
          tx: optax.GradientTransformation | Callable[[optax.Schedule], optax.GradientTransformation] | None = None,
          variables: dict | None = None, teacher: str | Path | None = None, hooks: Sequence[Hook] = (),
          writers: Sequence[MetricWriter] = (), data: RunData | None = None, resume: bool = False,
          overwrite: bool = False, progress: bool = True) -> RunResult:
    """Trains ``config`` into ``out``, reports it and predicts its test split with the best checkpoint.

    ``task``: instead of the config's (``with_metric``: its metrics can be the ``monitor``), its values recorded in
    config.json in place of the defaults (:func:`~kaggle_utils.run.resolve.run_task`); ``tx``: any optax transform
    (or a function of the config's schedule returning one) instead of the config's optimizer; ``variables``: model
    variables to start from (any model's own pretrained ones: each leaf whose path and shape fit is taken, the rest
    initialised); the three recorded in config.json under ``task``, ``tx`` and ``variables``. ``teacher``: the
    config's ``--teacher`` (a CV, run or predict folder, or a CSV: README "Teachers"), recorded as the flag is.
    ``data``: already opened for this config; ``hooks``, ``writers``: as for :func:`~kaggle_utils.train.fit`.
    """
    if teacher is not None:
        if config.distill.teacher not in (None, str(teacher)):
            raise ConfigError(f"run.train(teacher={str(teacher)!r}) and --teacher {config.distill.teacher} disagree: "
                              "give one of them")
        config = config.replace(teacher=str(teacher))
    notes = {"task": _custom_task_note(task)} if task is not None else {}
    if resume:  # a model of yours, registered by the process that started the run: found where it recorded it
        recorded_model(config, Path(out))
    config, task = run_task(config, task)  # the task, built once; the config records what it trains with
    check_config(config, task)  # 1. check: values, model, weights, monitor; once
    if tx is not None and config.optim.lr == "auto":
        raise ConfigError("--lr auto sweeps the rate of the kit's optimizer; with run.train(tx=...) give a number")
    if variables is not None and (config.model.weights or config.model.init_from):
        raise ConfigError("run.train(variables=...) and --weights / --init-from each give the starting weights: "
                          "give one of them")
    notes.update({"tx": _custom_tx_note(tx)} if tx is not None else {})
    # config.json names the ported file the run fine-tuned and its digest
    read = {"weights": checkpoint.file_record(config.model.weights)} if config.model.weights is not None else {}
    out, main = Path(out), jax.process_index() == 0
    owned = outdir.owned(out) if main else contextlib.nullcontext()  # the lock on out (the others write nothing)
    with owned, run_data(config, out, data) as data:  # 2. open the data: splits, labels, test ids checked
        data = teach(config, data)  # --teacher, --pseudo-labels: fields of the training records, checked
        notes.update({"teaching": data.teaching} if data.teaching else {})
        chosen, batch_note, lr_note = resumed_config(config, out) if resume else (config, "", None)
        resolved, plan = resolve(chosen, data, task)  # 3. resolve: what the config left open, for this machine
        plan = dataclasses.replace(plan, batch_fit=batch_note) if batch_note else plan
        model = build_model(resolved)  # 4. build: model, variables, optimizer, steps
        notes.update({"variables": _variables_note(variables)} if variables is not None else {})
        variables = initial_variables(resolved, model, pretrained=variables)
        training = build_training(resolved, plan, model, variables, task=task, tx=tx)
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
            shown = [note for key, note in notes.items() if key not in ("variables", "teaching")]  # said already
            print(plan.describe(resolved) + describe_teaching(data.teaching) + "".join(f"; {note}" for note in shown))
            write_config(out, resolved, plan, given=config,
                         notes={**notes, **read, **({"lr_find": lr_note} if lr_note else {})})
        opened = open_writers(resolved, out)  # closed last: W&B then uploads the pictures and tables
        try:
            result = fit_run(resolved, plan, data, training, out, resume=resume, progress=progress, hooks=hooks,
                             writers=[*writers, *opened])  # 5. fit
            best = _best_variables(out, result)  # 6. write: the report, then the test split's predictions
            _report(out, resolved, plan, data, training.steps, result, best)
            decisions = _thresholds(out, resolved, plan, data, training.steps, best)
            submission, ids = None, []
            if data.splits["test"]:
                ids, probs = predict_split(training.steps, best, data.splits["test"], resolved,
                                           batch_size=plan.global_batch, stored_size=data.stored_size)
                submission, _ = write_predictions(out, ids, probs, resolved, thresholds=decisions)
        finally:
            close_writers(opened)
    return RunResult(out, resolved, plan, result, training.steps, submission, tuple(ids))


def recorded_model(config: TrainConfig, *folders: Path) -> None:
    """Registers ``config``'s model from the first of ``folders``' config.json that records its builder, where this
    process has not registered it (``--resume`` in a new process); nothing where none records one."""
    for record_file in (Path(folder) / "config.json" for folder in folders):
        try:
            record = json.loads(record_file.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("builder"):
            import_recorded_model(config, record, record_file)
            return


def resumed_config(config: TrainConfig, out: Path) -> tuple[TrainConfig, str, dict | None]:
    """``--resume``: ``config`` with what ``out/config.json`` records of its searches, which a new one could choose
    otherwise (another device, another JAX) so that the run could not continue: ``--batch-per-device auto``'s global
    batch, with the plan's note saying so, and ``--lr auto``'s found rate, with its ``lr_find`` note (kept for that
    rate given by hand too). Without a readable record, ``config`` as it is (resume then says why)."""
    path = Path(out) / "config.json"
    try:
        record = json.loads(path.read_text())
        batch, lr = record["config"]["data"]["batch_size"], record["config"]["optim"]["lr"]
        found = record.get("lr_find")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return config, "", None
    batch_note = ""
    if config.data.batch_per_device == "auto" and isinstance(batch, int) and batch >= 1:
        batch_note = f"batch per device auto: the global batch {batch} {path} records (--resume searches no new one)"
        config = config.replace(batch_per_device=None, memory_budget=None, batch_size=batch)
    if not (isinstance(found, dict) and isinstance(lr, (int, float)) and not isinstance(lr, bool)
            and lr == found.get("lr") and config.optim.lr in (lr, "auto")):
        return config, batch_note, None
    return config.replace(lr=float(lr)) if config.optim.lr == "auto" else config, batch_note, found


def _variables_note(variables: dict) -> dict:
    """config.json's record of ``run.train(variables=...)``: what they were (their leaves, values and digest)."""
    leaves = jax.tree.leaves(variables)
    return {"given": "run.train(variables=...)", "leaves": len(leaves), "values": int(sum(np.size(v) for v in leaves)),
            "sha256": checkpoint.digest(variables)}


def _custom_task_note(task: Task) -> str:
    """config.json's record of ``run.train(task=...)``: the task's class and its own metrics."""
    metrics = [name for name, _, _ in getattr(task, "user_metrics", ())]
    return (f"the task given to run.train, {type(task).__module__}.{type(task).__qualname__}"
            + (f" with metrics {', '.join(metrics)}" if metrics else ""))


def _custom_tx_note(tx: optax.GradientTransformation | Callable) -> str:
    """config.json's record of ``run.train(tx=...)``: the config fields its optimizer replaced."""
    fixed = isinstance(tx, optax.GradientTransformation)
    return (f"a custom optax transform{'' if fixed else ', ' + getattr(tx, '__qualname__', '?') + '(schedule),'} "
            f"replaced --optimizer and its settings{', --lr and --schedule (history lr: NaN)' if fixed else ''}")


def write_config(out_dir: str | Path, config: TrainConfig, plan: Plan, *, given: TrainConfig | None = None,
                 notes: dict | None = None) -> Path:
    """``config.json``: the resolved config (what ``--resume`` compares), the overrides as given, the plan and
    ``notes`` (e.g. ``lr_find``: how ``--lr auto`` found the lr; ``weights``: the ported file read and its sha256)."""
    path = Path(out_dir) / "config.json"
    builder = models.builder_path(config.model.name)
    record = {"config": config.to_dict(), "given": overrides(given or config), "plan": dataclasses.asdict(plan),
              **({"builder": builder} if builder else {}), **(notes or {})}
    checkpoint.atomic_write_text(path, json.dumps(record, indent=2, default=list) + "\n")
    return path


def run_manifest(config: TrainConfig, plan: Plan) -> dict:
    """What every checkpoint of a run carries: enough for :func:`load_run` to rebuild its model in a new process (a
    model of yours: where its builder lives)."""
    builder = models.builder_path(config.model.name)
    return {"kind": "kaggle_utils run", "config": config.to_dict(), "plan": dataclasses.asdict(plan),
            **({"builder": builder} if builder else {})}


def open_writers(config: TrainConfig, out_dir: str | Path) -> list[MetricWriter]:
    """The writers ``config`` asks for (process 0): TensorBoard in ``out_dir/tensorboard`` with the flags as its
    HParams, W&B (``--wandb``); the caller closes them (W&B then uploads the run folder's pictures and tables)."""
    loop, writers = config.loop, []
    if jax.process_index() == 0 and loop.tensorboard:
        writers.append(TensorBoardWriter(Path(out_dir) / "tensorboard", hparams=config.flat()))
    if jax.process_index() == 0 and loop.wandb:
        writers.append(WandbWriter(out_dir, project=loop.wandb, config=config.flat(), artifact=loop.wandb_artifact))
    return writers


def fit_run(config: TrainConfig, plan: Plan, data: RunData, training: Training, out_dir: str | Path | None, *,
            resume: bool = False, progress: bool = True, hooks: Sequence[Hook] = (),
            writers: Sequence[MetricWriter] = ()) -> FitResult:
    """The loop over ``data`` with the config's settings, ``writers`` (:func:`open_writers`), files in
    ``out_dir``."""
    opened: list[HostDataset] = []  # the epoch's training input, closed when the next epoch's opens

    def train_batches(epoch: int) -> HostDataset:  # with --progressive-stages: at the epoch's stage's size
        while opened:
            opened.pop().close()
        opened.append(train_dataset(epoch_config(config, plan.stages, epoch), plan, data, epoch))
        return opened[0]

    loop = dataclasses.replace(config.loop, steps_per_epoch=plan.steps_per_epoch)  # the section, its length known
    val = val_dataset(config, plan, data)
    try:
        return fit(training.steps, training.state, train_batches, loop,
                   val_batches=lambda: iter(val), out_dir=out_dir, lr_schedule=training.schedule, hooks=hooks,
                   writers=writers, resume=resume, manifest=run_manifest(config, plan), progress=progress,
                   report={**({"model": plan.model_size} if plan.model_size else {}), **(data.teaching or {})},
                   stages=tuple(zip(plan.stages, training.stage_steps)))
    finally:
        for dataset in [*opened, val]:
            dataset.close()


def _best_variables(out: Path, result: FitResult) -> dict:
    """The best checkpoint's variables on every process (only process 0 has the file)."""
    final = result.state.variables()
    if result.best is None:
        return final
    if jax.process_index() == 0:
        variables = checkpoint.load(out / "best.msgpack", target=final)
    else:
        variables = jax.tree.map(np.zeros_like, final)
    return multihost_utils.broadcast_one_to_all(variables) if jax.process_count() > 1 else variables


def _thresholds(out: Path, config: TrainConfig, plan: Plan, data: RunData, steps: Steps, best: dict
                ) -> np.ndarray | None:
    """A multi-label run's per-class thresholds, learnt on the validation split's probabilities from the best
    checkpoint (``--threshold auto``) or given, written to ``OUT/thresholds.json``; None for other tasks."""
    if config.task.task != "multilabel":
        return None
    with contextlib.closing(val_dataset(config, plan, data)) as batches:
        probs, labels = labelled_probabilities(steps, best, batches)
    record = thresholds.settle(config, probs, labels, config.data.class_names,
                               learnt_on="the validation split, best checkpoint")
    if jax.process_index() == 0:
        thresholds.write(out, record)
        print(thresholds.describe(record))
    return np.array(list(record["thresholds"].values()))


def _report(out: Path, config: TrainConfig, plan: Plan, data: RunData, steps: Steps, result: FitResult,
            best: dict) -> None:
    """``val_counts.json``, ``curves.png``, ``per_class.csv`` from the loop's sums of the best evaluation; evaluated
    again (collectively) only where this process did not make it (the best came before a ``--resume``)."""
    sums = result.best_sums
    if sums is None:
        with contextlib.closing(val_dataset(config, plan, data)) as batches:
            sums = evaluate(steps, steps.put_state(inference_state(best)), batches, desc="best checkpoint on val")
    if jax.process_index() == 0:
        report.finish_run(out, sums, config.data.class_names, result.best)
