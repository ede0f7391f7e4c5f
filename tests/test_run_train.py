"""``run.train``: the one function behind the job and notebook 04; a user's task; refusals that touch nothing."""
import json

import numpy as np
import pytest
import tensorflow as tf

from kaggle_utils import checkpoint, job, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.data import Resize
from kaggle_utils.efficientnet import create_model
from kaggle_utils.train import SoftmaxClassification, init_variables

from job_helpers import TEST_MODEL


def tiny_config(sample, **changes):
    return TrainConfig().replace(**{"data_dir": sample.root, "model": TEST_MODEL, "batch_size": 64, "steps": 4,
                                    "eval_every": 2, **changes})


def error_rate(sums):
    return 1.0 - int(sums["correct"]) / int(sums["count"])


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_user_task_metric_is_a_column_and_can_be_monitored(sample, tmp_path):
    config = tiny_config(sample, monitor="val_error", monitor_mode="min")
    with pytest.raises(ConfigError, match="--monitor 'val_error' is not a metric of --task softmax"):
        run.train(config, tmp_path / "refused")  # the config's own task has no such metric
    assert not (tmp_path / "refused").exists()

    task = SoftmaxClassification(label_smoothing=0.1).with_metric("error", error_rate)
    result = run.train(config, tmp_path / "run", task=task, progress=False)
    errors = [row["val_error"] for row in result.history]
    assert len(errors) == 2 and all(0 <= e <= 1 for e in errors)
    np.testing.assert_allclose(errors, [1 - row["val_acc"] for row in result.history], atol=1e-6)
    assert result.best["val_error"] == min(errors)
    report = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert report["monitor"] == "val_error" and report["best"]["step"] == result.best["step"]
    assert report["compile_s"] > 0  # the run's own compiling, reported apart from its steps
    assert result.submission == tmp_path / "run" / "submission.csv"
    assert len(result.test_ids) == len(sample.test_labels)


