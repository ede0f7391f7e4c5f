"""``tune``: the search space checked before anything runs, pruning through the loop's hook, a study killed and
resumed without repeating trials, best_config.json retrained to its trial's score, ``train --config``."""
import json
import re
import signal
import sqlite3
import sys
import time

import jax.numpy as jnp
import optuna
import pytest

from kaggle_utils import job, run
from kaggle_utils.config import ConfigError, LoopConfig, TrainConfig, config_from_args, config_from_file
from kaggle_utils.run.tune import _Pruning, parse_space
from kaggle_utils.train import fit

from job_helpers import TEST_MODEL, finish, job_process
from test_train_loop import make_run, train_batches, val_batches


def test_the_space_is_read_by_the_flags_own_types():
    space = parse_space("lr=log:1e-4:3e-2, label-smoothing=0:0.2, epochs=2:8:2, augment=none|randaugment-device,"
                        "tta=true|false", TrainConfig())
    assert space["lr"] == optuna.distributions.FloatDistribution(1e-4, 3e-2, log=True)
    assert space["label_smoothing"] == optuna.distributions.FloatDistribution(0.0, 0.2)
    assert space["epochs"] == optuna.distributions.IntDistribution(2, 8, step=2)
    assert space["augment"].choices == ("none", "randaugment-device") and space["tta"].choices == (True, False)


@pytest.mark.parametrize("text, message", [
    ("learning_rate=log:1e-4:1e-2", "'learning_rate=log:1e-4:1e-2': give NAME=SPEC, NAME a train flag"),
    ("lr=log:0:1e-2", "argument --lr: 0 is not a learning rate"),
    ("weight_decay=log:0:0.1", "numbers LOW < HIGH (log: LOW > 0)"),
    ("lr=0.1:0.01", "numbers LOW < HIGH"),
    ("augment=none|cutout", "invalid choice: 'cutout'"),
    ("label_smoothing=0:1.5", "--search label_smoothing=1.5: "),
    ("monitor=val_loss|val_f1", "not the monitor"),
    ("lr=1e-3:1e-2,lr=1e-4:1e-3", "once"),
    ("", "names nothing to search"),
])
def test_a_bad_space_is_named_before_anything_runs(text, message, tmp_path):
    with pytest.raises(ConfigError, match=re.escape(message)):
        run.tune(TrainConfig(), text, tmp_path / "study", trials=2)
    assert not (tmp_path / "study").exists()


def test_optuna_missing_is_one_line_naming_the_package(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        job.main(["tune", "--trials", "2", "--search", "lr=log:1e-4:1e-2", "--out", str(tmp_path / "study")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("tune needs the optuna package: pip install optuna")
    assert not (tmp_path / "study").exists()


def test_the_pruner_stops_a_run_at_an_evaluation_through_the_loop_hook():
    steps, state, schedule = make_run(epochs=3)
    study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    settings = LoopConfig(steps_per_epoch=8, epochs=3)
    good = study.ask()
    hook = _Pruning(good, "val_f1", optuna)
    result = fit(steps, state, train_batches, settings, val_batches=val_batches, lr_schedule=schedule, hooks=[hook],
                 progress=False)
    assert hook.pruned is None and len(result.history) == 3 and result.stop_reason == "completed"
    study.tell(good, result.best["val_f1"])
    assert study.trials[0].intermediate_values == {r["step"]: r["val_f1"] for r in result.history}

    idle = study.ask()  # a learning rate of 0 learns nothing: below the median at its first evaluation
    hook = _Pruning(idle, "val_f1", optuna)
    steps, state, schedule = make_run(schedule=lambda step: jnp.zeros(()), epochs=3)
    result = fit(steps, state, train_batches, settings, val_batches=val_batches, lr_schedule=schedule, hooks=[hook],
                 progress=False)
    assert len(result.history) == 1 and result.stop_reason.startswith("pruned by the tune's pruner at step 8")


def test_train_config_reads_a_run_s_flags_and_the_command_line_overrides_them(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"config": {}, "given": {"lr": 0.02, "freeze": ["stem"]}}))
    config = config_from_file(tmp_path / "config.json")
    assert config.optim.lr == 0.02 and config.model.freeze == ("stem",) and config.loop.epochs == 10
    args = job.build_parser().parse_args(["train", "--config", str(tmp_path / "config.json"), "--epochs", "3",
                                          "--out", "x"])
    given = config_from_args(args, base=config_from_file(args.config))
    assert (given.optim.lr, given.loop.epochs) == (0.02, 3)
    for command in (["train"], ["cv", "--folds", "2"]):  # the job's own reading of --config, each command that has it
        args = job.build_parser().parse_args([*command, "--config", str(tmp_path / "config.json"), "--epochs", "3",
                                              "--out", "x"])
        given = job._config(args)
        assert (given.optim.lr, given.model.freeze, given.loop.epochs) == (0.02, ("stem",), 3), command
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match=f"--config {tmp_path / 'bad.json'}: cannot read it as JSON"):
        config_from_file(tmp_path / "bad.json")


