"""The bench scripts' cheap parts, without a GPU and without timing anything.

* ``bench/model_speed.py``: the GPU modes need a lent GPU; what runs everywhere is that the script
  imports and shows them without CUDA, fills in each mode's defaults, and stops with one line
  (exit code 2, no traceback) where torch or JAX sees no GPU.
* ``bench/job_speed.py``: its flags, the job config of every route (checked by the job's own
  checks), the verdict. The measurement itself compiles a model per route and is run by hand
  (bench/README.md).
* ``bench/stage_speed.py``: one tiny run end to end (timm's ``test_efficientnet`` at 32 px): every
  piece of the network is timed on both sides, at the shape timm's forward gives it.
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
import torch

from kaggle_utils import run

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_script(name: str):
    if str(BENCH) not in sys.path:  # as when a script in bench/ runs: its siblings import by name
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def model_speed():
    return load_script("model_speed")


@pytest.fixture(scope="module")
def job_speed():
    return load_script("job_speed")


@pytest.fixture(scope="module")
def stage_speed():
    return load_script("stage_speed")


# --------------------------------------------------------------------------- model_speed.py

@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_model_speed_help_lists_every_mode_without_cuda():
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as on a machine without a GPU
    done = subprocess.run([sys.executable, str(BENCH / "model_speed.py"), "--help"], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    for text in ("--mode {cpu,gpu,gpu-fp16,gpu-bf16,gpu-fp32}", "AMP bf16 + channels_last", "TF32 off on both sides",
                 "--batch", "--size", "--model"):
        assert text in done.stdout
    assert "tensorflow" not in done.stderr.lower()


def test_model_speed_mode_defaults_and_given_flags(model_speed, monkeypatch):
    monkeypatch.setattr(model_speed, "gpu_problem", lambda: None)  # as on a machine with a GPU
    cpu = model_speed.parse_args([])
    assert (cpu.mode, cpu.batch, cpu.rounds, cpu.iters, cpu.warmup) == ("cpu", 8, 7, 3, 2)
    gpu = model_speed.parse_args(["--mode", "gpu"])
    assert (gpu.batch, gpu.rounds, gpu.iters, gpu.warmup) == (64, 5, 20, 5)
    assert model_speed.MODES["gpu"] == ("fp16", "bf16", "fp32")
    quick = model_speed.parse_args(["--mode", "gpu-bf16", "--quick", "--batch", "128", "--size", "300"])
    assert (quick.batch, quick.size, quick.rounds, quick.iters) == (128, 300, 3, 10)
    assert model_speed.parse_args(["--quick"]).iters == 2


def test_model_speed_refuses_bad_numbers_naming_the_flags(model_speed, capsys):
    with pytest.raises(SystemExit) as stop:
        model_speed.parse_args(["--batch", "0"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--batch 0:" in err and "Traceback" not in err


def test_model_speed_fp16_flax_side_trains_with_the_kits_loss_scale(model_speed):
    """The T4 comparison's Flax side runs anywhere (slowly on a CPU); timm's GradScaler needs CUDA."""
    import numpy as np
    import timm

    timm_model = timm.create_model("test_efficientnet", pretrained=False, drop_rate=0.0, drop_path_rate=0.0)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((8, 3, 32, 32), dtype=np.float32)  # at 16 px x 2 its last BatchNorms see 2 values
    labels = rng.integers(0, 1000, 8).astype(np.int32)
    cases = model_speed.flax_cases("test_efficientnet", timm_model, images, labels, "auto", "fp16")
    losses = [float(cases["train"]()) for _ in range(3)]
    assert all(np.isfinite(losses)) and losses[2] < losses[1] < losses[0], losses  # it trains, in float16
    assert model_speed.peak_tflops("Tesla T4", "fp16") == 65.0 and model_speed.peak_tflops("Tesla T4", "bf16") is None
    assert model_speed.peak_tflops("some future card", "fp16") is None


@pytest.mark.parametrize("missing", ["torch", "jax"])
def test_model_speed_gpu_modes_without_a_gpu_stop_with_one_line(model_speed, monkeypatch, capsys, missing):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: missing != "torch")

    def no_gpu(backend=None):
        if backend == "gpu":
            raise RuntimeError("Unknown backend: 'gpu' requested, but no platforms that are instances of gpu")
        return real_devices(backend)

    real_devices = jax.devices
    monkeypatch.setattr(jax, "devices", no_gpu)
    with pytest.raises(SystemExit) as stop:
        model_speed.main(["--mode", "gpu-fp32"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--mode gpu-fp32 needs a GPU" in err
    assert ("visible to torch" if missing == "torch" else "visible to JAX") in err


# --------------------------------------------------------------------------- job_speed.py


def test_job_speed_times_every_route_with_a_config_the_job_accepts(job_speed):
    args = job_speed.parse_args([])
    assert args.routes == ["none", "randaugment", "imgaug", "randaugment-device"]
    assert (args.size, args.batch) == (64, 16)
    for route in args.routes:
        config = job_speed.job_config(args, route)
        run.check_config(config)  # the job's own checks: values, model name, monitor
        assert config.data.augment == route
        assert config.loop.log_every == args.steps  # a log window is a timed window
        assert config.loop.steps == config.loop.steps_per_epoch == args.steps * (args.windows + 1)
        assert not config.loop.tensorboard and config.data.deterministic  # as the job runs by default
    assert not job_speed.job_config(job_speed.parse_args(["--nondeterministic"]), "imgaug").data.deterministic


def test_job_speed_keeps_flags_given_and_refuses_bad_ones(job_speed, capsys):
    args = job_speed.parse_args(["--routes", "imgaug", "none", "imgaug", "--size", "128", "--batch", "64"])
    assert args.routes == ["imgaug", "none"] and (args.size, args.batch) == (128, 64)
    assert job_speed.parse_args(["--data-dir", "somewhere"]).size is None  # the stored size
    for flags, named in ((["--steps", "0"], "--steps 0"), (["--size", "4"], "--size 4"),
                         (["--threshold", "1.5"], "--threshold 1.5"), (["--routes", "mixup"], "invalid choice")):
        with pytest.raises(SystemExit) as stop:
            job_speed.parse_args(flags)
        assert stop.value.code == 2
        assert named in capsys.readouterr().err


def test_verdict_reads_the_ratio_against_the_threshold(job_speed):
    assert job_speed.verdict(0.5, 0.9) == "input-bound"
    assert job_speed.verdict(0.95, 0.9) == "fed"
    assert job_speed.verdict(0.9, 0.9) == "fed"


def test_job_speed_host_cores_flag_and_a_report_line_per_route(job_speed, capsys):
    import os

    allowed = len(os.sched_getaffinity(0))
    assert job_speed.parse_args(["--host-cores", "1"]).host_cores == 1
    assert job_speed.parse_args([]).host_cores is None  # every core this process may use
    for cores in ("0", str(allowed + 1)):
        with pytest.raises(SystemExit) as stop:
            job_speed.parse_args(["--host-cores", cores])
        assert stop.value.code == 2 and f"--host-cores {cores}: must be in [1, {allowed}]" in capsys.readouterr().err
    assert job_speed.restrict_host(None) == f"{allowed} host cores"  # without the flag nothing is pinned

    args = job_speed.parse_args(["--routes", "imgaug", "randaugment-device", "--rounds", "1"])
    rates = {"imgaug": (40.0, 30.0, 100.0), "randaugment-device": (500.0, 95.0, 100.0)}  # feed, job, step
    result = {"runs": {name: {"feed": [[feed]], "job": [[job]], "step": [[step]]}
                       for name, (feed, job, step) in rates.items()},
              "seconds": 1.0, "config": job_speed.job_config(args, "none"), "stored_size": 64}
    job_speed.report(result, args, 0.0, "4 of 16 host cores (pinned)")
    out = capsys.readouterr().out
    assert "4 of 16 host cores (pinned)" in out and "| route | host feeds img/s | step-alone img/s | job img/s |" in out
    assert "| imgaug | 40.0 | 100.0 | 30.0 | **0.30** | 0.30 | input-bound |" in out
    assert "| randaugment-device | 500.0 | 100.0 | 95.0 | **0.95** | 0.95 | fed |" in out


# --------------------------------------------------------------------------- stage_speed.py


def test_stage_speed_times_every_piece_of_the_network_on_both_sides(stage_speed, capsys):
    import timm

    args = stage_speed.parse_args(["--model", "test_efficientnet", "--size", "32", "--batch", "2",
                                   "--rounds", "2", "--iters", "1", "--warmup", "1"])
    rows = stage_speed.run(args)
    stages = len(timm.create_model("test_efficientnet").blocks)
    assert [r["piece"] for r in rows] == ["stem"] + [f"stage {i}" for i in range(stages)] + ["head"]
    assert rows[0]["shape"] == (2, 3, 32, 32) and rows[1]["shape"] == (2, 24, 16, 16)  # after the stride-2 stem
    for row in rows:
        assert len(row["flax"]) == len(row["timm"]) == 2 and min(r["ms"] for r in row["flax"] + row["timm"]) > 0
    stage_speed.report(rows, args, 0.0)
    table = capsys.readouterr().out
    assert table.count("\n| stage ") == stages and "| all pieces |" in table


def test_stage_speed_compiled_peer_runs_every_timm_piece_under_torch_compile(stage_speed, monkeypatch, capsys):
    compiled = []

    def fake_compile(module, mode):  # records what would be compiled; inductor itself takes minutes here
        compiled.append((module, mode))
        return module

    monkeypatch.setattr(torch, "compile", fake_compile)
    args = stage_speed.parse_args(["--model", "test_efficientnet", "--size", "32", "--batch", "2",
                                   "--rounds", "1", "--iters", "1", "--warmup", "1", "--torch-compile", "default"])
    rows = stage_speed.run(args)
    assert len(compiled) == len(rows) and {mode for _, mode in compiled} == {"default"}
    assert all(isinstance(module, torch.nn.Module) for module, _ in compiled)
    stage_speed.report(rows, args, 0.0)
    assert "timm side: timm + torch.compile default" in capsys.readouterr().out
    assert stage_speed.parse_args([]).torch_compile is None  # eager timm unless asked


def test_stage_speed_refuses_bad_numbers_naming_the_flags(stage_speed, capsys):
    with pytest.raises(SystemExit) as stop:
        stage_speed.parse_args(["--rounds", "0", "--size", "4"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--rounds 0, --size 4:" in err and "Traceback" not in err


# --------------------------------------------------------------------------- progressive.py

def test_progressive_bench_compares_one_config_with_and_without_stages_the_job_accepts(tmp_path):
    progressive = load_script("progressive")
    args = progressive.parse_args([])
    data = run.RunData(tmp_path, {}, stored_size=args.size, num_train=1258, max_label=9, description="x")
    fixed, plan = run.resolve(progressive.fixed_config(args, "digits"), data)
    staged, staged_plan = run.resolve(progressive.progressive_config(args, "digits"), data)
    assert plan.stages == () and [s.image_size for s in staged_plan.stages] == [24, 32, 40, 48]
    assert staged.replace(progressive_stages=0, progressive_min_size=None, progressive_dropout=False) == fixed


def test_progressive_bench_times_a_run_to_its_first_row_at_the_target():
    progressive = load_script("progressive")
    history = [{"epoch": 1, "seconds": 10.0, "val_acc": 0.5}, {"epoch": 2, "seconds": 4.0, "val_acc": 0.92},
               {"epoch": 3, "seconds": 4.0, "val_acc": 0.95}]
    assert progressive.time_to(history, 0.9, {1: 6.0, 2: 1.0, 3: 2.0}) == (14.0, 7.0)  # stage 3's compile is later
    assert progressive.time_to(history, 0.99, {1: 6.0}) == (None, None)


# --------------------------------------------------------------------------- finetune_real.py

@pytest.mark.parametrize("task", ["softmax", "multilabel"])
def test_finetune_real_gives_the_kit_timms_recipe_by_flags_the_job_accepts(task):
    import argparse

    from kaggle_utils.config import add_config_flags, config_from_args

    finetune = load_script("finetune_real")
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    flags = finetune.timm_recipe_flags(32, task) + ["--weights", "lite0.msgpack", "--task", task]
    config = config_from_args(parser.parse_args(flags)).check()
    assert (config.optim.lr, config.optim.weight_decay, config.model.zero_head) == (1e-3 * 256 / 32, 0.05, False)
    assert (config.data.train_crop, config.data.crop_scale, config.data.crop_pct) == ("random-resized", 0.08, 0.875)
    assert (config.model.drop_rate, config.model.drop_path_rate, config.optim.ema_decay) == (0, 0, 0)
    assert (config.data.augment, config.data.color_jitter, config.data.interpolation) == (
        "color-jitter", 0.4, "bicubic")  # timm's create_transform with Lite0's pretrained cfg
    assert config.loop.monitor == "step"  # timm's script scores its last epoch, not the best by validation
    expected = (0.1, "auto", "auto") if task == "softmax" else (0.0, 0.5, 0)  # BCE: no smoothing, one 0.5 threshold
    assert (config.task.label_smoothing, config.task.threshold, config.task.min_labels) == expected


def test_finetune_real_scores_exact_match_macro_and_sample_f1():
    finetune = load_script("finetune_real")
    labels = {"a": "cat", "b": "dog", "c": "cat", "d": "owl"}
    predicted = {"a": {"cat"}, "b": {"cat", "dog"}, "c": set(), "d": {"owl"}}
    scores = finetune.score(predicted, labels, ["cat", "dog", "owl"])
    assert scores["test_acc"] == 0.5 and scores["empty_rows"] == 1 and scores["test_images"] == 4
    assert scores["test_samples_f1"] == pytest.approx((1 + 2 / 3 + 0 + 1) / 4)
    assert scores["test_f1"] == pytest.approx((0.5 + 1 + 1) / 3)  # cat: 1 right, 1 extra, 1 missed; dog, owl right


# --------------------------------------------------------------------------- distill.py

def test_distill_scores_a_submission_against_the_test_labels_and_tables_each_arm_against_plain(tmp_path):
    distill = load_script("distill")
    data = tmp_path / "data"
    data.mkdir()
    (data / "test_labels.csv").write_text("id,label\nimg_1.jpg,cat\nimg_2.jpg,dog\nimg_3.jpg,cat\nimg_4.jpg,dog\n")
    (tmp_path / "submission.csv").write_text("id,label\nimg_1,cat\nimg_2,cat\nimg_3,cat\nimg_4,dog\n")
    assert distill.test_accuracy(data, tmp_path / "submission.csv") == 0.75

    results = tmp_path / "results.jsonl"
    for arm, seed, acc in (("plain", 0, 0.50), ("plain", 1, 0.60), ("distilled", 0, 0.70), ("distilled", 1, 0.64)):
        distill.record(results, {"key": ["cifar10-mini", arm, "", seed, 64, 3], "dataset": "cifar10-mini",
                                 "arm": arm, "seed": seed, "size": 64, "test_acc": acc})
    distill.record(results, {"key": ["cifar10-mini", "teacher", 5, 96, 3], "dataset": "cifar10-mini",
                             "arm": "teacher", "seed": 0, "size": 96, "test_acc": 0.8, "oof_acc": 0.75})
    assert ("cifar10-mini", "plain", "", 1, 64, 3) in distill.done_keys(results)  # a rerun skips it
    lines = distill.table(results).splitlines()[2:]
    rows = {cells[1]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in lines)}
    assert rows["plain"][3:5] == ["0.500 0.600", "0.550"]
    assert rows["distilled"][3:6] == ["0.700 0.640", "0.670", "+0.120"]  # (0.70 + 0.64) / 2 - (0.50 + 0.60) / 2
    assert rows["teacher (oof 0.750)"][3:6] == ["0.800", "0.800", "+0.250"]


# --------------------------------------------------------------------------- predict_speed.py

def test_predict_speed_runs_each_case_with_its_cache_cold_or_kept_and_tables_timm_over_kit(tmp_path):
    speed = load_script("predict_speed")
    args = speed.parse_args(["--out", str(tmp_path)])
    (tmp_path / "kit-cache-cold").mkdir()
    (tmp_path / "kit-cache-cold" / "program").write_text("compiled before")
    cmd, env = speed.command(args, "kit cold", tmp_path, tmp_path / "run", tmp_path / "images", tmp_path / "out")
    assert cmd[1:4] == ["-m", "kaggle_utils", "predict"] and "--no-tta" in cmd
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "kit-cache-cold")
    assert not (tmp_path / "kit-cache-cold").exists()  # cold: emptied before the run
    cmd, env = speed.command(args, "timm warm tta", tmp_path, tmp_path / "run", tmp_path / "images", tmp_path / "out")
    assert cmd[-1] == "tta" and env == {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "timm-cache")}

    results = tmp_path / "results.jsonl"
    walls = {"kit cold": [30, 20, 25], "timm cold": [100, 90, 120], "kit warm": [10, 12, 11], "timm warm": [22, 20, 21]}
    results.write_text("".join(json.dumps({"case": case, "images": 1000, "wall_s": w}) + "\n"
                               for case, ws in walls.items() for w in ws))
    lines = speed.table(results).splitlines()[2:]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in lines)}
    assert rows["kit cold"][1:5] == ["3", "25.0 (20.0-30.0)", "40.0", "**4.00**"]  # 100 / 25, medians
    assert rows["kit warm"][4] == "**1.91**" and rows["timm warm"][4] == ""  # 21 / 11
