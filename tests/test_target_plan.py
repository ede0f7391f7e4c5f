"""The kit's steps compiled by the TPU compiler for Kaggle's v5e-8 (libtpu's compile-only devices, no TPU); the plan.

libtpu is a test requirement (requirements.txt); these tests fail, not skip, where it is missing. One plan run of
the tiny model at 16 px (module fixture) serves the jit tests: its train, eval and predict steps are compiled once
and read back from the compiler that made them (``step_compiler``'s executables). Figures expected here are
written out or computed from the compiler's own outputs, never by the plan's arithmetic.
"""
import contextlib
import io
import json
import re
from importlib import metadata
from types import SimpleNamespace

import jax
import pytest

from kaggle_utils import job, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.parallel import make_mesh
from kaggle_utils.run import memory_plan, target_plan

from job_helpers import TEST_MODEL

GIB = 2 ** 30
FLAGS = ["--model", TEST_MODEL, "--image-size", "16", "--num-classes", "10"]


def run_job(argv) -> SimpleNamespace:
    """``job.main(argv)`` in this process: exit code, stdout and stderr."""
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            job.main(argv)
        except SystemExit as stop:
            code = stop.code
    return SimpleNamespace(code=code, stdout=stdout.getvalue(), stderr=stderr.getvalue())


@pytest.fixture(scope="module")
def v5e_plan(tmp_path_factory):
    """``plan --target tpu-v5e-8`` of 8 images per chip, 128 train images (so at most 16 per chip): its output, its
    plan.json, and the step compiler it used (spied on, not replaced)."""
    out, made = tmp_path_factory.mktemp("plan"), []

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    real = memory_plan.step_compiler
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory_plan, "step_compiler", spy)
        result = run_job(["plan", "--target", "tpu-v5e-8", *FLAGS, "--batch-per-device", "8", "--train-images", "128",
                          "--out", str(out)])
    assert result.code == 0, result.stderr
    return SimpleNamespace(**vars(result), json=json.loads((out / "plan.json").read_text()), compiler=made[0])


