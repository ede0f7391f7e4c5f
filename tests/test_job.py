"""``python -m kaggle_utils``: the README command learns; bad input fails before any work."""
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint, job
from kaggle_utils.data import make_sample_dataset

REPO = Path(__file__).resolve().parents[1]


def job_env(devices=1, cache=None):
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if cache is not None:  # the runs of one test share compiled programs
        env["JAX_COMPILATION_CACHE_DIR"] = str(cache)
    return env


def run_main(argv, capsys):
    """(exit code, stderr) of the job run in this process."""
    with pytest.raises(SystemExit) as exit_info:
        job.main(argv)
    return exit_info.value.code, capsys.readouterr().err


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return make_sample_dataset(tmp_path_factory.mktemp("sample"), image_size=16)


# --------------------------------------------------------------------------- learning and resume

README_ARGS = ["train", "--epochs", "6", "--no-progress"]  # the README command, fewer epochs for time


def start_job(args, out, cache, cwd):
    return subprocess.Popen([sys.executable, "-m", "kaggle_utils", *args, "--out", str(out)], cwd=cwd,
                            env=job_env(cache=cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=900):
    log = proc.communicate(timeout=timeout)[0]
    assert proc.returncode == 0, log[-3000:]
    return log


@pytest.fixture(scope="module")
def learning_run(tmp_path_factory):
    """One uninterrupted run of the README command on one CPU device (no --data-dir: the sample)."""
    tmp = tmp_path_factory.mktemp("learning")
    start = time.perf_counter()
    finish(start_job(README_ARGS, tmp / "run", tmp / "jax_cache", tmp))
    return tmp, time.perf_counter() - start


def comparable(history):
    return [{k: v for k, v in row.items() if k not in ("img_per_s", "seconds")} for row in history]


def test_readme_command_learns_digits_and_submits_every_test_id(learning_run, tmp_path):
    tmp, seconds = learning_run
    out = tmp / "run"
    report = json.loads((out / "metrics.json").read_text())
    print(f"learning run: {seconds:.0f}s; val_acc by epoch {[round(r['val_acc'], 3) for r in report['history']]}")
    assert report["best"]["val_acc"] >= 0.9
    assert {p.name for p in out.iterdir()} >= {"best.msgpack", "last.msgpack", "metrics.json", "history.csv",
                                                "config.json", "submission.csv"}

    truth = make_sample_dataset(tmp_path / "truth", image_size=32).test_labels  # the same embedded sample
    with open(out / "submission.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "label"]
    ids = [r[0] for r in rows[1:]]
    assert len(ids) == len(set(ids)) == len(truth) and set(ids) == set(truth)
    test_acc = np.mean([int(label) == truth[i] for i, label in rows[1:]])
    assert test_acc >= 0.85


def test_predict_command_rewrites_the_submission_from_best(learning_run, tmp_path, capsys):
    tmp, _ = learning_run
    data = make_sample_dataset(tmp_path / "data", image_size=32)  # the same embedded sample, now on disk
    # this process has 8 devices, the training run had one: another layout, the same predictions
    assert job.main(["predict", "--checkpoint", str(tmp / "run" / "best.msgpack"), "--data-dir", data.root,
                     "--out", str(tmp_path / "pred"), "--batch-size", "64", "--no-progress"]) == 0
    assert (tmp_path / "pred" / "submission.csv").read_text() == (tmp / "run" / "submission.csv").read_text()


def test_killed_mid_epoch_then_resumed_ends_like_the_uninterrupted_run(learning_run, tmp_path):
    tmp, _ = learning_run
    out = tmp_path / "run"
    proc = start_job(README_ARGS, out, tmp / "jax_cache", tmp_path)
    deadline = time.monotonic() + 600
    while not (out / "last.json").is_file() or json.loads((out / "last.json").read_text())["epoch"] < 2:
        assert proc.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline, "no epoch finished in time"
        time.sleep(0.05)
    proc.kill()  # SIGKILL, somewhere in epoch 3
    proc.communicate()
    assert proc.returncode == -9
    epochs_kept = json.loads((out / "last.json").read_text())["epoch"]
    assert 2 <= epochs_kept < 6

    log = finish(start_job(README_ARGS + ["--resume"], out, tmp / "jax_cache", tmp_path))
    assert f"resumed from {out / 'last.msgpack'}: {epochs_kept} epoch(s) done" in log
    full, resumed = (json.loads((d / "metrics.json").read_text()) for d in (tmp / "run", out))
    assert comparable(resumed["history"]) == comparable(full["history"])
    for name in ("best.msgpack", "submission.csv"):
        assert (out / name).read_bytes() == (tmp / "run" / name).read_bytes(), name


# --------------------------------------------------------------------------- bad input


def test_missing_split_is_named(sample, tmp_path, capsys):
    data = tmp_path / "data"
    shutil.copytree(sample.split_dirs["train"], data / "train")
    code, err = run_main(["train", "--data-dir", str(data), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and f"has no val/ split: expected TFRecords in {data / 'val'}/" in err
    assert not (tmp_path / "out").exists()


def test_num_classes_smaller_than_a_label(sample, tmp_path, capsys):
    code, err = run_main(["train", "--data-dir", sample.root, "--num-classes", "5", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--num-classes 5 is too small" in err and "label 9 (needs at least 10)" in err


def test_num_classes_default_is_max_label_plus_one(sample):
    splits = job.find_splits(sample.root)
    assert job.resolve_num_classes(None, splits, 16) == 10
    assert job.resolve_num_classes(104, splits, 16) == 104


def test_batch_not_divisible_by_the_devices(sample, tmp_path, capsys):
    code, err = run_main(["train", "--data-dir", sample.root, "--batch-size", "12", "--out", str(tmp_path)], capsys)
    assert code == 2 and "--batch-size 12 must be a positive multiple of the 8 devices" in err


def test_image_size_is_read_from_the_file_names(sample):
    assert job.infer_image_size(job.find_splits(sample.root)["train"]) == 16
    assert job.infer_image_size(["a/train.tfrec"]) is None


def test_out_dir_holding_another_run_is_refused(sample, tmp_path, capsys):
    argv = ["train", "--data-dir", sample.root, "--out", str(tmp_path), "--epochs", "3"]
    settings = job._settings(job.build_parser().parse_args(argv), 16, job._global_batch(None))
    (tmp_path / "config.json").write_text(json.dumps({"settings": {**settings, "epochs": 5}}))
    (tmp_path / "last.msgpack").write_bytes(b"x")
    code, err = run_main(argv, capsys)
    assert code == 2 and "holds a run with other settings (epochs: 5 -> 3)" in err and "--overwrite" in err
    code, err = run_main(argv + ["--resume"], capsys)
    assert code == 2 and "epochs: 5 -> 3" in err

    (tmp_path / "config.json").write_text(json.dumps({"settings": settings}))
    code, err = run_main(argv, capsys)
    assert code == 2 and "already holds this run" in err and "--resume" in err


def test_overwrite_removes_only_the_job_outputs(tmp_path):
    for name in ("config.json", "last.msgpack", "metrics.json", "notes.txt"):
        (tmp_path / name).write_text("x")
    job.prepare_out_dir(tmp_path, {}, resume=False, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    with pytest.raises(job.JobError, match="holds no run to resume"):
        job.prepare_out_dir(tmp_path, {}, resume=True, overwrite=False)
    with pytest.raises(job.JobError, match="no config.json: not a run of this job"):
        (tmp_path / "metrics.json").write_text("{}")
        job.prepare_out_dir(tmp_path, {}, resume=False, overwrite=False)


def _fake_checkpoint(path, model_config, *, num_classes):
    """A checkpoint of ``model_config``'s network but with another head size (zeros are enough)."""
    model = job.build_model({**model_config, "num_classes": num_classes})
    shapes = job._abstract_variables(model, model_config["image_size"])
    checkpoint.save(path, jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes),
                    manifest={"model": model_config, "mean": [0.5] * 3, "std": [0.5] * 3})


MODEL = {"name": "tf_efficientnetv2_b0", "num_classes": 10, "dtype": "float32", "drop_rate": 0.0,
         "drop_path_rate": 0.0, "sync_bn": True, "image_size": 16}


def test_predict_with_a_checkpoint_of_another_head_size(sample, tmp_path, capsys):
    _fake_checkpoint(tmp_path / "best.msgpack", MODEL, num_classes=7)
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "best.msgpack"), "--data-dir", sample.root,
                          "--out", str(tmp_path / "pred")], capsys)
    assert code == 2 and "mis-shaped" in err and "classifier/kernel: file (1280, 7) vs expected (1280, 10)" in err
    assert not (tmp_path / "pred").exists()


def test_predict_with_a_checkpoint_of_another_model(sample, tmp_path, capsys):
    _fake_checkpoint(tmp_path / "best.msgpack", {**MODEL, "name": "efficientnet_lite0"}, num_classes=10)
    manifest = checkpoint.manifest_path(tmp_path / "best.msgpack")
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "model": MODEL}))  # a lying manifest
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "best.msgpack"), "--data-dir", sample.root,
                          "--out", str(tmp_path)], capsys)
    assert code == 2 and "does not match the expected structure" in err and "missing" in err


def test_predict_needs_the_manifest_and_a_test_split(sample, tmp_path, capsys):
    (tmp_path / "w.msgpack").write_bytes(b"x")
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "w.msgpack"), "--data-dir", sample.root,
                          "--out", str(tmp_path)], capsys)
    assert code == 2 and "has no manifest w.json" in err
    data = tmp_path / "no_test"
    shutil.copytree(sample.split_dirs["train"], data / "train")
    _fake_checkpoint(tmp_path / "best.msgpack", MODEL, num_classes=10)
    code, err = run_main(["predict", "--checkpoint", str(tmp_path / "best.msgpack"), "--data-dir", str(data),
                          "--out", str(tmp_path)], capsys)
    assert code == 2 and "has no test/ split" in err
