"""fit: history and files, resume == uninterrupted, early stopping, NaN guard, callbacks."""
import csv
import json

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint
from kaggle_utils.train import (HISTORY_COLUMNS, TIMING_COLUMNS, SoftmaxClassification, StepConfig, TrainingDiverged,
                                create_train_state,
                                fit, init_variables, make_optimizer, make_steps, warmup_cosine)
from train_helpers import TinyCNN, batches, digits

TRAIN, VAL = digits("train"), digits("val")
BATCH, STEPS_PER_EPOCH = 64, 8
CONFIG = StepConfig(num_classes=10, task=SoftmaxClassification(label_smoothing=0.05))


def train_batches(epoch):
    """Epoch-seeded shuffle: a resumed run rebuilds the same order."""
    return batches(*TRAIN, BATCH, shuffle_seed=epoch, pad=False)


def val_batches():
    return batches(*VAL, BATCH)


def make_run(schedule=None, epochs=3):
    schedule = schedule or warmup_cosine(0.03, epochs * STEPS_PER_EPOCH, warmup_steps=4)
    tx = make_optimizer(schedule, weight_decay=1e-4)
    model = TinyCNN(bn_axis_name="data", drop_rate=0.2)
    steps = make_steps(model, tx, CONFIG, mode="jit")
    state = jax.device_get(create_train_state(init_variables(model, 8, seed=0), tx, seed=3, ema=True))
    return steps, state, schedule


@pytest.fixture(scope="module")
def run():
    """One compiled engine shared by the tests (fit never changes the host state it is given)."""
    return make_run()


def comparable(history):
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in history]


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, run):
    out = tmp_path_factory.mktemp("full")
    steps, state, schedule = run
    result = fit(steps, state, train_batches, steps_per_epoch=STEPS_PER_EPOCH, epochs=3, val_batches=val_batches,
                 out_dir=out, lr_schedule=schedule, progress=False, log_every=3)
    return out, result, schedule


def test_history_files_and_checkpoints(uninterrupted):
    out, result, schedule = uninterrupted
    history = result.history
    assert [r["epoch"] for r in history] == [1, 2, 3]
    assert [r["step"] for r in history] == [8, 16, 24]
    assert history[-1]["val_acc"] > 0.8  # the tiny CNN learns digits
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert all(r["lr"] == pytest.approx(float(schedule(r["step"]))) for r in history)
    assert all(r["img_per_s"] > 0 and r["seconds"] > 0 for r in history)

    report = json.loads((out / "metrics.json").read_text())
    assert report["history"] == pytest.approx(history) and report["stop_reason"] == "completed"
    best = max(history, key=lambda r: r["val_f1"])
    assert report["best"]["epoch"] == best["epoch"] and report["monitor"] == "val_f1"
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(HISTORY_COLUMNS) and len(rows) == 3
    assert float(rows[1]["val_loss"]) == pytest.approx(history[1]["val_loss"])

    manifest = json.loads(checkpoint.manifest_path(out / "best.msgpack").read_text())
    assert manifest["epoch"] == best["epoch"] and manifest["value"] == pytest.approx(best["val_f1"])
    best_vars = checkpoint.load(out / "best.msgpack")
    assert set(best_vars) == {"params", "batch_stats"}
    if best["epoch"] == 3:  # the best weights are the EMA weights of the final state
        assert_trees_equal(best_vars["params"], result.state.ema_params)


def test_interrupted_and_resumed_run_equals_uninterrupted(uninterrupted, run, tmp_path):
    _, full, _ = uninterrupted
    steps, state, schedule = run

    def dying_batches(epoch):  # a kill in the middle of epoch 2
        for i, b in enumerate(train_batches(epoch)):
            if epoch == 2 and i == 5:
                raise KeyboardInterrupt("killed")
            yield b

    with pytest.raises(KeyboardInterrupt):
        fit(steps, state, dying_batches, steps_per_epoch=STEPS_PER_EPOCH, epochs=3, val_batches=val_batches,
            out_dir=tmp_path, lr_schedule=schedule, progress=False)
    assert json.loads((tmp_path / "metrics.json").read_text())["history"][-1]["epoch"] == 1

    resumed = fit(steps, state, train_batches, steps_per_epoch=STEPS_PER_EPOCH, epochs=3, val_batches=val_batches,
                  out_dir=tmp_path, lr_schedule=schedule, progress=False, resume=True)
    assert comparable(resumed.history) == comparable(full.history)
    assert_trees_equal(resumed.state, full.state)