def entry_shapes(executable) -> tuple[list[str], str]:
    """The compiled program's per-device parameter shapes and result, from its entry computation layout."""
    head = executable.as_text().split("\n", 1)[0]
    layout = re.search(r"entry_computation_layout=\{\((.*)\)->(.*?)\}(, |$)", head)
    params = re.findall(r"[a-z]+\d*\[[\d,]*\]", layout[1])
    return params, layout[2]


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_the_steps_compile_for_the_v5e_chips_in_jit_with_per_chip_shapes(v5e_plan):
    plan, executables = v5e_plan.json, v5e_plan.compiler.executables
    assert (plan["devices"], plan["device_kind"], plan["precision"], plan["mode"]) == (8, "TPU v5 lite", "bf16", "jit")
    for step in ("train", "eval", "predict"):
        params, result = entry_shapes(executables[step, 8])
        assert "u8[8,16,16,3]" in params and "u8[64,16,16,3]" not in params, (step, params)  # 8 of the 64 images
        assert any(re.fullmatch(r"f32\[\d+,128\]", p) for p in params), params  # the head padded to 128, whole
    assert "f32[64,10]" in entry_shapes(executables["predict", 8])[1]  # every chip returns the gathered batch
    assert {"s32[8]", "pred[8]"} <= set(entry_shapes(executables["train", 8])[0])  # labels and mask
    train = plan["steps"]["train"]
    assert 0 < train["bytes"] < 100 * 2 ** 20 and train["flops"] > 0 and train["aliased"] > 0  # the donated state


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_the_plan_command_prints_what_plan_json_holds(v5e_plan):
    text, plan = v5e_plan.stdout, v5e_plan.json
    train = plan["steps"]["train"]
    assert (plan["per_device_batch"], plan["global_batch"], plan["steps_per_epoch"], plan["train_images"]) == \
        (8, 64, 2, 128)
    assert re.search(r"batch\s+8 per device x 8 = 64 per step, 2 steps per epoch", text)
    shown = re.search(r"train\s+([\d.]+) MiB per device of ([\d.]+) GiB usable \(fits\): arguments ([\d.]+) MiB, "
                      r"outputs ([\d.]+) MiB, temporaries ([\d.]+) MiB, code ([\d.]+) MiB", text)
    assert shown, text
    for value, field in zip(shown.groups(), ("bytes", None, "arguments", "outputs", "temporaries", "code")):
        expected = train[field] / 2 ** 20 if field else 15.75 * 0.9  # the v5e's HBM as its compiler gives it
        assert float(value) == pytest.approx(expected, rel=5e-3), (field, value)
    gflops = re.search(r"compute\s+([\d.e+-]+) train, ([\d.e+-]+) eval GFLOPs per image", text)
    assert float(gflops[1]) == pytest.approx(train["flops"] / 8 / 1e9, rel=1e-3)
    assert float(gflops[2]) == pytest.approx(plan["steps"]["eval"]["flops"] / 8 / 1e9, rel=1e-3)
    images_per_s = 8 * 197e12 / (train["flops"] / 8)  # 8 chips at 197 bf16 TFLOPS each
    bound = re.search(r"bound\s+([\d,]+) images/s at the bf16 peak .*an upper bound.*: ([\d.e+-]+) s per epoch of 128 "
                      r"images", text)
    assert int(bound[1].replace(",", "")) == pytest.approx(images_per_s, rel=1e-3)
    assert float(bound[2]) == pytest.approx(128 / images_per_s, rel=1e-2)
    assert f"batch per device auto: 16, its train step needs" in text and "the data's size bounds it" in text
    assert plan["largest_per_device_batch"] == 16  # 128 images / 8 chips: the data allow no more
    assert v5e_plan.compiler("train", 16).bytes <= plan["usable_bytes"]
    assert v5e_plan.stderr == ""  # nothing from libtpu's search for TPU hosts either


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_the_steps_compile_for_the_v5e_chips_in_pmap_with_per_chip_shapes():
    config = target_plan.target_config(TrainConfig().replace(model=TEST_MODEL, image_size=16, num_classes=10,
                                                             batch_per_device=8, mode="pmap"), "tpu-v5e-8")
    resolved, plan = run.resolve(config, target_plan.no_data(config, 128))
    compiled = memory_plan.step_compiler(resolved, plan, mesh=make_mesh(target_plan.target_devices("tpu-v5e-8")))
    for step in ("train", "eval", "predict"):
        assert compiled(step, 8).bytes > 0 and not compiled(step, 8).refused
        params, result = entry_shapes(compiled.executables[step, 8])
        assert re.search(r"u8\[(1,)?8,16,16,3\]", " ".join(params)), (step, params)  # pmap: one device's slice
    assert re.search(r"f32\[(1,)?64,10\]", entry_shapes(compiled.executables["predict", 8])[1])


