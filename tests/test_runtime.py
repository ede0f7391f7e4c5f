"""kaggle_utils.runtime: the notebooks' first cell on fake Kaggle trees (tmp_path), on this CPU."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from kaggle_utils import run, runtime
from kaggle_utils.config import DataConfig, TrainConfig

ENV = (runtime.ROOT_ENV, runtime.SMOKE_ENV, runtime.DATA_ENV, runtime.WEIGHTS_ENV, "KAGGLE_KERNEL_RUN_TYPE")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


def competition(root: Path, size: int, mount: str = "input/tpu-getting-started") -> Path:
    folder = root / mount / f"tfrecords-jpeg-{size}x{size}"
    for split in ("train", "val", "test"):
        (folder / split).mkdir(parents=True)
    return folder


def ported(folder: Path, name: str, model) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.msgpack").write_bytes(b"\x80")
    (folder / f"{name}.json").write_text(json.dumps({"model": model, "source": "test"}))
    return folder / f"{name}.msgpack"


def stub_kit(parent: Path) -> Path:
    """A kit whose runtime.setup() says where it was imported from."""
    pkg = parent / "kaggle_utils"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runtime.py").write_text("def setup():\n    print('KIT', __file__)\n")
    return parent


# ------------------------------------------------------------------ the first cell


LAYOUTS = {  # name -> (folder holding the kit, working directory), relative to tmp_path
    "dataset": ("kaggle/input/kaggle-utils", "kaggle/working"),
    "dataset, newer mount": ("kaggle/input/datasets/someone/kaggle-utils", "kaggle/working"),
    "utility script": ("kaggle/usr/lib/kaggle-utils", "kaggle/working"),
    "utility script, notebooks path": ("kaggle/usr/lib/notebooks/someone/kaggle-utils", "kaggle/working"),
    "repository, from notebooks/": ("repo", "repo/notebooks"),
    "repository root": ("repo", "repo"),
}


def run_bootstrap(root: Path, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ENV and k != "PYTHONPATH"}
    env[runtime.ROOT_ENV] = str(root)
    done = subprocess.run([sys.executable, "-c", runtime.BOOTSTRAP], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bootstrap_imports_the_kit_from_each_layout(tmp_path, layout):
    kit_dir, cwd = (tmp_path / p for p in LAYOUTS[layout])
    stub_kit(kit_dir)
    cwd.mkdir(parents=True, exist_ok=True)
    # the pasted snippet, in a fresh interpreter where the real kit is also installed: the stub must win
    assert run_bootstrap(tmp_path / "kaggle", cwd).split() == ["KIT", str(kit_dir / "kaggle_utils" / "runtime.py")]


def test_kit_search_order(tmp_path):
    root, work = tmp_path / "kaggle", tmp_path / "kaggle" / "working"
    work.mkdir(parents=True)
    stub_kit(root / "input" / "kaggle-utils")
    stub_kit(root / "usr" / "lib" / "kaggle-utils")
    assert "usr/lib/kaggle-utils/" in run_bootstrap(root, work)  # a utility script before a dataset
    stub_kit(work)  # a checkout in the working directory beats both
    assert run_bootstrap(root, work).split() == ["KIT", str(work / "kaggle_utils" / "runtime.py")]


def test_import_and_cpu_setup_load_neither_tensorflow_nor_torch(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from kaggle_utils import runtime
        assert not {{"tensorflow", "torch"}} & set(sys.modules), "import"
        rt = runtime.setup(root={str(tmp_path)!r}, quiet=True)
        assert rt.platform == "cpu"
        assert not {{"tensorflow", "torch"}} & set(sys.modules), "setup"
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


# ------------------------------------------------------------------ smoke mode and defaults


@pytest.mark.parametrize("raw, expected", [("1", True), ("true", True), ("ON", True), ("0", False), ("no", False),
                                           ("", True)])  # unset: a CPU without the competition data is smoke
def test_the_smoke_variable_forces_smoke_mode_either_way(tmp_path, monkeypatch, raw, expected):
    (tmp_path / "input").mkdir()
    monkeypatch.setenv(runtime.SMOKE_ENV, raw)
    assert runtime.detect(root=tmp_path).smoke is expected


def test_the_smoke_variable_refuses_other_values(tmp_path, monkeypatch):
    monkeypatch.setenv(runtime.SMOKE_ENV, "maybe")
    with pytest.raises(runtime.RuntimeSetupError, match=f"{runtime.SMOKE_ENV}='maybe'"):
        runtime.detect(root=tmp_path)


def parameter_count(name):
    from kaggle_utils.efficientnet import create_model
    from kaggle_utils.variable_trees import abstract_variables

    shapes = abstract_variables(create_model(name), jax.ShapeDtypeStruct((1, 32, 32, 3), np.float32))
    return sum(leaf.size for leaf in jax.tree.leaves(shapes["params"]))


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_cpu_without_data_is_smoke_sized(tmp_path):
    (tmp_path / "input").mkdir()
    rt = runtime.detect(root=tmp_path)
    full = runtime.defaults("cpu")
    assert (rt.platform, rt.device_count, rt.smoke, rt.data_dir) == ("cpu", jax.device_count(), True, None)
    assert rt.config.model.image_size < full.model.image_size and rt.config.model.image_size <= 64  # small images
    loop = rt.config.loop
    assert loop.steps_per_epoch is not None and loop.steps_per_epoch * loop.epochs <= 10  # few steps
    assert parameter_count(rt.config.model.name) < parameter_count(full.model.name) / 10  # a tiny network
    assert rt.precision == "fp32" and run.global_batch(rt.config) % rt.device_count == 0
    assert rt.on_kaggle and rt.out_dir == tmp_path / "working"


def test_the_config_is_the_jobs_and_a_table_row_is_all_it_takes(tmp_path, monkeypatch):
    (tmp_path / "input").mkdir()
    rt = runtime.detect(root=tmp_path)
    assert rt.config == runtime.defaults("cpu", smoke=True)  # no data, no weights: the smoke row as it is
    assert f"{run.global_batch(rt.config)} per step" in str(rt)  # the report shows the job's batch rule
    monkeypatch.setitem(runtime.PLATFORM_DEFAULTS, "smoke",
                        dict(model="test_efficientnet", image_size=24, batch_per_device=4, epochs=1))
    rt = runtime.detect(root=tmp_path)
    assert (rt.config.model.image_size, rt.config.loop.epochs) == (24, 1)
    assert run.global_batch(rt.config) == 4 * jax.device_count() and f"{4 * jax.device_count()} per step" in str(rt)
    assert "batch_per_device=4" in str(rt)


def test_cpu_with_competition_data_trains_on_it(tmp_path):
    competition(tmp_path, 224, "input/competitions/tpu-getting-started")
    competition(tmp_path, 512, "input/competitions/tpu-getting-started")
    rt = runtime.detect(root=tmp_path)
    assert not rt.smoke
    # the CPU default size (192) is not mounted: the nearest one that is
    assert (rt.data_dir, rt.config.model.image_size) == (
        tmp_path / "input/competitions/tpu-getting-started/tfrecords-jpeg-224x224", 224)
    assert rt.config.model.name == runtime.defaults("cpu").model.name and rt.config.data.data_dir == str(rt.data_dir)
    assert runtime.detect(root=tmp_path, image_size=500).config.model.image_size == 512


def test_environment_forces_smoke_either_way(tmp_path, monkeypatch):
    competition(tmp_path, 192)
    competition(tmp_path, 512)
    monkeypatch.setenv(runtime.SMOKE_ENV, "1")
    rt = runtime.detect(root=tmp_path)
    assert rt.smoke and runtime.SMOKE_ENV in rt.smoke_reason
    # its smallest images, resized to the smoke size: the same code path in seconds
    assert (rt.data_dir.name, rt.config.model.image_size) == ("tfrecords-jpeg-192x192",
                                                              runtime.PLATFORM_DEFAULTS["smoke"]["image_size"])
    assert runtime.detect(root=tmp_path, image_size=500).config.model.image_size == 512  # a size asked for: the data's
    empty = tmp_path / "elsewhere"
    (empty / "input").mkdir(parents=True)
    monkeypatch.setenv(runtime.SMOKE_ENV, "0")
    rt = runtime.detect(root=empty)
    assert not rt.smoke and rt.data_dir is None
    assert rt.config.model.image_size == runtime.defaults("cpu").model.image_size
    assert runtime.detect(root=empty, smoke=True).smoke  # the argument beats the variable


def test_data_variable_points_at_a_local_copy(tmp_path, monkeypatch):
    local = competition(tmp_path, 331, "downloads/flowers")
    monkeypatch.setenv(runtime.DATA_ENV, str(tmp_path / "downloads"))
    assert runtime.find_competition_data(512, tmp_path / "kaggle") == (local, 331)
    monkeypatch.setenv(runtime.DATA_ENV, str(tmp_path / "kaggle"))
    with pytest.raises(runtime.RuntimeSetupError, match=runtime.DATA_ENV):
        runtime.find_competition_data(512, tmp_path / "kaggle")


MOUNTS = {  # where Kaggle mounts what a notebook attaches, below input/ (runtime's WEIGHTS_DEPTH comment)
    "dataset": "efficientnetv2-jax",
    "dataset, newer mount": "datasets/alice/efficientnetv2-jax",
    "notebook output": "port-pytorch-weights-to-flax",
    "notebook output, newer mount": "notebooks/alice/port-pytorch-weights-to-flax",
    "notebook output, a folder in it": "notebooks/alice/port-pytorch-weights-to-flax/upload/efficientnetv2-jax",
    "Kaggle Model": "efficientnetv2-jax/flax/tf-efficientnetv2-m/1",
    "Kaggle Model, newer mount": "models/alice/efficientnetv2-jax/flax/tf-efficientnetv2-m/3",
}


@pytest.mark.parametrize("mount", MOUNTS)
def test_weights_are_found_in_each_of_kaggles_mount_layouts(tmp_path, mount):
    weights = ported(tmp_path / "input" / MOUNTS[mount], "tf_efficientnetv2_m", "tf_efficientnetv2_m")
    competition(tmp_path, 192)  # the competition's records beside it are no weights
    assert runtime.find_weights("m", root=tmp_path) == [weights]
    rt = runtime.detect(root=tmp_path, model="tf_efficientnetv2_m", smoke=True)
    assert rt.weights == weights and rt.config.model.weights == str(weights)


def test_several_weights_of_the_model_the_shallowest_first_and_the_report_says_so(tmp_path):
    deep = ported(tmp_path / "input" / MOUNTS["Kaggle Model, newer mount"], "m", "tf_efficientnetv2_m")
    shallow = ported(tmp_path / "input" / MOUNTS["notebook output"], "m", "tf_efficientnetv2_m")
    json_path = shallow.with_suffix(".json")
    json_path.write_text(json.dumps({"model": "tf_efficientnetv2_m", "source": "random init (seed 0); for demos"}))
    too_deep = ported(tmp_path / "input" / MOUNTS["Kaggle Model, newer mount"] / "x", "m", "tf_efficientnetv2_m")
    assert runtime.find_weights("m", root=tmp_path) == [shallow, deep]  # 8 folders down is no mount of Kaggle's
    report = str(runtime.detect(root=tmp_path, model="tf_efficientnetv2_m", smoke=True))
    assert f"weights   {shallow} (random init (seed 0); for demos); 1 more of tf_efficientnetv2_m found" in report
    assert too_deep.is_file()


def test_the_settings_cell_changes_the_run_and_looks_for_its_weights_again(tmp_path, capsys):
    competition(tmp_path, 192)
    competition(tmp_path, 512)
    s_weights = ported(tmp_path / "input" / "weights", "s", "tf_efficientnetv2_s")
    rt = runtime.detect(root=tmp_path, smoke=True)
    assert rt.weights is None and rt.config.model.name == runtime.PLATFORM_DEFAULTS["smoke"]["model"]
    assert rt.configure(quiet=True) == rt  # nothing chosen: nothing changes
    chosen = rt.configure(model="tf_efficientnetv2_s", image_size=512, epochs=5, batch_per_device=3)
    shown = capsys.readouterr().out
    assert (chosen.config.model.name, chosen.config.model.image_size, chosen.data_dir.name) == (
        "tf_efficientnetv2_s", 512, "tfrecords-jpeg-512x512")
    assert chosen.weights == s_weights and chosen.config.model.weights == str(s_weights)
    assert (chosen.config.loop.epochs, chosen.config.data.batch_per_device) == (5, 3)
    assert chosen.smoke and chosen.smoke_reason == rt.smoke_reason
    assert shown.startswith("kaggle_utils settings\n") and str(s_weights) in shown and "epochs=5" in shown
    assert rt.configure(epochs=1, quiet=True).config.model == rt.config.model  # epochs alone: the same model


def test_a_submission_goes_where_kaggle_reads_it_on_kaggle_only(tmp_path, monkeypatch):
    run_dir = tmp_path / "elsewhere" / "run"
    run_dir.mkdir(parents=True)
    (run_dir / "submission.csv").write_text("id,label\na,1\n")
    assert runtime.kaggle_submission(run_dir / "submission.csv", root=tmp_path / "kaggle") is None  # not Kaggle
    assert not (tmp_path / "kaggle").exists()
    (tmp_path / "kaggle" / "input").mkdir(parents=True)
    copied = runtime.kaggle_submission(run_dir / "submission.csv", root=tmp_path / "kaggle")
    assert copied == tmp_path / "kaggle" / "working" / "submission.csv"
    assert copied.read_text() == "id,label\na,1\n"
    assert runtime.kaggle_submission(copied, root=tmp_path / "kaggle") == copied  # already there: left as it is
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Batch")  # a Kaggle session, whatever the root holds
    assert runtime.kaggle_submission(run_dir / "submission.csv", root=tmp_path / "other") == \
        tmp_path / "other" / "working" / "submission.csv"


def test_weights_are_matched_to_the_model_by_their_manifest(tmp_path, monkeypatch):
    inputs = tmp_path / "input"
    b0 = ported(inputs / "efficientnetv2-jax", "b0", "tf_efficientnetv2_b0")
    m = ported(inputs / "datasets" / "someone" / "efficientnetv2-jax", "m", "tf_efficientnetv2_m")
    ported(inputs / "my-run", "best", {"name": "tf_efficientnetv2_b0"})  # a training checkpoint: not ported weights
    (inputs / "efficientnetv2-jax" / "orphan.msgpack").write_bytes(b"\x80")  # no manifest
    assert runtime.find_weights(root=tmp_path) == [b0, m]
    assert runtime.find_weights("m", root=tmp_path) == [m]  # short names too
    assert runtime.detect(root=tmp_path).weights is None  # none of the smoke model (test_efficientnet)
    assert runtime.detect(root=tmp_path, model="b0").config.model.weights == str(b0)  # what the run fine-tunes
    assert runtime.detect(root=tmp_path, model="tf_efficientnetv2_m").weights == m
    monkeypatch.setenv(runtime.WEIGHTS_ENV, str(m))
    assert runtime.find_weights(root=tmp_path) == [m]
    with pytest.raises(runtime.RuntimeSetupError, match="no ported weights of tf_efficientnetv2_b0"):
        runtime.find_weights("tf_efficientnetv2_b0", root=tmp_path)
    monkeypatch.setenv(runtime.WEIGHTS_ENV, str(tmp_path / "missing"))
    with pytest.raises(runtime.RuntimeSetupError, match="does not exist"):
        runtime.find_weights(root=tmp_path)


def test_report_names_machine_versions_sizes_and_inputs(tmp_path):
    data = competition(tmp_path, 192)
    weights = ported(tmp_path / "input" / "w", "b0", "tf_efficientnetv2_b0")
    rt = runtime.detect(root=tmp_path)
    report = str(rt)
    for expected in (f"cpu: {jax.device_count()} x", f"jax {jax.__version__}", "smoke     off", str(data), str(weights),
                     str(REPO), f"{run.global_batch(rt.config)} per step", rt.config.model.name,
                     f"precision fp32 ({rt.precision_reason})"):
        assert expected in report, (expected, report)


def test_setup_hides_the_accelerator_from_tensorflow_only_on_accelerators(tmp_path, monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(runtime, "tensorflow_on_host", lambda: calls.append(1))
    (tmp_path / "input").mkdir()  # a Kaggle-like root: outputs go to tmp_path/working
    runtime.setup(root=tmp_path)
    assert calls == [] and "kaggle_utils runtime" in capsys.readouterr().out
    monkeypatch.setattr(runtime, "current_platform", lambda: "gpu")
    rt = runtime.setup(root=tmp_path, quiet=True)
    assert calls == [1] and rt.platform == "gpu" and not rt.smoke
    assert rt.config.model.name == runtime.defaults("gpu").model.name
    assert rt.precision == "fp32"  # the device itself is still a CPU: the precision follows the device
    assert capsys.readouterr().out == ""


def test_batch_rules_are_shared_with_the_job():  # the precision's: test_precision
    # 16 per device, at least 64 images, a multiple of the device count
    assert [DataConfig().global_batch(n) for n in (1, 2, 3, 8, 16)] == [64, 64, 66, 128, 256]
    assert run.global_batch(TrainConfig()) == 128 == jax.device_count() * 16  # 8 devices
    assert run.global_batch(TrainConfig().replace(batch_per_device=2)) == 2 * jax.device_count()
    with pytest.raises(ValueError, match="unknown platform"):
        runtime.defaults("npu")


def test_internet_probe_sees_a_listening_port_and_a_missing_host():
    import socket

    with socket.socket() as server:  # a local listener stands in for the hub
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert runtime.internet_available("127.0.0.1", server.getsockname()[1], timeout=2.0)
    assert not runtime.internet_available("host.invalid", 443, timeout=2.0)  # .invalid never resolves