def test_resume_with_another_model_is_a_clear_error(uninterrupted, tmp_path):
    out, _, _ = uninterrupted
    tx = make_optimizer(0.01)
    model = TinyCNN(num_classes=7)
    steps = make_steps(model, tx, StepConfig(num_classes=7), mode="jit")
    state = jax.device_get(create_train_state(init_variables(model, 8), tx))
    with pytest.raises(checkpoint.CheckpointError, match=r"mis-shaped.*Dense_0/kernel"):
        fit(steps, state, train_batches, steps_per_epoch=2, epochs=1, out_dir=out, resume=True, progress=False)


def test_early_stopping_when_the_monitor_stops_improving(run, tmp_path):
    steps, state, _ = run
    # the learning rate is a history column that cannot improve under a decaying schedule
    result = fit(steps, state, train_batches, steps_per_epoch=2, epochs=10, out_dir=tmp_path, monitor="lr",
                 lr_schedule=lambda step: 1.0 / (1 + step), patience=2, progress=False)
    assert len(result.history) == 3  # epoch 1 is best, 2 and 3 are no better
    assert result.best["epoch"] == 1 and result.stop_reason.startswith("early stopping after epoch 3")
    assert json.loads((tmp_path / "metrics.json").read_text())["stop_reason"] == result.stop_reason
    again = fit(steps, state, train_batches, steps_per_epoch=2, epochs=10, out_dir=tmp_path, monitor="lr",
                lr_schedule=lambda step: 1.0 / (1 + step), patience=2, progress=False, resume=True)
    assert len(again.history) == 3 and again.stop_reason == result.stop_reason  # resuming a finished run: no steps


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    schedule = lambda step: jax.numpy.where(step < 4, 0.01, 1e38)  # noqa: E731  explodes in epoch 2
    steps, state, _ = make_run(schedule=schedule, epochs=3)
    with pytest.raises(TrainingDiverged, match="became (nan|inf) in epoch 2"):
        fit(steps, state, train_batches, steps_per_epoch=4, epochs=3, val_batches=val_batches, out_dir=tmp_path,
            progress=False, log_every=1)
    last = checkpoint.load(tmp_path / "last.msgpack")
    assert int(last["state"]["step"]) == 4
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(last["state"]["params"]))
    assert len(json.loads((tmp_path / "metrics.json").read_text())["history"]) == 1


def test_hook_functions_see_each_evaluation_and_can_stop(run):
    steps, state, _ = run
    seen = []

    def stop_at_two(row, host_state):
        seen.append((row["epoch"], int(host_state.step)))
        return row["epoch"] == 2

    result = fit(steps, state, train_batches, steps_per_epoch=2, epochs=5, hooks=[stop_at_two],
                 monitor="train_loss", progress=False)
    assert seen == [(1, 2), (2, 4)] and result.stop_reason == "stopped by a hook after epoch 2 (step 4)"
    assert np.isnan(result.history[0]["val_f1"])  # no validation data given


def test_total_steps_make_a_shorter_last_epoch(run):
    steps, state, _ = run
    result = fit(steps, state, train_batches, steps_per_epoch=4, total_steps=10, monitor="train_loss",
                 progress=False)
    assert [r["step"] for r in result.history] == [4, 8, 10]


def test_train_data_that_runs_out_is_a_clear_error(run):
    steps, state, _ = run
    with pytest.raises(ValueError, match="ran out after 21 of 30 steps"):
        fit(steps, state, train_batches, steps_per_epoch=30, epochs=1, monitor="train_loss", progress=False)