# seed and the loop's log interval: neither changes a compiled program, so every trial (and each process) reads the
# session's cache instead of compiling; two numbers, so the three draws differ
TUNE = ["tune", "--trials", "3", "--search", "seed=0:99,log_every=1:9", "--model", TEST_MODEL, "--batch-size", "32",
        "--steps", "6", "--eval-every", "2", "--no-progress"]


@pytest.mark.slow  # three job processes
def test_a_killed_study_resumes_without_repeating_trials_and_its_best_config_retrains_to_its_score(
        sample, tmp_path):
    out = tmp_path / "study"
    proc = job_process([*TUNE, "--data-dir", sample.root], out, tmp_path)
    deadline = time.monotonic() + 900
    while not (out / "trial-1" / "last.msgpack").is_file():  # trial 1 has saved a checkpoint: kill it there
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "trial 1 did not start in time"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    finished_before = {p.name: (p / "metrics.json").stat().st_mtime for p in (out / "trial-0",)}

    log = finish(job_process([*TUNE, "--data-dir", sample.root, "--resume"], out, tmp_path))
    assert "tune: trial 0" not in log  # a finished trial is not run again
    assert "tune: trial 1" in log and f"resumed from {out / 'trial-1' / 'last.msgpack'}" in log
    assert "tune: trial 2" in log
    assert {p: (out / p / "metrics.json").stat().st_mtime for p in finished_before} == finished_before
    record = json.loads((out / "tune.json").read_text())
    assert [t["trial"] for t in record["trials"]] == [0, 1, 2]
    assert len({json.dumps(t["params"], sort_keys=True) for t in record["trials"]}) == 3  # no draw replayed
    assert {t["state"] for t in record["trials"]} <= {"complete", "pruned"}
    with sqlite3.connect(out / "study.db") as db:  # one study, three trials: nothing was added twice
        assert db.execute("select count(*) from trials").fetchone() == (3,)
    for trial in record["trials"]:  # a pruned run stopped at an evaluation point and says so
        stop = json.loads((out / f"trial-{trial['trial']}" / "metrics.json").read_text())["stop_reason"]
        assert stop.startswith("pruned by the tune's pruner at step") == (trial["state"] == "pruned"), stop
    best = record["best"]
    assert best["value"] == max(t["value"] for t in record["trials"] if t["state"] == "complete")
    assert f"best: trial {best['trial']}, val_f1 {best['value']:.4f}" in log

    finish(job_process(["train", "--config", str(out / "best_config.json"), "--no-progress"], tmp_path / "best",
                       tmp_path))
    retrained = json.loads((tmp_path / "best" / "metrics.json").read_text())["best"]["val_f1"]
    assert retrained == best["value"]  # the same run, step for step
