"""``python -m kaggle_utils``: the README command learns and submits; bad input fails before any work.

Kills, locks and resume after SIGKILL are in test_job_faults.
"""
import csv
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint, job, outdir, run
from kaggle_utils.config import ConfigError, TrainConfig, config_from_args
from kaggle_utils.data import make_sample_dataset

from job_helpers import TEST_MODEL, finish, job_process


def run_main(argv, capsys):
    """(exit code, stderr) of the job run in this process."""
    with pytest.raises(SystemExit) as exit_info:
        job.main(argv)
    return exit_info.value.code, capsys.readouterr().err


# --------------------------------------------------------------------------- learning

# the README command, 4 epochs for time (measured: val_acc 0.97, test_acc 0.96; 3 epochs gave val_acc 0.90);
# checkpoints every 7 steps fall inside the 19-step epochs
README_ARGS = ["train", "--epochs", "4", "--no-progress", "--checkpoint-every", "7", "--keep-checkpoints", "2"]


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory):
    """One uninterrupted run of the README command on one CPU device (no --data-dir: the sample)."""
    tmp = tmp_path_factory.mktemp("learning")
    start = time.perf_counter()
    log = finish(job_process(README_ARGS, tmp / "run", tmp))
    return tmp, time.perf_counter() - start, log


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_readme_command_learns_digits_and_submits_every_test_id(learning_run, tmp_path):
    tmp, seconds, log = learning_run
    out = tmp / "run"
    report = json.loads((out / "metrics.json").read_text())
    print(f"learning run: {seconds:.0f}s; val_acc by epoch {[round(r['val_acc'], 3) for r in report['history']]}")
    assert report["best"]["val_acc"] >= 0.9
    assert {p.name for p in out.iterdir()} >= {"best.msgpack", "last.msgpack", "metrics.json", "history.csv",
                                                "config.json", "submission.csv", "tensorboard"}
    assert ("global batch 64 = 64 per device x 1 device(s); adamw, cosine schedule, peak learning rate 0.0025 (0.01 "
            "per 256 images);") in log

    truth = make_sample_dataset(tmp_path / "truth", image_size=32).test_labels  # the same embedded sample
    with open(out / "submission.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "label"]
    ids = [r[0] for r in rows[1:]]
    assert len(ids) == len(set(ids)) == len(truth) and set(ids) == set(truth)
    test_acc = np.mean([int(label) == truth[i] for i, label in rows[1:]])
    assert test_acc >= 0.85


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_checkpoints_keep_the_last_k_and_the_best(learning_run):
    out = learning_run[0] / "run"
    kept = sorted(p.name for p in out.glob("ckpt-*.msgpack"))
    assert len(kept) == 1  # --keep-checkpoints 2: last.msgpack + one older
    last_step = json.loads((out / "last.json").read_text())["step"]
    assert last_step == 4 * 19 and int(kept[0][5:-8]) < last_step
    assert json.loads((out / kept[0].replace(".msgpack", ".json")).read_text())["step"] == int(kept[0][5:-8])


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_config_json_records_the_run_and_the_files_are_readable_by_others(learning_run):
    out = learning_run[0] / "run"
    recorded = json.loads((out / "config.json").read_text())
    config = TrainConfig.from_dict(recorded["config"])
    assert config.loop.epochs == 4 and config.loop.checkpoint_every == 7 and config.data.data_dir == run.SAMPLE
    assert config.data.batch_size == 64 and config.optim.lr == 0.01 and config.model.num_classes == 10
    assert recorded["given"] == {"epochs": 4, "checkpoint_every": 7, "keep_checkpoints": 2}
    assert recorded["plan"]["steps_per_epoch"] == 19 and recorded["plan"]["total_steps"] == 76


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_predict_command_rewrites_the_submission_from_the_run_folder(learning_run, tmp_path, capsys):
    tmp = learning_run[0]
    data = make_sample_dataset(tmp_path / "data", image_size=32)  # the same embedded sample, now on disk
    # this process has 8 devices, the training run had one: another layout, the same predictions
    assert job.main(["predict", "--checkpoint", str(tmp / "run"), "--data-dir", data.root,
                     "--out", str(tmp_path / "pred"), "--batch-size", "64", "--no-progress"]) == 0
    assert (tmp_path / "pred" / "submission.csv").read_text() == (tmp / "run" / "submission.csv").read_text()


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_load_run_gives_the_model_variables_and_config(learning_run):
    out = learning_run[0] / "run"
    model, variables, config = run.load_run(out)
    best = checkpoint.load(out / "best.msgpack")
    np.testing.assert_array_equal(variables["params"]["classifier"]["kernel"], best["params"]["classifier"]["kernel"])
    assert config.model.name == "tf_efficientnetv2_b0" and model.num_classes == 10
    _, last_vars, _ = run.load_run(out / "last.msgpack")  # the training state's variables
    assert jax.tree.structure(last_vars) == jax.tree.structure(variables)


# --------------------------------------------------------------------------- the config and its flags


@dataclasses.dataclass(frozen=True)
class ExtendedConfig(TrainConfig):
    my_new_knob: int = dataclasses.field(default=7, metadata={"help": "a field a user added"})


def test_a_field_added_to_the_config_is_a_flag_and_is_written_to_config_json(sample, tmp_path, monkeypatch):
    parser = job.build_parser(ExtendedConfig)
    assert "--my-new-knob" in parser._subparsers._group_actions[0].choices["train"].format_help()
    args = parser.parse_args(["train", "--data-dir", sample.root, "--out", str(tmp_path), "--my-new-knob", "3",
                              "--model", TEST_MODEL, "--steps", "2", "--no-progress"])
    assert config_from_args(args, ExtendedConfig).my_new_knob == 3

    class Stop(Exception):
        pass

    def stop(*_, **__):
        raise Stop

    monkeypatch.setattr(run.trainer, "fit_run", stop)  # config.json is written before the first step
    with pytest.raises(Stop):
        job.train_command(args)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["config"]["my_new_knob"] == 3 and written["given"]["my_new_knob"] == 3


def test_batch_per_device_is_multiplied_by_the_devices(sample, tmp_path, capsys):
    config = TrainConfig().replace(data_dir=sample.root, batch_per_device=4, steps=1)
    resolved, plan = run.resolve(config, run.open_data(config, sample.root))
    assert plan.global_batch == 32 == resolved.data.batch_size and plan.per_device_batch == 4  # 8 devices
    code, err = run_main(["train", "--data-dir", sample.root, "--out", str(tmp_path), "--batch-size", "64",
                          "--batch-per-device", "8"], capsys)
    assert code == 2 and "--batch-size (global) and --batch-per-device exclude each other" in err


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("argv, message", [
    (["--lr", "0"], "argument --lr: 0 is not a learning rate: it must be a finite number > 0"),
    (["--steps-per-epoch", "0"], "--steps-per-epoch 0: must be at least 1"),
    (["--epochs", "0"], "--epochs 0: must be at least 1"),
    (["--eval-every", "0"], "--eval-every 0: must be at least 1"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints 0: must be at least 1"),
    (["--model", "tf_efficientnetv2_q9"], "--model: unknown model 'tf_efficientnetv2_q9'"),
    (["--monitor", "val_f2"], "--monitor 'val_f2' is not a metric of --task softmax; choose one of"),
    (["--monitor", "val_micro_f1"], "not a metric of --task softmax"),
    (["--label-smoothing", "1"], "--label-smoothing 1.0: must be in [0, 1)"),
])
def test_values_no_run_can_use_are_named_before_any_work(argv, message, sample, tmp_path, capsys):
    code, err = run_main(["train", "--data-dir", sample.root, "--out", str(tmp_path / "out"), *argv], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_missing_split_is_named(sample, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(sample.split_dirs["train"], data / "train")
    code, err = run_main(["train", "--data-dir", str(data), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and f"has no val/ split: expected TFRecords in {data / 'val'}/" in err
    assert not (tmp_path / "out").exists()  # refused before any work: not even an empty folder left


def test_num_classes_smaller_than_a_label(sample, tmp_path, capsys):
    code, err = run_main(["train", "--data-dir", sample.root, "--num-classes", "5", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--num-classes 5 is too small" in err and "label 9 (needs at least 10)" in err


def test_num_classes_default_is_max_label_plus_one_and_image_size_comes_from_the_names(sample):
    config = TrainConfig().replace(data_dir=sample.root)
    data = run.open_data(config, sample.root)
    resolved, _ = run.resolve(config, data)
    assert resolved.model.num_classes == 10 and resolved.model.image_size == 16 == data.stored_size
    assert run.infer_image_size(["a/train.tfrec"]) is None


def test_batch_not_divisible_by_the_devices(sample, tmp_path, capsys):
    code, err = run_main(["train", "--data-dir", sample.root, "--batch-size", "12", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--batch-size gives a global batch of 12, which must be a positive multiple of the 8" in err


def test_out_dir_holding_another_run_is_refused_naming_the_fields(sample, tmp_path, capsys):
    argv = ["train", "--data-dir", sample.root, "--out", str(tmp_path), "--epochs", "3", "--model", TEST_MODEL]
    config = TrainConfig().replace(data_dir=sample.root, epochs=3, model=TEST_MODEL)
    resolved, _ = run.resolve(config, run.open_data(config, sample.root))
    (tmp_path / "config.json").write_text(json.dumps({"config": resolved.replace(epochs=5, lr=0.1).to_dict()}))
    (tmp_path / "last.msgpack").write_bytes(b"x")
    code, err = run_main(argv, capsys)
    assert code == 2 and "holds a run with another config (--lr: 0.1 -> 0.01; --epochs: 5 -> 3)" in err
    assert "--overwrite" in err
    code, err = run_main(argv + ["--resume"], capsys)
    assert code == 2 and "--epochs: 5 -> 3" in err

    (tmp_path / "config.json").write_text(json.dumps({"config": resolved.replace(log_every=3).to_dict()}))
    code, err = run_main(argv, capsys)  # log_every may change on resume: the same run
    assert code == 2 and "already holds this run" in err and "--resume" in err


def test_overwrite_removes_only_the_job_outputs(tmp_path):
    for name in ("config.json", "last.msgpack", "ckpt-000000007.msgpack", "metrics.json", "notes.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "tensorboard").mkdir()
    outdir.prepare(tmp_path, TrainConfig(), resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    with pytest.raises(outdir.OutDirError, match="holds no run to resume"):
        outdir.prepare(tmp_path, TrainConfig(), resume=True, overwrite=False)
    with pytest.raises(outdir.OutDirError, match="no config.json: not a run of this job"):
        (tmp_path / "metrics.json").write_text("{}")
        outdir.prepare(tmp_path, TrainConfig(), resume=False, overwrite=False)


def test_out_dir_that_is_a_file_is_refused(sample, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code, err = run_main(["train", "--data-dir", sample.root, "--out", str(tmp_path / "f")], capsys)
    assert code == 2 and f"--out {tmp_path / 'f'} is a file, not a folder" in err


def test_a_live_run_owns_its_folder_and_a_dead_ones_lock_is_stale(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = {"pid": sleeper.pid, "host": os.uname().nodename, "started": outdir._start_time(sleeper.pid),
                "time": time.time()}
        (tmp_path / outdir.LOCK_NAME).write_text(json.dumps(lock))
        with pytest.raises(outdir.OutDirError, match=rf"is in use by another run \(pid {sleeper.pid} on "):
            with outdir.owned(tmp_path):
                pass
    finally:
        sleeper.kill()
        sleeper.wait()
    with outdir.owned(tmp_path):  # the holder is gone: its lock is stale and taken over
        assert json.loads((tmp_path / outdir.LOCK_NAME).read_text())["pid"] == os.getpid()
    assert not (tmp_path / outdir.LOCK_NAME).exists()


def _fake_run_checkpoint(path, config):
    """A checkpoint of the network ``config`` builds (zeros are enough), with a run manifest."""
    from kaggle_utils.variable_trees import abstract_variables

    model = run.build_model(config)
    size = config.model.image_size
    shapes = abstract_variables(model, jax.ShapeDtypeStruct((1, size, size, 3), np.float32))
    plan = run.Plan(1, 64, 64, 1, 1, 0, 1e-3, 10, (0.5,) * 3, (0.5,) * 3)
    checkpoint.save(path, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes),
                    manifest=run.run_manifest(config, plan))


CONFIG = TrainConfig().replace(model="test_efficientnet", num_classes=10, image_size=16, precision="fp32", head_multiple=1, drop_rate=0.0,
                               drop_path_rate=0.0)


def test_predict_with_a_checkpoint_of_another_head_size(sample, tmp_path, capsys):
    _fake_run_checkpoint(tmp_path / "best.msgpack", CONFIG.replace(num_classes=7))
    manifest = checkpoint.manifest_path(tmp_path / "best.msgpack")
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "config": CONFIG.to_dict()}))  # it lies
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "best.msgpack"), "--data-dir", sample.root,
                          "--out", str(tmp_path / "pred")], capsys)
    # refused before the weights are read, naming the checkpoint, its head and the run's classes
    assert code == 2 and "best.msgpack" in err and "classifier has 7 outputs, but its run has 10 classes" in err
    assert "another run's checkpoint" in err
    assert not (tmp_path / "pred").exists()


def test_predict_with_ported_weights_instead_of_a_run(sample, tmp_path, capsys):
    (tmp_path / "w.msgpack").write_bytes(b"x")
    (tmp_path / "w.json").write_text(json.dumps({"model": "tf_efficientnetv2_b0", "timm": {}}))
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "w.msgpack"), "--data-dir", sample.root,
                          "--out", str(tmp_path)], capsys)
    assert code == 2 and "is not a checkpoint of a training run: it holds ported tf_efficientnetv2_b0 weights" in err


def test_predict_needs_the_manifest_and_a_test_split(sample, tmp_path, capsys):
    (tmp_path / "w.msgpack").write_bytes(b"x")
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "w.msgpack"), "--data-dir", sample.root,
                          "--out", str(tmp_path)], capsys)
    assert code == 2 and "has no manifest w.json" in err
    data = tmp_path / "no_test"
    shutil.copytree(sample.split_dirs["train"], data / "train")
    _fake_run_checkpoint(tmp_path / "best.msgpack", CONFIG)
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "best.msgpack"), "--data-dir", str(data),
                          "--out", str(tmp_path)], capsys)
    assert code == 2 and "has no test/ split" in err


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_fine_tune_starts_from_a_zero_head_at_loss_ln_c(sample, tmp_path):
    """Ported weights + a new head: the head starts at zero, so the first loss is ln(classes)."""
    from kaggle_utils.data import load_dataset
    from kaggle_utils.parallel import make_mesh
    from kaggle_utils.efficientnet import create_model
    from kaggle_utils.train import init_variables

    ported = init_variables(create_model(TEST_MODEL), 32, seed=1)  # 1000 classes, as weights_port
    checkpoint.save(tmp_path / "w.msgpack", ported, manifest={"model": TEST_MODEL})
    config = TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, weights=str(tmp_path / "w.msgpack"),
                                   steps=1, batch_size=64)
    config, plan = run.resolve(config, run.open_data(config, sample.root))
    model = run.build_model(config)
    variables = run.initial_variables(config, model)
    assert not np.any(variables["params"]["classifier"]["kernel"])
    np.testing.assert_array_equal(variables["params"]["conv_stem"]["kernel"], ported["params"]["conv_stem"]["kernel"])
    training = run.build_training(config, plan, model, variables, mesh=make_mesh(jax.devices()[:1]))
    batch = next(iter(load_dataset(sample.split_dirs["train"], labeled=True, image_size=16, batch_size=64, seed=0)))
    steps = training.steps
    _, metrics = steps.train(steps.put_state(training.state), steps.put_batch(batch))
    sums = steps.get(metrics)["task"]
    assert abs(float(sums["loss_sum"]) / int(sums["count"]) - np.log(10)) < 1e-4
    # --no-zero-head: the model's own random classifier (timm's init), the same backbone
    random_head = run.initial_variables(config.replace(zero_head=False), model)
    np.testing.assert_array_equal(random_head["params"]["classifier"]["kernel"],
                                  init_variables(model, config.model.image_size, seed=config.seed)["params"][
                                      "classifier"]["kernel"])
    assert np.any(random_head["params"]["classifier"]["kernel"])
    with pytest.raises(ConfigError, match="--no-zero-head needs --weights"):
        run.check_config(config.replace(weights=None, zero_head=False))


def test_source_and_data_dir_exclude_each_other(sample, tmp_path, capsys):
    code, err = run_main(["train", "--data-dir", sample.root, "--source", str(tmp_path), "--image-size", "16",
                          "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and "--source and --data-dir exclude each other" in err
