"""bench/model_speed.py without a GPU: the modes in --help, each mode's defaults, the one-line refusal.

The GPU modes themselves need a lent GPU; what runs everywhere is that the script imports and
shows them without CUDA, fills in each mode's defaults, and stops with one line (exit code 2,
no traceback) where torch or JAX sees no GPU.
"""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "model_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_model_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_lists_every_mode_and_what_it_compares():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as on a machine without a GPU
    done = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    for text in ("--mode {cpu,gpu,gpu-bf16,gpu-fp32}", "AMP bf16 + channels_last", "TF32 off on both sides",
                 "--batch", "--size", "--model"):
        assert text in done.stdout
    assert "tensorflow" not in done.stderr.lower()


def test_each_mode_fills_in_its_own_defaults_and_keeps_given_flags(bench, monkeypatch):
    monkeypatch.setattr(bench, "gpu_problem", lambda: None)  # as on a machine with a GPU
    cpu = bench.parse_args([])
    assert (cpu.mode, cpu.batch, cpu.rounds, cpu.iters, cpu.warmup) == ("cpu", 8, 7, 3, 2)
    gpu = bench.parse_args(["--mode", "gpu"])
    assert (gpu.batch, gpu.rounds, gpu.iters, gpu.warmup) == (64, 5, 20, 5)
    assert bench.MODES["gpu"] == ("bf16", "fp32")
    quick = bench.parse_args(["--mode", "gpu-bf16", "--quick", "--batch", "128", "--size", "300"])
    assert (quick.batch, quick.size, quick.rounds, quick.iters) == (128, 300, 3, 10)
    assert bench.parse_args(["--quick"]).iters == 2


def test_bad_numbers_are_refused_naming_the_flags(bench, capsys):
    with pytest.raises(SystemExit) as stop:
        bench.parse_args(["--batch", "0"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--batch 0:" in err and "Traceback" not in err


@pytest.mark.parametrize("missing", ["torch", "jax"])
def test_gpu_modes_without_a_gpu_stop_with_one_line(bench, monkeypatch, capsys, missing):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: missing != "torch")

    def no_gpu(backend=None):
        if backend == "gpu":
            raise RuntimeError("Unknown backend: 'gpu' requested, but no platforms that are instances of gpu")
        return real_devices(backend)

    real_devices = jax.devices
    monkeypatch.setattr(jax, "devices", no_gpu)
    with pytest.raises(SystemExit) as stop:
        bench.main(["--mode", "gpu-fp32"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--mode gpu-fp32 needs a GPU" in err
    assert ("visible to torch" if missing == "torch" else "visible to JAX") in err
