"""The job: ``python -m kaggle_utils`` as a real process, for the tests that need one (kills, locks, a fresh process's
log), or ``job.main`` in this process for the rest (the suite's imports, devices and compiled programs reused)."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# timm's minimal EfficientNet (parity-checked like every variant): for the job tests about anything but
# the network, a run compiles in seconds instead of the default model's minute
TEST_MODEL = "test_efficientnet"


def cpu_process_env(devices):
    """The environment of a process a test starts: this one's (the suite's ``XLA_FLAGS`` and compilation cache, see
    conftest), on ``devices`` CPU devices, importing this checkout's kit."""
    return {**os.environ, "JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip(),
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def job_process(args, out, cwd):
    """The job on one CPU device, in this environment (and so the session's compilation cache, see conftest)."""
    env = cpu_process_env(1)
    return subprocess.Popen([sys.executable, "-m", "kaggle_utils", *args, "--out", str(out)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def job_in_process(args, out, capfd) -> str:
    """The log of the job run by ``job.main`` in this process (on the suite's 8 CPU devices), which must succeed."""
    from kaggle_utils import job

    code = job.main([*args, "--out", str(out)])
    captured = capfd.readouterr()
    log = captured.out + captured.err
    assert code == 0, log[-3000:]
    return log


def finish(proc, timeout=900):
    """The log of a job that must succeed."""
    log = proc.communicate(timeout=timeout)[0]
    assert proc.returncode == 0, log[-3000:]
    return log
