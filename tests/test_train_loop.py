"""fit: history and files, actions at intervals, resume == uninterrupted (mid-epoch too), early stopping,
NaN guard, tasks and user metrics, TensorBoard, hooks, bad settings."""
import csv
import dataclasses
import json
import re

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint
from kaggle_utils.config import LoopConfig, OptimConfig
from kaggle_utils.train import (TIMING_COLUMNS, Hook, MetricError, MultiLabelClassification,
                                SoftmaxClassification, StepConfig, TensorBoardWriter, TrainingDiverged, WriterError,
                                create_train_state, fit, history_columns, init_variables, make_optimizer, make_steps,
                                make_schedule)
from train_helpers import TinyCNN, batches, digits

TRAIN, VAL = digits("train"), digits("val")
BATCH, STEPS_PER_EPOCH = 64, 8
CONFIG = StepConfig(num_classes=10, task=SoftmaxClassification(label_smoothing=0.05),
                    optim=OptimConfig(ema_decay=0.999))


def train_batches(epoch):
    """Epoch-seeded shuffle: a resumed run rebuilds the same order."""
    return batches(*TRAIN, BATCH, shuffle_seed=epoch, pad=False)


def val_batches():
    return batches(*VAL, BATCH)


def make_run(schedule=None, epochs=3):
    schedule = schedule or make_schedule("cosine", 0.03, epochs * STEPS_PER_EPOCH, warmup_steps=4)
    tx = make_optimizer(schedule, OptimConfig(weight_decay=1e-4))
    model = TinyCNN(bn_axis_name="data", drop_rate=0.2)
    steps = make_steps(model, tx, CONFIG, mode="jit")
    state = jax.device_get(steps.init_state(init_variables(model, 8, seed=0), seed=3))  # with EMA weights
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
    result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=STEPS_PER_EPOCH, epochs=3, log_every=3),
                 val_batches=val_batches, out_dir=out, lr_schedule=schedule, progress=False)
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
    assert len(report["history"]) == len(history) and report["stop_reason"] == "completed"
    assert all(row == pytest.approx(expected) for row, expected in zip(report["history"], history))
    best = max(history, key=lambda r: r["val_f1"])
    assert report["best"]["epoch"] == best["epoch"] and report["monitor"] == "val_f1"
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == list(history_columns(CONFIG.task)) and len(rows) == 3
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
        fit(steps, state, dying_batches, LoopConfig(steps_per_epoch=STEPS_PER_EPOCH, epochs=3),
            val_batches=val_batches, out_dir=tmp_path, lr_schedule=schedule, progress=False)
    assert json.loads((tmp_path / "metrics.json").read_text())["history"][-1]["epoch"] == 1

    resumed = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=STEPS_PER_EPOCH, epochs=3),
                  val_batches=val_batches, out_dir=tmp_path, lr_schedule=schedule, progress=False, resume=True)
    assert comparable(resumed.history) == comparable(full.history)
    assert_trees_equal(resumed.state, full.state)


def test_resume_with_another_model_is_a_clear_error(uninterrupted, tmp_path):
    out, _, _ = uninterrupted
    tx = make_optimizer(0.01)
    model = TinyCNN(num_classes=7)
    steps = make_steps(model, tx, StepConfig(num_classes=7), mode="jit")
    state = jax.device_get(create_train_state(init_variables(model, 8), tx))
    with pytest.raises(checkpoint.CheckpointError, match=r"mis-shaped.*Dense_0/kernel"):
        fit(steps, state, train_batches, LoopConfig(steps_per_epoch=2, epochs=1), out_dir=out, resume=True,
            progress=False)


