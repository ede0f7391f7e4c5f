"""Two processes x 2 CPU devices (jax.distributed + gloo) == one process x 4 devices."""
import json
import socket
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from kaggle_utils.train import TIMING_COLUMNS
from job_helpers import cpu_process_env
from multihost_run import run

HERE = Path(__file__).parent
MODES = ("jit", "pmap")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def comparable(history):
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in history]


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory):
    out = tmp_path_factory.mktemp("multihost")
    env = cpu_process_env(2)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(HERE / "multihost_worker.py"), str(i), str(port), str(out), *MODES],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a worker of the two-process run hung")
    for i, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"worker {i} failed:\n{log[-3000:]}"
    return out


@pytest.mark.slow  # starts a job process (tests/tiers.py)
@pytest.mark.parametrize("mode", MODES)
def test_two_processes_train_like_one_process_with_four_devices(two_processes, tmp_path, mode):
    reference = run(mode, tmp_path / "reference", devices=jax.devices()[:4])
    want = [np.asarray(x) for x in jax.tree.leaves(reference.state)]
    for pid in range(2):
        got = np.load(two_processes / f"result-{mode}-p{pid}.npz")
        assert len(got.files) - 1 == len(want)
        for i, w in enumerate(want):
            np.testing.assert_allclose(got[f"leaf{i}"], w, atol=1e-5, err_msg=f"process {pid}, leaf {i}")
        history = json.loads(str(got["history"]))
        for got_row, want_row in zip(comparable(history), comparable(reference.history), strict=True):
            assert got_row == pytest.approx(want_row, abs=1e-5), (pid, got_row, want_row)
    # metrics are global: the validation split has 397 examples, so accuracy is k / 397
    assert reference.history[-1]["val_acc"] * 397 == pytest.approx(round(reference.history[-1]["val_acc"] * 397))


@pytest.mark.slow  # starts a job process (tests/tiers.py)
@pytest.mark.parametrize("mode", MODES)
def test_only_process_zero_writes_files(two_processes, mode):
    written = sorted(p.name for p in (two_processes / f"run-{mode}-p0").iterdir())
    assert written == ["best.json", "best.msgpack", "history.csv", "last.json", "last.msgpack", "metrics.json"]
    assert not (two_processes / f"run-{mode}-p1").exists()
