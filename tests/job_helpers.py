"""``python -m kaggle_utils`` as a real process, for the tests that need one (kills, locks, exit codes)."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# timm's minimal EfficientNet (parity-checked like every variant): for the job tests about anything but
# the network, a run compiles in seconds instead of the default model's minute
TEST_MODEL = "test_efficientnet"


def xla_flags(devices):
    """This process's ``XLA_FLAGS`` (the suite's, see conftest) and a count of CPU devices, for a process it starts."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()


def job_process(args, out, cwd):
    """The job on one CPU device, in this environment (and so the session's compilation cache, see conftest)."""
    env = {**os.environ, "XLA_FLAGS": xla_flags(1), "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "kaggle_utils", *args, "--out", str(out)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc, timeout=900):
    """The log of a job that must succeed."""
    log = proc.communicate(timeout=timeout)[0]
    assert proc.returncode == 0, log[-3000:]
    return log