def test_early_stopping_when_the_monitor_stops_improving(run, tmp_path):
    steps, state, _ = run
    # the learning rate is a history column that cannot improve under a decaying schedule
    result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=2, epochs=10, monitor="lr", patience=2),
                 out_dir=tmp_path, lr_schedule=lambda step: 1.0 / (1 + step), progress=False)
    assert len(result.history) == 3  # epoch 1 is best, 2 and 3 are no better
    assert result.best["epoch"] == 1 and result.stop_reason.startswith("early stopping after epoch 3")
    assert json.loads((tmp_path / "metrics.json").read_text())["stop_reason"] == result.stop_reason
    again = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=2, epochs=10, monitor="lr", patience=2),
                out_dir=tmp_path, lr_schedule=lambda step: 1.0 / (1 + step), progress=False, resume=True)
    assert len(again.history) == 3 and again.stop_reason == result.stop_reason  # resuming a finished run: no steps


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    schedule = lambda step: jax.numpy.where(step < 4, 0.01, 1e38)  # noqa: E731  explodes in epoch 2
    steps, state, _ = make_run(schedule=schedule, epochs=3)
    with pytest.raises(TrainingDiverged, match="became (nan|inf) in epoch 2"):
        fit(steps, state, train_batches, LoopConfig(steps_per_epoch=4, epochs=3, log_every=1), val_batches=val_batches,
            out_dir=tmp_path, progress=False)
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

    result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=2, epochs=5, monitor="train_loss"),
                 hooks=[stop_at_two], progress=False)
    assert seen == [(1, 2), (2, 4)] and result.stop_reason == "stopped by a hook after epoch 2 (step 4)"
    assert np.isnan(result.history[0]["val_f1"])  # no validation data given


def test_total_steps_make_a_shorter_last_epoch(run):
    steps, state, _ = run
    result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=4, steps=10, monitor="train_loss"),
                 progress=False)
    assert [r["step"] for r in result.history] == [4, 8, 10]


def test_train_data_that_runs_out_is_a_clear_error(run):
    steps, state, _ = run
    with pytest.raises(ValueError, match="ran out after 21 of 30 steps"):
        fit(steps, state, train_batches, LoopConfig(steps_per_epoch=30, epochs=1, monitor="train_loss"),
            progress=False)


# --------------------------------------------------------------------------- actions at intervals


def test_eval_every_n_steps_and_checkpoints_keep_exactly_k_plus_best(run, tmp_path):
    steps, state, schedule = run
    result = fit(steps, state, train_batches,
                 LoopConfig(steps_per_epoch=STEPS_PER_EPOCH, epochs=2, eval_every=5, checkpoint_every=3,
                            keep_checkpoints=3),
                 val_batches=val_batches, out_dir=tmp_path, lr_schedule=schedule, progress=False)
    assert [r["step"] for r in result.history] == [5, 10, 15, 16]  # every 5 steps, and the last one
    assert [r["epoch"] for r in result.history] == [1, 2, 2, 2]
    # saved at 3 5 6 9 10 12 15 16: last.msgpack (16) and the two before it as ckpt-STEP files
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.msgpack")) == ["ckpt-000000012.msgpack",
                                                                      "ckpt-000000015.msgpack"]
    assert json.loads((tmp_path / "last.json").read_text())["step"] == 16
    assert int(checkpoint.load(tmp_path / "ckpt-000000012.msgpack")["state"]["step"]) == 12
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["step"] == max(result.history, key=lambda r: r["val_f1"])["step"]


def test_killed_mid_epoch_resumes_from_a_mid_epoch_checkpoint_exactly(uninterrupted, run, tmp_path):
    _, full, schedule = uninterrupted
    steps, state, _ = run

    def dying_batches(epoch):  # killed at step 13, after the checkpoint of step 12 (mid epoch 2)
        for i, b in enumerate(train_batches(epoch)):
            if epoch == 2 and i == 5:
                raise KeyboardInterrupt("killed")
            yield b

    settings = LoopConfig(steps_per_epoch=STEPS_PER_EPOCH, epochs=3, log_every=3, checkpoint_every=4)
    kwargs = dict(val_batches=val_batches, out_dir=tmp_path, lr_schedule=schedule, progress=False)
    with pytest.raises(KeyboardInterrupt):
        fit(steps, state, dying_batches, settings, **kwargs)
    assert json.loads((tmp_path / "last.json").read_text())["step"] == 12
    seen = []

    def recording(epoch):
        seen.append(epoch)
        return train_batches(epoch)

    resumed = fit(steps, state, recording, settings, resume=True, **kwargs)
    assert seen == [2, 3]  # epoch 2 rebuilt, its first 4 batches skipped
    assert comparable(resumed.history) == comparable(full.history)
    assert_trees_equal(resumed.state, full.state)


# --------------------------------------------------------------------------- tasks, metrics, writers, hooks