@pytest.fixture(scope="module")
def finished_run(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    run.train(tiny_config(sample), out, progress=False)
    return out


def snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def ported_weights(path, model_name):
    checkpoint.save(path, init_variables(create_model(model_name), 32, seed=1), manifest={"model": model_name})
    return path


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
@pytest.mark.parametrize("case", ["freeze pattern that matches nothing", "weights of another variant"])
def test_a_refused_overwrite_leaves_the_previous_run_whole(finished_run, sample, tmp_path, capsys, case):
    before = snapshot(finished_run)
    assert {"best.msgpack", "last.msgpack", "config.json", "submission.csv"} <= {p.name for p in before}
    if case == "weights of another variant":
        flags = ["--weights", str(ported_weights(tmp_path / "w.msgpack", "tf_efficientnetv2_b0"))]
        message = "holds weights of 'tf_efficientnetv2_b0'"
    else:
        flags = ["--weights", str(ported_weights(tmp_path / "w.msgpack", TEST_MODEL)), "--freeze", "no_such_layer"]
        message = "--freeze"
    with pytest.raises(SystemExit) as exit_info:
        job.main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--batch-size", "64", "--steps", "4",
                  "--eval-every", "2", *flags, "--out", str(finished_run), "--overwrite", "--no-progress"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert snapshot(finished_run) == before


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_layer_decay_and_head_multiplier_set_each_part_s_update_size(sample):
    """AdamW's first update is about lr x sign(g) per element, so each group's median |update| is its rate."""
    from kaggle_utils.data import load_dataset
    from kaggle_utils.train import assign_lr_groups
    from kaggle_utils.variable_trees import flatten

    config = tiny_config(sample, layer_decay=0.5, head_lr_mult=10.0, warmup_epochs=0.0, steps=1, eval_every=None)
    config, plan = run.resolve(config, run.open_data(config, sample.root))
    stages = len(run.build_model(config).stages)
    assert plan.lr_multipliers["stem"] == 0.5 ** (stages + 1) and plan.lr_multipliers["classifier"] == 10.0
    assert "lr by group: stem " in plan.describe(config) and "classifier " in plan.describe(config)
    model = run.build_model(config)
    training = run.build_training(config, plan, model, run.initial_variables(config, model))
    steps = training.steps
    batch = next(iter(load_dataset(sample.split_dirs["train"], labeled=True, image_size=16, batch_size=64, seed=0)))
    state, _ = steps.train(steps.put_state(training.state), steps.put_batch(batch))
    before, after = flatten(training.state.params), flatten(steps.get(state).params)
    group_of = flatten(assign_lr_groups(training.state.params, model.lr_parts()).labels)
    for group, multiplier in plan.lr_multipliers.items():
        moved = np.concatenate([np.abs(after[p] - before[p]).ravel() for p in before
                                if group_of[p] == group and before[p].ndim > 1])  # kernels: sign-like steps
        np.testing.assert_allclose(np.median(moved), plan.peak_lr * multiplier, rtol=0.05, err_msg=group)


def test_accumulation_splits_each_device_s_share_and_the_plan_says_so(tmp_path):
    data = run.RunData(tmp_path, {}, stored_size=16, num_train=1000, max_label=9, description="x")
    config, plan = run.resolve(TrainConfig().replace(batch_size=64, accumulate_steps=2), data)  # 8 devices
    assert plan.global_batch == 64 and "8 per device in 2 micro-batches of 4 x 8 device(s)" in plan.describe(config)
    assert plan.peak_lr == pytest.approx(0.01 * 64 / 256)  # the rate follows the batch of an optimizer step
    with pytest.raises(ConfigError, match="--accumulate-steps 3 does not divide the 8 images per device"):
        run.resolve(TrainConfig().replace(batch_size=64, accumulate_steps=3), data)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_resume_also_checks_the_manifest_of_the_checkpoint_it_reads(finished_run, sample, tmp_path):
    """config.json says lr 0.02 (edited, or written by another run); last.msgpack was trained at 0.01."""
    import shutil

    from kaggle_utils.outdir import OutDirError

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    record = json.loads((out / "config.json").read_text())
    record["config"]["optim"]["lr"] = 0.02
    (out / "config.json").write_text(json.dumps(record))
    with pytest.raises(OutDirError, match=r"per last.json \(the manifest of the checkpoint --resume reads\) "
                                          r"\(--lr: 0.01 -> 0.02\)"):
        run.train(tiny_config(sample, lr=0.02), out, resume=True, progress=False)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_resume_of_an_auto_batch_run_keeps_the_batch_config_json_records(finished_run, sample, tmp_path, monkeypatch):
    """A new search could choose another batch (another device or JAX version): --resume takes the recorded one."""
    import shutil

    from kaggle_utils.run import memory_plan

    def no_search(*_, **__):
        raise AssertionError("--resume searched for a batch instead of reading config.json")

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    monkeypatch.setattr(memory_plan, "fit_batch", no_search)
    config = tiny_config(sample, batch_size=None, batch_per_device="auto", memory_budget=1.0)
    result = run.train(config, out, resume=True, progress=False)
    assert result.plan.global_batch == 64 and result.config.data.batch_size == 64
    assert "the global batch 64" in result.plan.batch_fit and "--resume" in result.plan.batch_fit
    record = json.loads((out / "config.json").read_text())
    assert record["given"]["batch_per_device"] == "auto" and record["config"]["data"]["batch_size"] == 64


def test_train_crop_flip_gives_the_whole_image_or_its_mirror():
    config = TrainConfig().replace(image_size=24, train_crop="flip")
    image = tf.constant(np.random.default_rng(0).integers(0, 256, (40, 40, 3), dtype=np.uint8))
    whole = Resize(24)(image).numpy()
    flip = run.train_crop(config, stored_size=40)
    outs = [flip(image, tf.constant([seed, 7])).numpy() for seed in range(16)]
    mirrored = [np.array_equal(out, whole[:, ::-1]) for out in outs]
    assert all(m or np.array_equal(out, whole) for m, out in zip(mirrored, outs))
    assert 0 < sum(mirrored) < len(outs)  # both, by the seed
