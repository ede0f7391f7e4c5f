"""``tune``: an Optuna study whose trials are runs of :func:`~kaggle_utils.run.train` (or cross-validations).

Trial K is the run folder ``OUT/trial-K/`` (``folds``: a CV folder scored by its folds' mean), its objective its
best monitored value, judged at each evaluation by a pruner through a loop hook. The study is ``OUT/study.db``
(Optuna's SQLite storage): a killed study resumes, finished trials kept, the one killed mid-way continued from
its last checkpoint. It ends with ``best_config.json`` (``train --config``), ``tune.json``, ``importance.png``.
"""
import argparse
import contextlib
import dataclasses
import functools
import json
import math
import shutil
from pathlib import Path

from .. import checkpoint
from ..config import ConfigError, TrainConfig, add_config_flags, flag_of, overrides
from ..report import fold_folders, read_metrics, write_importance
from ..train import Hook, TrainingDiverged, make_task
from .cv import cross_validate
from .resolve import check_config
from .trainer import train

PRUNERS = ("median", "halving", "none")
SPACE_HELP = "NAME=LOW:HIGH[:STEP], NAME=log:LOW:HIGH or NAME=A|B|C, comma-separated; NAME a train flag (e.g. lr)"


class _Refusal(argparse.ArgumentParser):
    def error(self, message):
        raise ConfigError(message)


