"""``--init-from RUN_OR_CHECKPOINT``: a new run from a finished run's weights, classifier included."""
import json
import re

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint, job, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.efficientnet import create_model
from kaggle_utils.train import init_variables

from job_helpers import TEST_MODEL


def tiny_config(sample, **changes):
    return TrainConfig().replace(**{"data_dir": sample.root, "model": TEST_MODEL, "batch_size": 64, "steps": 4,
                                    "eval_every": 2, "tensorboard": False, **changes})


@pytest.fixture(scope="module")
def parent(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("parent") / "run"
    # a padded head, as on a TPU (128), and named classes
    run.train(tiny_config(sample, head_multiple=8, class_names=tuple("0123456789")), out, progress=False)
    return out


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_new_run_starts_from_the_parent_s_best_checkpoint_head_included(parent, sample, tmp_path):
    _, best, _ = run.load_run(parent)
    config, _ = run.resolve(tiny_config(sample, init_from=str(parent)), run.open_data(tiny_config(sample),
                                                                                      sample.root))
    start = run.initial_variables(config, run.build_model(config))
    classes = config.model.num_classes
    assert start["params"]["classifier"]["kernel"].shape[-1] == classes  # this run's head width: 1 x classes
    np.testing.assert_array_equal(start["params"]["classifier"]["kernel"],
                                  best["params"]["classifier"]["kernel"][:, :classes])
    for a, b in zip(jax.tree.leaves({k: v for k, v in start["params"].items() if k != "classifier"}),
                    jax.tree.leaves({k: v for k, v in best["params"].items() if k != "classifier"})):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(jax.tree.leaves(start["batch_stats"])[0], jax.tree.leaves(best["batch_stats"])[0])

    # a named checkpoint (last.msgpack holds the whole state) and a run trained from it, end to end by the job
    out = tmp_path / "child"
    job.main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--batch-size", "64", "--steps", "2",
              "--eval-every", "2", "--init-from", str(parent / "last.msgpack"), "--out", str(out), "--no-progress"])
    record = json.loads((out / "config.json").read_text())
    assert record["config"]["model"]["init_from"] == str((parent / "last.msgpack").resolve())
    assert (out / "best.msgpack").is_file()


def snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def other(sample, tmp_path_factory):
    """A run already in --out: a refusal must leave it whole."""
    out = tmp_path_factory.mktemp("other") / "run"
    run.train(tiny_config(sample, steps=1, eval_every=None), out, progress=False)
    return out


@pytest.mark.parametrize("flags, message", [
    (["--num-classes", "12"], "its run trained classes 10, this run has 12"),
    (["--model", "tf_efficientnet_lite0"], "its run trained --model test_efficientnet, this run has "
                                           "tf_efficientnet_lite0"),
    ([f"--class-names={name}" for name in "abcdefghij"], "its run trained class names"),
    (["--weights", "w.msgpack"], "--weights .* and --init-from .* exclude each other"),
])
@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_another_model_or_other_classes_are_refused_naming_both_before_anything_is_written(
        parent, other, sample, capsys, flags, message):
    before = snapshot(other)
    with pytest.raises(SystemExit) as exit_info:
        job.main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--batch-size", "64", "--steps", "2",
                  "--init-from", str(parent), *flags, "--out", str(other), "--overwrite", "--no-progress"])
    assert exit_info.value.code == 2
    assert len(re.findall(message, capsys.readouterr().err)) == 1
    assert snapshot(other) == before


def test_what_is_not_a_finished_run_is_refused(sample, tmp_path):
    with pytest.raises(ConfigError, match="--init-from: .*no_such_run does not exist"):
        run.train(tiny_config(sample, init_from=str(tmp_path / "no_such_run")), tmp_path / "a")
    ported = tmp_path / "ported.msgpack"
    checkpoint.save(ported, init_variables(create_model(TEST_MODEL), 32), manifest={"model": TEST_MODEL})
    with pytest.raises(ConfigError, match="holds ported test_efficientnet weights"):
        run.train(tiny_config(sample, init_from=str(ported)), tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
