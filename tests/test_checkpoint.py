"""Checkpoint files: permissions, leftovers of killed writers, foreign formats named."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from kaggle_utils import checkpoint


@pytest.fixture
def umask():
    """Sets the process umask for one test and restores it."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_written_files_get_the_umask_permissions_not_the_temp_files(tmp_path, umask, mask, mode):
    umask(mask)
    checkpoint.save(tmp_path / "w.msgpack", {"a": np.ones(3)}, manifest={"model": "x"})
    checkpoint.atomic_write_text(tmp_path / "submission.csv", "id,label\n")
    for name in ("w.msgpack", "w.json", "submission.csv"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, name


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from kaggle_utils import checkpoint
    folder = sys.argv[1]
    checkpoint.save(folder + "/last.msgpack", {"step": np.int64(1)})
    print("ready", flush=True)
    big = {"w": np.arange(48 * 2**20 // 8, dtype=np.int64)}
    while True:
        checkpoint.save(folder + "/big.msgpack", big)
""")


def _kill_mid_write(folder) -> list:
    """Starts a writer, SIGKILLs it while a temporary file exists; returns the leftovers."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 60
        while not any(p.name.endswith(".tmp") for p in folder.iterdir()):
            assert time.monotonic() < deadline, "the writer never started a write"
            time.sleep(0.001)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    return [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_writer_killed_mid_write_leaves_a_temp_file_that_cleanup_removes(tmp_path):
    for _ in range(5):  # the kill can land just after a rename; then the next try catches a write
        leftovers = _kill_mid_write(tmp_path)
        if leftovers:
            break
    assert leftovers, "no kill landed during a write in 5 tries"
    (leftover,) = leftovers
    assert leftover.name.startswith(".big.msgpack.")
    last_before = (tmp_path / "last.msgpack").read_bytes()

    removed = checkpoint.remove_stale_temp_files(tmp_path)

    assert removed == [leftover] and not leftover.exists()
    assert (tmp_path / "last.msgpack").read_bytes() == last_before
    assert int(checkpoint.load(tmp_path / "last.msgpack")["step"]) == 1
    assert not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())


def _temp_name(name, pid, host_tag):
    return f".{name}.{pid}.{host_tag}.ab12cd_e.tmp"


def test_cleanup_keeps_live_writers_and_files_that_are_not_its_own(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    host = checkpoint._HOST_TAG
    other_host = "0123abcd" if host != "0123abcd" else "fedc3210"
    files = {
        _temp_name("last.msgpack", dead_pid, host): True,  # this host, writer gone
        _temp_name("best.msgpack", os.getpid(), host): False,  # this host, writer alive (this test)
        _temp_name("old.msgpack", 12345, other_host): True,  # another host, untouched for two hours
        _temp_name("new.msgpack", 12345, other_host): False,  # another host, maybe still writing
        ".notes.txt.tmp": False,  # someone else's naming
        "last.msgpack": False,
    }
    for name in files:
        (tmp_path / name).write_bytes(b"x")
    two_hours_ago = time.time() - 7200
    os.utime(tmp_path / _temp_name("old.msgpack", 12345, other_host), (two_hours_ago, two_hours_ago))

    removed = checkpoint.remove_stale_temp_files(tmp_path)

    assert sorted(p.name for p in removed) == sorted(n for n, stale in files.items() if stale)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for n, stale in files.items() if not stale)
    assert checkpoint.remove_stale_temp_files(tmp_path / "absent") == []


def test_temp_names_carry_this_writer(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (seen.append(os.path.basename(src)), real_replace(src, dst)))
    checkpoint.atomic_write_text(tmp_path / "metrics.json", "{}")
    (name,) = seen
    match = checkpoint._TEMP_NAME.match(name)
    assert match and match["name"] == "metrics.json" and int(match["pid"]) == os.getpid()


@pytest.fixture(scope="module")
def torch_files(tmp_path_factory):
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("torch")
    state = {"conv_stem.weight": torch.ones(4, 3, 3, 3), "bn1.weight": torch.ones(4)}
    torch.save(state, folder / "zip.pth")
    torch.save(state, folder / "pickle.pt", _use_new_zipfile_serialization=False)
    save_file(state, folder / "w.safetensors")
    return folder


@pytest.mark.parametrize("name, kind", [("zip.pth", "zip archive"), ("pickle.pt", "pickle"),
                                        ("w.safetensors", "safetensors")])
def test_a_pytorch_file_is_named_and_the_conversion_command_given(torch_files, name, kind):
    path = torch_files / name
    before = path.read_bytes()
    with pytest.raises(checkpoint.CheckpointError) as info:
        checkpoint.load(path)
    message = str(info.value)
    assert f"checkpoint {path} is a PyTorch" in message and kind in message
    assert f"python -m weights_port MODEL --checkpoint {path} --out {path.stem}.msgpack" in message
    assert "truncated or corrupt" not in message
    assert path.read_bytes() == before


def test_msgpack_checkpoints_are_not_mistaken_for_pytorch_files(tmp_path):
    for tree in ({}, {"a": np.zeros(3)}, {"x" * 20: {"y": np.ones((2, 2), np.float32)}}):
        checkpoint.save(tmp_path / "t.msgpack", tree)
        assert checkpoint._torch_format((tmp_path / "t.msgpack").read_bytes()) is None
        checkpoint.load(tmp_path / "t.msgpack")
