"""The job never loses a run and never lies: real processes for the faults, exit codes and files checked."""
import json
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint, job, run
from kaggle_utils.data import write_split

from job_helpers import TEST_MODEL, finish, job_process


# 2 epochs of 19 steps; checkpoints every 7 steps, so those at 21, 28 and 35 fall inside epoch 2
RESUMABLE_ARGS = ["train", "--model", TEST_MODEL, "--epochs", "2", "--no-progress", "--checkpoint-every", "7",
                  "--keep-checkpoints", "2"]


def comparable(history):
    return [{k: v for k, v in row.items() if k not in ("img_per_s", "seconds")} for row in history]


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_killed_mid_epoch_then_resumed_ends_like_the_uninterrupted_run(sample, tmp_path):
    full = tmp_path / "full"
    finish(job_process([*RESUMABLE_ARGS, "--data-dir", sample.root], full, tmp_path))
    out = tmp_path / "run"
    proc = job_process([*RESUMABLE_ARGS, "--data-dir", sample.root], out, tmp_path)
    deadline = time.monotonic() + 600

    def saved_step():
        try:
            return json.loads((out / "last.json").read_text())["step"]
        except (OSError, ValueError):
            return 0

    while saved_step() < 21:
        assert proc.poll() is None, "the job ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint came in time"
        time.sleep(0.02)
    proc.kill()  # SIGKILL, mid-epoch
    proc.communicate()
    assert proc.returncode == -9
    step_kept = saved_step()
    assert step_kept % 19 != 0 and step_kept < 38

    log = finish(job_process([*RESUMABLE_ARGS, "--data-dir", sample.root, "--resume"], out, tmp_path))
    assert f"resumed from {out / 'last.msgpack'}:" in log and f"step {step_kept}" in log
    reference, resumed = (json.loads((d / "metrics.json").read_text()) for d in (full, out))
    assert comparable(resumed["history"]) == comparable(reference["history"])
    for name in ("best.msgpack", "submission.csv"):
        assert (out / name).read_bytes() == (full / name).read_bytes(), name
    states = [checkpoint.load(d / "last.msgpack")["state"] for d in (full, out)]  # its history has timings
    for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_a_second_run_into_the_same_folder_is_refused_while_the_first_runs(sample, tmp_path):
    out = tmp_path / "run"
    first = job_process(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--steps", "4",
                         "--steps-per-epoch", "2", "--no-progress"], out, tmp_path)
    deadline = time.monotonic() + 300
    while not (out / ".kaggle_utils.lock").is_file():
        assert first.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    second = job_process(["train", "--data-dir", sample.root, "--steps", "2", "--no-progress"], out, tmp_path)
    log = second.communicate(timeout=300)[0]
    assert second.returncode == 2 and f"--out {out} is in use by another run (pid {first.pid} on" in log, log
    log = first.communicate(timeout=900)[0]
    assert first.returncode == 0, log[-2000:]
    assert json.loads((out / "config.json").read_text())["config"]["loop"]["steps"] == 4  # the first run's files
    assert json.loads((out / "last.json").read_text())["step"] == 4
    assert not (out / ".kaggle_utils.lock").exists()


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_a_diverging_run_stops_before_saving_a_diverged_state(sample, tmp_path):
    out = tmp_path / "run"
    proc = job_process(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--lr", "1e30", "--steps", "3",
                        "--steps-per-epoch", "1", "--log-every", "1", "--no-progress"], out, tmp_path)
    log = proc.communicate(timeout=900)[0]
    assert proc.returncode == 3, log[-2000:]
    assert "stopped before writing anything, so the checkpoints hold the last good state" in log
    for name in ("last.msgpack", "best.msgpack"):  # step 1 already diverged: nothing may be saved
        if (out / name).exists():
            saved = checkpoint.load(out / name)
            assert all(np.isfinite(x).all() for x in jax.tree.leaves(saved)), name


def _with_bad_test_split(sample, tmp_path, ids):
    data = tmp_path / "data"
    for split in ("train", "val"):
        (data / split).mkdir(parents=True)
        for f in Path(sample.split_dirs[split]).iterdir():
            (data / split / f.name).symlink_to(f)
    images = np.zeros((len(ids), 16, 16, 3), np.uint8)
    write_split(data / "test", images, ids=ids)
    return data


@pytest.mark.parametrize("ids, message", [
    (["a", "b", "a"], "test ids repeat (1 duplicates, e.g. ['a'])"),
])
def test_test_split_problems_stop_the_job_before_the_first_step(sample, tmp_path, capsys, monkeypatch, ids, message):
    data = _with_bad_test_split(sample, tmp_path, ids)

    def no_training(*args, **kwargs):
        raise AssertionError("the job reached training")

    monkeypatch.setattr(run, "build_training", no_training)
    with pytest.raises(SystemExit) as exit_info:
        job.main(["train", "--data-dir", str(data), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_negative_label_is_named_before_training(tmp_path, capsys, monkeypatch):
    data = tmp_path / "data"
    images = np.zeros((8, 16, 16, 3), np.uint8)
    write_split(data / "train", images, labels=[0, 1, 2, -1, 0, 1, 2, 0])
    write_split(data / "val", images, labels=[0, 1, 2, 0, 0, 1, 2, 0])
    monkeypatch.setattr(run, "build_training", lambda *a, **k: pytest.fail("the job reached training"))
    with pytest.raises(SystemExit) as exit_info:
        job.main(["train", "--data-dir", str(data), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "the train split holds label -1: labels must be in [0, classes)" in err


def test_pytorch_weights_are_named_with_the_command_to_convert_them(tmp_path, capsys):
    (tmp_path / "model.pth").write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(SystemExit) as exit_info:
        job.main(["train", "--weights", str(tmp_path / "model.pth"), "--out", str(tmp_path / "out"), "--steps", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "is a PyTorch checkpoint" in err and "python -m weights_port" in err
