"""``--batch-per-device auto``: the search, the budget, and the batch a run records.

The search is checked against memory curves given as functions (no compile): it must find the
largest batch that fits, in few calls. The run-level tests compile the tiny model's train step
on the CPU against a stated ``--memory-budget`` (a CPU reports no memory limit of its own).
"""
import json
import math
import re

import jax
import pytest

from kaggle_utils import run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.run import memory_plan
from kaggle_utils.run.trainer import resumed_config

from job_helpers import TEST_MODEL

CURVES = {  # bytes at batch m
    "affine": lambda m: 5_000_000 + 123_457 * m,
    "concave": lambda m: 5_000_000 + int(2_000_000 * math.sqrt(m)),
    "convex": lambda m: 5_000_000 + 900 * m * m + 10_000 * m,
    "steps": lambda m: 5_000_000 + 1_000_000 * ((m + 15) // 16),  # allocations in blocks of 16 images
}


def counted(curve):
    calls = []

    def bytes_at(m):
        calls.append(m)
        return curve(m)
    return bytes_at, calls


@pytest.mark.parametrize("name", sorted(CURVES))
@pytest.mark.parametrize("largest", [1, 2, 7, 48, 301])
def test_the_search_finds_the_largest_batch_that_fits_in_few_compiles(name, largest):
    curve = CURVES[name]
    usable = curve(largest) + 0.5
    expected = max(m for m in range(1, 2001) if curve(m) <= usable)  # every batch tried: the truth
    bytes_at, calls = counted(curve)
    found, measured = memory_plan.largest_batch(bytes_at, usable, limit=2000)
    assert found == expected >= largest
    assert len(calls) == len(set(calls)) == len(measured)  # each batch compiled once
    assert len(calls) <= 2 * math.ceil(math.log2(expected + 1)) + 4, calls
    if name == "affine":
        assert len(calls) <= 4, calls  # 1, 8, where the line meets the budget, and its neighbour


def test_the_search_stops_at_the_data_s_limit_and_says_when_nothing_fits():
    bytes_at, calls = counted(CURVES["affine"])
    assert memory_plan.largest_batch(bytes_at, 1e12, limit=37)[0] == 37 and max(calls) == 37
    found, measured = memory_plan.largest_batch(CURVES["affine"], CURVES["affine"](1) - 1, limit=100)
    assert found == 0 and list(measured) == [1]


def test_the_budget_is_given_or_the_device_s_own_and_a_cpu_has_none():
    assert memory_plan.device_budget(1.5) == (int(1.5 * 2 ** 30), "--memory-budget 1.5 GiB")
    with pytest.raises(ConfigError, match=r"the cpu device \(.*\) reports none .* give --memory-budget GiB"):
        memory_plan.device_budget(None, jax.devices("cpu")[0])

    class Gpu:
        platform, device_kind = "gpu", "Tesla T4"

        def memory_stats(self):
            return {"bytes_limit": 11_000_000_000, "bytes_in_use": 0}
    assert memory_plan.device_budget(None, Gpu()) == (11_000_000_000, "bytes_limit of Tesla T4")


# --------------------------------------------------------------------------- the run's own train step


def auto_config(sample, **changes):
    return TrainConfig().replace(**{"data_dir": sample.root, "model": TEST_MODEL, "batch_per_device": "auto",
                                    "steps": 2, **changes})


def budget_for(config, data, per_device):
    """The --memory-budget (GiB) at which the train step at ``per_device`` images just fits, margin included."""
    k = config.optim.accumulate_steps
    provisional, plan = run.resolve(config.replace(batch_per_device=k, memory_budget=None), data)
    needed = memory_plan.step_compiler(provisional, plan)("train", per_device).bytes
    return (needed / (1 - memory_plan.MARGIN) + 2) / 2 ** 30, needed


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_auto_picks_the_batch_whose_compiled_step_fits_the_budget(sample):
    """With --accumulate-steps 2 the step holds one micro-batch's activations: the budget of two micro-batches
    of 8 gives 16 per device (a multiple of 2), not a batch sized as if 16 images were alive at once."""
    config = auto_config(sample, accumulate_steps=2)
    data = run.open_data(config, sample.root)
    budget, needed = budget_for(config, data, 16)
    resolved, plan = run.resolve(config.replace(memory_budget=budget), data)
    assert plan.per_device_batch == 16 and resolved.data.batch_size == 16 * jax.device_count()
    assert resolved.data.batch_per_device is None  # recorded as the global batch: --resume keeps it
    line = plan.describe(resolved)
    assert "16 per device in 2 micro-batches of 8" in line
    assert f"batch per device auto: 16, its train step needs {memory_plan.gib_text(needed)}" in line
    assert "--memory-budget" in line and "less a 10% margin" in line and "3 compiles, " in line  # micro 1, 8, 9


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_budget_below_one_image_is_refused_before_anything_is_written(sample, tmp_path, capsys):
    from kaggle_utils import job

    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:  # 0.0001 GiB: 105 KiB, less than the tiny model's weights
        job.main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--batch-per-device", "auto",
                  "--memory-budget", "0.0001", "--steps", "1", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--batch-per-device auto: the smallest batch per device (1 image) needs" in err
    assert "more than the 0.0922 MiB of the budget (--memory-budget 0.0001 GiB less a 10% margin)" in err  # 0.1024 MiB less 10%
    assert not out.exists()


@pytest.mark.parametrize("changes, message", [
    ({"memory_budget": None}, "needs a memory budget: the cpu device"),
    ({"batch_per_device": 4, "memory_budget": 2.0}, "--memory-budget 2 is read only with --batch-per-device auto"),
    ({"memory_budget": -1.0}, "--memory-budget -1.0: must be a finite number > 0"),
    ({"batch_size": 64, "memory_budget": 2.0}, "--batch-size (global) and --batch-per-device exclude each other"),
])
def test_auto_without_a_usable_budget_is_a_clear_error(sample, changes, message):
    config = auto_config(sample, **changes)
    with pytest.raises(ConfigError, match=re.escape(message)):
        run.check_config(config)  # as a run checks it, once, before resolve
        run.resolve(config, run.open_data(config, sample.root))


def test_resume_reads_the_recorded_batch_instead_of_searching(sample, tmp_path, monkeypatch):
    config = auto_config(sample, memory_budget=1.0)
    resolved, plan = run.resolve(config.replace(batch_per_device=None, memory_budget=None, batch_size=48),
                                 run.open_data(config, sample.root))
    run.write_config(tmp_path, resolved, plan, given=config)
    assert json.loads((tmp_path / "config.json").read_text())["given"]["batch_per_device"] == "auto"
    kept, note, _ = resumed_config(config, tmp_path)
    assert kept.data.batch_size == 48 and kept.data.batch_per_device is None and "48" in note and "--resume" in note
    assert resumed_config(config, tmp_path / "nothing") == (config, "", None)
    assert resumed_config(config.replace(batch_per_device=4, memory_budget=None), tmp_path)[1] == ""