def parse_space(text: str, config: TrainConfig) -> dict:
    """``text`` -> ``{flag: Optuna distribution}``, each bound and choice read by its flag and checked in ``config``."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # tune's alone

    parser, space = _Refusal(add_help=False), {}
    add_config_flags(parser, type(config))
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, spec = (part.strip() for part in item.partition("="))
        name = name.replace("-", "_")
        if name not in config.flat() or name in space or name.startswith("monitor") or not spec:
            raise ConfigError(f"--search {item!r}: give NAME=SPEC, NAME a train flag, once, not the monitor")

        def read(value: str, name=name, item=item):  # as the flag reads it; a boolean flag: true or false
            value = value.strip()
            words = [flag_of(name if value == "true" else f"no_{name}")] if value in ("true", "false") else \
                [flag_of(name), value]
            try:
                return getattr(parser.parse_args(words), name)
            except ConfigError as err:
                raise ConfigError(f"--search {item!r}: {err}") from None

        log, parts = spec.startswith("log:"), spec.removeprefix("log:").split(":")
        if "|" in spec:
            space[name] = CategoricalDistribution([read(v) for v in spec.split("|")])
        else:
            values = [read(v) for v in parts]
            if len(parts) not in ((2,) if log else (2, 3)) or not all(type(v) in (int, float) for v in values) or \
                    not values[0] < values[1] or (log and values[0] <= 0):
                raise ConfigError(f"--search {item!r}: numbers LOW < HIGH (log: LOW > 0) or choices ({SPACE_HELP})")
            kind = IntDistribution if all(type(v) is int for v in values) else FloatDistribution
            space[name] = kind(*values[:2], log=log, **({"step": values[2]} if len(values) > 2 else {}))
        for value in getattr(space[name], "choices", None) or (space[name].low, space[name].high):
            try:
                check_config(config.replace(**{name: value}))
            except ConfigError as err:
                raise ConfigError(f"--search {name}={value}: {err}") from None
    if not space:
        raise ConfigError(f"--search names nothing to search ({SPACE_HELP})")
    return space


class _Pruning(Hook):
    """Reports each evaluation's monitored value at its step (a CV trial adds its earlier folds' steps); stops the
    run where the pruner says so, and a pruned CV trial at the start of its next fold."""

    def __init__(self, trial, monitor: str, optuna):
        self.trial, self.monitor, self.optuna, self.steps_before, self.pruned = trial, monitor, optuna, 0, None

    def on_run_start(self, state, history):
        if self.pruned:
            raise self.optuna.TrialPruned(self.pruned)

    def on_eval_end(self, row, host_state):
        value = row[self.monitor]
        if math.isfinite(value):
            self.trial.report(value, self.steps_before + row["step"])
            if self.trial.should_prune():
                self.pruned = f"pruned by the tune's pruner at step {row['step']} ({self.monitor} {value:.4f})"
                return self.pruned

    def on_run_end(self, result):
        self.steps_before += result.history[-1]["step"] if result.history else 0


@dataclasses.dataclass(frozen=True)
class TuneResult:
    out: Path
    study: object  # the optuna.Study
    best_config: TrainConfig | None  # what best_config.json holds; None while no trial finished
    importance: dict  # parameter -> importance (fANOVA; empty where Optuna cannot rank them)


def tune(config: TrainConfig, space: str, out: str | Path, *, trials: int, folds: int | None = None,
         pruner: str = "median", resume: bool = False, overwrite: bool = False, progress: bool = True) -> TuneResult:
    """Runs the study of ``space`` around ``config`` in ``out`` until ``trials`` trials have finished."""
    try:
        import optuna  # only tune needs it (Kaggle's images have it)
    except ImportError:
        raise ConfigError("tune needs the optuna package: pip install optuna") from None
    out, dims, State = Path(out), parse_space(space, config), optuna.trial.TrialState  # parse_space checks config
    if trials < 1 or pruner not in PRUNERS:
        raise ConfigError(f"tune: --trials >= 1 (got {trials}), --pruner one of {', '.join(PRUNERS)} (got {pruner!r})")
    if (out / "study.db").exists() and not (resume or overwrite):
        raise ConfigError(f"--out {out} holds a study (study.db): --resume continues it, --overwrite starts again")
    for path in [out / "study.db", *out.glob("trial-*"), out / "best_config.json", out / "tune.json"] * overwrite:
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    monitor, mode = config.loop.monitor, config.loop.monitor_mode
    mode = make_task(config.task).mode(monitor) if mode == "auto" else mode
    pruning = {"median": optuna.pruners.MedianPruner(n_startup_trials=2),
               "halving": optuna.pruners.SuccessiveHalvingPruner(), "none": optuna.pruners.NopPruner()}[pruner]
    study = optuna.create_study(storage=f"sqlite:///{out / 'study.db'}", study_name="tune", load_if_exists=True,
                                direction={"min": "minimize", "max": "maximize"}[mode], pruner=pruning)
    study.sampler = optuna.samplers.TPESampler(seed=config.seed + len(study.trials))  # resumed: no replayed draws
    setup = json.loads(json.dumps({"flags": overrides(config), "search": space, "folds": folds}, default=list))
    if study.user_attrs.get("setup", setup) != setup:
        raise ConfigError(f"--resume: {out}'s study has other flags: {study.user_attrs['setup']} (or --overwrite)")
    study.set_user_attr("setup", setup)

    def run_trial(trial) -> None:
        folder, hook = out / f"trial-{trial.number}", _Pruning(trial, monitor, optuna)
        again = (folder / ("folds.csv" if folds else "last.msgpack")).is_file()
        print(f"tune: trial {trial.number} ({', '.join(f'{k} {v}' for k, v in trial.params.items())}) in {folder}")
        run = functools.partial(cross_validate, folds=folds) if folds else train
        try:
            run(config.replace(**trial.params), folder, hooks=[hook], resume=again, overwrite=not again,
                progress=progress)
        except optuna.TrialPruned:
            pass
        except TrainingDiverged as err:  # these values diverge: a finding, not a reason to stop the study
            print(f"tune: trial {trial.number} diverged: {err}")
            return study.tell(trial, state=State.FAIL)
        bests = [read_metrics(f).get("best") or {} for f in (fold_folders(folder) if folds else [folder])]
        values = [best.get(monitor) for best in bests]
        finite = not hook.pruned and all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)
        study.tell(trial, sum(values) / len(values) if finite else None,
                   state=State.PRUNED if hook.pruned else None if finite else State.FAIL)

    for killed in study.get_trials(states=(State.RUNNING,)):  # killed mid-way: goes on in its folder
        run_trial(optuna.trial.Trial(study, killed._trial_id))
    while sum(t.state.is_finished() for t in study.trials) < trials:
        run_trial(study.ask(dims))
    return _finish(optuna, study, config, out)


def _finish(optuna, study, config, out) -> TuneResult:
    """``best_config.json``, ``tune.json`` and ``importance.png``: what the study found."""
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    best, importance = (study.best_trial if complete else None), {}
    with contextlib.suppress(ValueError, RuntimeError):  # a ranking is worth less than the study's end
        importance = dict(optuna.importance.get_param_importances(study)) if len(complete) >= 2 else {}
    record = {"monitor": config.loop.monitor, "direction": study.direction.name.lower(), "importance": importance,
              "best": None if best is None else {"trial": best.number, "value": best.value, "params": best.params},
              "trials": [{"trial": t.number, "state": t.state.name.lower(), "value": t.value, "params": t.params,
                          "seconds": t.duration.total_seconds() if t.duration else None} for t in study.trials]}
    checkpoint.atomic_write_text(out / "tune.json", json.dumps(record, indent=2) + "\n")
    best_config = config.replace(**best.params) if best else None
    if best is not None:
        text = json.dumps({"given": overrides(best_config), "tune": record["best"]}, indent=2, default=list)
        checkpoint.atomic_write_text(out / "best_config.json", text + "\n")
    write_importance(out, importance, config.loop.monitor)
    return TuneResult(out, study, best_config, importance)
