"""How the job stops (issue 26, the weak list): one named line and an exit code, never a traceback,
and before any work where the input alone decides it."""
import errno
import json
import os

import pytest

from kaggle_utils import checkpoint, job, run

from fs_helpers import read_only_folder
from job_helpers import TEST_MODEL


def run_main(argv, capsys):
    """(exit code, stderr) of the job run in this process."""
    with pytest.raises(SystemExit) as exit_info:
        job.main(argv)
    return exit_info.value.code, capsys.readouterr().err


def _no_work(*args, **kwargs):
    raise AssertionError("the command started its work before refusing")


# --------------------------------------------------------------------------- output place


def test_predict_onto_a_file_is_refused_before_predicting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "load_run", _no_work)
    (tmp_path / "taken").write_text("x")
    code, err = run_main(["predict", "--checkpoint", str(tmp_path), "--data-dir", str(tmp_path),
                          "--out", str(tmp_path / "taken")], capsys)
    assert code == 2 and f"--out {tmp_path / 'taken'} is a file, not a folder" in err, err
    assert (tmp_path / "taken").read_text() == "x"


def test_predict_into_a_read_only_folder_is_refused_before_predicting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "load_run", _no_work)
    with read_only_folder(tmp_path / "ro") as ro:
        code, err = run_main(["predict", "--checkpoint", str(tmp_path), "--data-dir", str(tmp_path),
                              "--out", str(ro / "sub")], capsys)
    assert code == 2 and f"--out {ro / 'sub'} is not writable ({ro} is not writable)" in err, err


# --------------------------------------------------------------------------- stops mid-run


def test_ctrl_c_says_where_the_run_can_go_on_from(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    checkpoint.save(out / "last.msgpack", {"x": [0]}, manifest={"step": 7})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "train", interrupted)
    code, err = run_main(["train", "--out", str(out)], capsys)
    assert code == 130 and "Traceback" not in err
    assert err.strip().splitlines() == [f"python -m kaggle_utils train: interrupted; {out}/last.msgpack (step 7) is "
                                        "intact: the same command with --resume continues from it"]
    code, err = run_main(["train", "--out", str(tmp_path / "new")], capsys)
    assert code == 130 and "stopped before its first checkpoint: run the same command again" in err


def test_a_full_disk_mid_run_is_one_line_and_the_last_checkpoint_loads(sample, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    real_fsync = os.fsync

    def disk_full_after_the_first_checkpoint(fd):
        if (out / "last.json").exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", disk_full_after_the_first_checkpoint)
    code, err = run_main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--steps", "4",
                          "--steps-per-epoch", "2", "--checkpoint-every", "2", "--no-progress", "--out", str(out)],
                         capsys)
    monkeypatch.undo()
    step = json.loads((out / "last.json").read_text())["step"]
    assert code == 2 and "Traceback" not in err, err
    line, = err.strip().splitlines()
    assert line.startswith(f"python -m kaggle_utils train: error: {out}/") and "No space left on device [ENOSPC]" in line
    assert f"{out}/last.msgpack (step {step}) is intact: free space, then the same command with --resume" in line
    assert "state" in checkpoint.load(out / "last.msgpack")
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