@pytest.mark.parametrize("name", sorted(target_plan.TARGETS))
def test_each_target_s_hbm_is_what_its_compiler_says_and_a_refusal_names_the_bytes(name):
    """A program above a device's HBM is refused by its compiler, which names the HBM available (the target's budget)
    and the bytes the program needs: the plan counts such a step as not fitting, with those bytes."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    devices = target_plan.target_devices(name)
    assert len(devices) == 8
    mesh = make_mesh(devices)
    rows = NamedSharding(mesh, PartitionSpec("data"))
    x = jax.ShapeDtypeStruct((8 * 40_000, 40_000), jnp.float32, sharding=rows)  # 6 GiB per device, its product 48
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED") as refusal:
        jax.jit(lambda x: jnp.tanh(x) @ x.T, out_shardings=rows).lower(x).compile()
    words = re.search(r"\(([\d.]+)G\) exceeds available HBM \(([\d.]+)G\)|Used ([\d.]+)G of ([\d.]+)G hbm",
                      str(refusal.value))  # libtpu 0.0.42's words, or 0.0.23's
    needed, available = (float(g) for g in words.groups() if g)
    assert target_plan.TARGETS[name].hbm == int(available * GIB)
    step = memory_plan.StepMemory.refusal(refusal.value, "train", 8, 1.0)
    assert step.bytes == step.temporaries == int(needed * GIB) > target_plan.TARGETS[name].hbm
    assert step.refused.startswith("RESOURCE_EXHAUSTED") and words[0] in step.refused


@pytest.mark.parametrize("installed, words", [(None, "libtpu is not installed"),
                                              ("0.0.1", "libtpu 0.0.1 does not fit")])
def test_without_the_right_libtpu_the_plan_says_what_to_install(tmp_path, monkeypatch, installed, words):
    pin = next(r.split(";")[0] for r in metadata.requires("jax") if r.startswith("libtpu"))  # e.g. libtpu==0.0.42.*
    real = metadata.version

    def version(name):
        if name != "libtpu":
            return real(name)
        if installed is None:
            raise metadata.PackageNotFoundError(name)
        return installed

    monkeypatch.setattr(metadata, "version", version)
    monkeypatch.delenv("TPU_LIBRARY_PATH", raising=False)
    result = run_job(["plan", "--target", "tpu-v3-8", *FLAGS, "--out", str(tmp_path / "out")])
    assert result.code == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert words in result.stderr and f"pip install '{pin}'" in result.stderr and jax.__version__ in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_the_local_plan_refuses_a_batch_above_the_budget_and_its_search_s_answer_is_the_edge(tmp_path, capsys):
    """On this CPU (8 devices), against a --memory-budget: the run's 32 per device does not fit and the command says
    so with the bytes; the largest batch it found fits and the next larger does not, by their compiled bytes."""
    made, real = [], memory_plan.step_compiler
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory_plan, "step_compiler", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
        result = run_job(["plan", "--target", "local", *FLAGS, "--batch-per-device", "32", "--train-images", "1000",
                          "--memory-budget", "0.003", "--out", str(tmp_path)])
    plan = json.loads((tmp_path / "plan.json").read_text())
    train, usable, largest = plan["steps"]["train"], int(0.003 * GIB * 0.9), plan["largest_per_device_batch"]
    assert result.code == 2 and "DOES NOT FIT" in result.stdout
    assert (f"error: 32 images per device: the train step needs {train['bytes']:,} bytes per device, more than the "
            f"{usable:,} usable of --memory-budget 0.003 GiB") in result.stderr
    assert train["bytes"] > usable and 1 <= largest < 32 and f"; {largest} fit" in result.stderr
    assert made[0]("train", largest).bytes <= usable < made[0]("train", largest + 1).bytes


def test_the_local_plan_on_a_device_without_a_memory_limit_asks_for_a_budget_before_compiling(tmp_path):
    """This CPU reports no bytes_limit: the plan (which always searches the largest batch) names --memory-budget,
    with any --batch-per-device, before a compile and without writing plan.json."""
    for batch in ("auto", "16"):
        result = run_job(["plan", "--target", "local", *FLAGS, "--batch-per-device", batch, "--out", str(tmp_path)])
        assert result.code == 2 and result.stdout == "", result.stderr
        assert ("error: plan --target local needs a memory budget: the cpu device (cpu) reports none (no bytes_limit in"
                " memory_stats()); give --memory-budget GiB\n") in result.stderr
        assert "--batch-per-device N" not in result.stderr and not (tmp_path / "plan.json").exists()


@pytest.mark.slow  # three compiles of the tiny model on 8 CPU devices: ~25 s on 2 busy cores
def test_a_plan_without_the_search_compiles_the_run_s_three_steps_only():
    """What notebook 4 asks of the chips it runs on: the run's batch, no search (a search is a dozen compiles)."""
    calls, real = [], memory_plan.step_compiler

    def counting(*args, **kwargs):
        compile_step = real(*args, **kwargs)
        return lambda name, per_device: calls.append((name, per_device)) or compile_step(name, per_device)

    config = TrainConfig().replace(model=TEST_MODEL, image_size=16, num_classes=10, batch_per_device=4,
                                   memory_budget=0.5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory_plan, "step_compiler", counting)
        plan = target_plan.plan(config, "local", train_images=256, search=False)
    assert sorted(calls) == [("eval", 4), ("predict", 4), ("train", 4)]
    assert plan["largest_per_device_batch"] is None and plan["fits"] and "not searched" in plan["search"]
    assert "not searched" in "\n".join(target_plan.plan_lines(plan))
    with pytest.raises(ConfigError, match="auto is the batch search"):
        target_plan.plan(config.replace(batch_per_device="auto"), "local", train_images=256, search=False)