def multilabel_batches(images, labels, batch_size, **kwargs):
    """Digits with two labels each: the digit (0-9) and 'odd' (10) or 'even' (11)."""
    for b in batches(images, labels, batch_size, **kwargs):
        hot = np.zeros((len(b["label"]), 12), np.float32)
        hot[np.arange(len(hot)), b["label"]] = 1
        hot[np.arange(len(hot)), 10 + b["label"] % 2] = 1
        yield {**b, "label": hot}


def test_a_multilabel_problem_trains_with_the_bce_task_and_its_f1_is_monitored(tmp_path):
    task = MultiLabelClassification()
    tx = make_optimizer(make_schedule("cosine", 0.03, 24, warmup_steps=4), OptimConfig(weight_decay=1e-4))
    model = TinyCNN(num_classes=12, bn_axis_name="data")
    steps = make_steps(model, tx, StepConfig(num_classes=12, task=task), mode="jit")
    state = jax.device_get(create_train_state(init_variables(model, 8, seed=0), tx, seed=3))
    result = fit(steps, state, lambda e: multilabel_batches(*TRAIN, BATCH, shuffle_seed=e, pad=False),
                 LoopConfig(steps_per_epoch=8, epochs=3, monitor="val_f1"),
                 val_batches=lambda: multilabel_batches(*VAL, BATCH), out_dir=tmp_path, progress=False)
    f1 = [r["val_f1"] for r in result.history]
    assert set(result.history[0]) >= {"val_f1", "val_micro_f1", "val_acc"}
    assert f1[-1] > 0.7 and f1[-1] > f1[0], f1
    assert result.best["val_f1"] == max(f1)
    assert json.loads((tmp_path / "best.json").read_text())["value"] == pytest.approx(max(f1))


def test_a_custom_metric_picks_the_best_checkpoint(tmp_path):
    picked = []

    def worst_class_recall(sums):  # a metric of the summed confusion counts
        confusion = np.asarray(sums["confusion"], np.float64)
        recall = np.diag(confusion) / np.maximum(confusion.sum(1), 1)
        picked.append(recall.min())
        return recall.min()

    task = SoftmaxClassification().with_metric("worst_recall", worst_class_recall)
    tx = make_optimizer(make_schedule("cosine", 0.03, 24, warmup_steps=4), OptimConfig(weight_decay=1e-4))
    model = TinyCNN(bn_axis_name="data")
    steps = make_steps(model, tx, StepConfig(num_classes=10, task=task), mode="jit")
    state = jax.device_get(create_train_state(init_variables(model, 8, seed=0), tx, seed=3))
    result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=8, epochs=3, monitor="val_worst_recall"),
                 val_batches=val_batches, out_dir=tmp_path, progress=False)
    assert [r["val_worst_recall"] for r in result.history] == picked
    assert result.best["val_worst_recall"] == max(picked)
    assert json.loads((tmp_path / "best.json").read_text())["step"] == result.best["step"]


def test_a_custom_metric_that_raises_is_named_on_its_first_call(run):
    steps, state, _ = run

    def broken(sums):
        return sums["no_such_sum"]

    bad = dataclasses.replace(steps, config=dataclasses.replace(
        steps.config, task=steps.config.task.with_metric("broken", broken)))
    with pytest.raises(MetricError, match=r"metric 'broken' \(broken\) raised KeyError: 'no_such_sum'"):
        fit(bad, state, train_batches, LoopConfig(steps_per_epoch=2, epochs=1, monitor="val_broken"),
            val_batches=val_batches, progress=False)


def test_tensorboard_event_files_hold_the_logged_scalars_at_the_logged_steps(run, tmp_path):
    from kaggle_utils.data import tensorflow_on_host

    steps, state, schedule = run
    fit(steps, state, train_batches, LoopConfig(steps_per_epoch=4, epochs=2, log_every=2), val_batches=val_batches,
        lr_schedule=schedule, writers=[TensorBoardWriter(tmp_path)], progress=False)
    tf = tensorflow_on_host()
    seen = {}
    for event_file in tmp_path.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            for value in event.summary.value:
                seen.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert [s for s, _ in seen["train/loss"]] == [2, 4, 6, 8]
    assert [s for s, _ in seen["val/f1"]] == [4, 8]
    assert {"lr", "grad_norm", "param_norm", "train/img_per_s", "val/acc", "val/loss"} <= set(seen)
    assert seen["lr"][1][1] == pytest.approx(float(schedule(4)))
    assert all(v > 0 for _, v in seen["grad_norm"] + seen["param_norm"])


def test_hooks_run_at_each_point_of_the_run(run):
    steps, state, _ = run
    calls = []

    class Recorder(Hook):
        def on_run_start(self, state, history):
            calls.append(("start", int(state.step)))

        def on_epoch_start(self, epoch):
            calls.append(("epoch", epoch))

        def on_log(self, step, scalars):
            calls.append(("log", step))

        def on_eval_end(self, row, host_state):
            calls.append(("eval", row["step"]))

        def on_epoch_end(self, epoch, host_state):
            calls.append(("epoch_end", epoch))

        def on_run_end(self, result):
            calls.append(("end", len(result.history)))

    fit(steps, state, train_batches, LoopConfig(steps_per_epoch=2, epochs=2, monitor="train_loss", log_every=2),
        hooks=[Recorder()], progress=False)
    assert calls == [("start", 0), ("epoch", 1), ("log", 2), ("eval", 2), ("epoch_end", 1), ("epoch", 2),
                     ("log", 4), ("eval", 4), ("epoch_end", 2), ("end", 2)]


@pytest.mark.parametrize("kwargs, message", [
    (dict(monitor="val_f2"), "monitor 'val_f2' is not a history column of this task"),
    (dict(eval_every=0), "--eval-every 0: must be at least 1"),
    (dict(checkpoint_every=-1), "--checkpoint-every -1: must be at least 1"),
    (dict(keep_checkpoints=0), "--keep-checkpoints 0: must be at least 1"),
    (dict(monitor_mode="up"), "--monitor-mode 'up': choose one of auto, min, max"),
    (dict(patience=0), "--patience 0: must be at least 1"),
])
def test_bad_loop_settings_are_named_before_any_step(run, kwargs, message):
    steps, state, _ = run

    def no_data(epoch):
        raise AssertionError("no batch may be read")

    with pytest.raises(ValueError, match=re.escape(message)):
        fit(steps, state, no_data, LoopConfig(steps_per_epoch=2, epochs=1, **kwargs), progress=False)


def test_an_unwritable_tensorboard_folder_is_an_error_before_training(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(WriterError, match=f"TensorBoard folder {tmp_path / 'file' / 'tb'} is not writable"):
        TensorBoardWriter(tmp_path / "file" / "tb")


def test_min_delta_and_mode_decide_what_improves(run):
    steps, state, _ = run
    result = fit(steps, state, train_batches,
                 LoopConfig(steps_per_epoch=2, epochs=4, monitor="train_loss", min_delta=1e9),
                 progress=False)  # nothing beats the first evaluation by that much
    assert result.best["epoch"] == 1
    result = fit(steps, state, train_batches,
                 LoopConfig(steps_per_epoch=2, epochs=3, monitor="train_loss", monitor_mode="max"), progress=False)
    assert result.best["train_loss"] == max(r["train_loss"] for r in result.history)


def test_a_run_with_mixup_cutmix_and_device_randaugment_in_the_step_learns(tmp_path):
    """Mixing and RandAugment inside the jitted step, with their own keys: the loss still falls."""
    import functools

    from kaggle_utils.device_augment import MixConfig, make_device_augment, mix

    mixing = MixConfig(num_classes=10, mixup_alpha=0.4, cutmix_alpha=1.0, label_smoothing=0.0)
    config = StepConfig(num_classes=10, task=SoftmaxClassification(label_smoothing=0.1),
                        augment=make_device_augment("randaugment-device"),
                        mix=functools.partial(mix, config=mixing))
    tx = make_optimizer(make_schedule("cosine", 0.03, 32, warmup_steps=4), OptimConfig(weight_decay=1e-4))
    model = TinyCNN(bn_axis_name="data")
    steps = make_steps(model, tx, config, mode="jit")
    state = jax.device_get(create_train_state(init_variables(model, 8, seed=0), tx, seed=3))
    result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=8, epochs=4), val_batches=val_batches,
                 progress=False)
    losses = [r["train_loss"] for r in result.history]
    assert losses[-1] < losses[0] and result.history[-1]["val_acc"] > 0.5, result.history
