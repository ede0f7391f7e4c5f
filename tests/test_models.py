"""The model registry: ``--model`` names any registered Flax module, which then gets the whole kit; a run folder says
where its builder lives (issue 47), and its own saved variables start it (``--weights``, ``run.train(variables=)``)."""
import json
import shutil

import os
import re
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kaggle_utils import checkpoint, job, models, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.run.target_plan import no_data
from kaggle_utils.train import SoftmaxClassification, init_variables

from job_helpers import cpu_process_env, finish


class TinyConvNet(nn.Module):
    """Not an EfficientNet: two convs, BatchNorm, pool, dropout, dense; training when batch_stats are mutable."""

    num_classes: int
    drop_rate: float = 0.0
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, x):
        train = self.is_mutable_collection("batch_stats") and not self.is_initializing()
        x = nn.relu(nn.Conv(16, (3, 3), strides=2, dtype=self.dtype, name="stem")(x))
        x = nn.Conv(32, (3, 3), strides=2, dtype=self.dtype, name="conv")(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, dtype=self.dtype, name="norm")(x))
        x = nn.Dropout(self.drop_rate, deterministic=not train)(x.mean(axis=(1, 2)))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="head")(x).astype(jnp.float32)


@pytest.fixture(scope="module", autouse=True)
def registered():
    models.register_model("tiny_convnet", TinyConvNet, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    yield
    models._MODELS.pop("tiny_convnet")


def tiny_config(sample, **changes):
    return TrainConfig().replace(**{"data_dir": sample.root, "model": "tiny_convnet", "batch_size": 64, "steps": 6,
                                    "eval_every": 3, "tensorboard": False, "lr": 0.05, **changes})


@pytest.fixture(scope="module")
def trained(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("models") / "run"
    return run.train(tiny_config(sample), out, progress=False), out


@pytest.mark.slow  # runs a whole training run of tiny_convnet (tests/tiers.py)
def test_a_registered_module_trains_predicts_and_reloads_through_run_train(trained, sample, tmp_path):
    result, out = trained
    assert len(result.history) == 2 and result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.plan.mean == (0.5, 0.5, 0.5) and result.plan.std == (0.25, 0.25, 0.25)  # its own preprocessing
    assert result.submission.is_file() and len(result.test_ids) == len(sample.test_labels)
    model, variables, config = run.load_run(out)
    assert isinstance(model, TinyConvNet) and model.num_classes == 10 and model.drop_rate == config.model.drop_rate
    assert set(variables["params"]) == {"stem", "conv", "norm", "head"}
    # predict, from the run folder, as the job does it
    job.main(["predict", "--checkpoint", str(out), "--data-dir", sample.root, "--out",
              str(tmp_path / "predicted"), "--no-progress"])
    predicted, trained_probs = (np.loadtxt(folder / "probabilities.csv", delimiter=",", skiprows=1,
                                           usecols=range(1, 11)) for folder in (tmp_path / "predicted", out))
    np.testing.assert_allclose(predicted, trained_probs, atol=1e-6)


@pytest.mark.slow  # runs a whole training run of tiny_convnet (tests/tiers.py)
def test_a_run_folder_records_where_its_model_s_builder_lives_and_a_process_without_it_imports_it(trained):
    _, out = trained
    for record in (out / "config.json", out / "best.json"):
        assert json.loads(record.read_text())["builder"] == f"{__name__}:TinyConvNet"
    entry = models._MODELS.pop("tiny_convnet")  # a new process: its registry never heard of the model
    try:
        model, _, _ = run.load_run(out)
        assert isinstance(model, TinyConvNet) and models.registered("tiny_convnet").mean == entry.mean
    finally:
        models._MODELS["tiny_convnet"] = entry


@pytest.mark.parametrize("builder, words", [
    ("no_such_module:Net", "records its builder as no_such_module:Net, which does not import here "
                           "(ModuleNotFoundError: No module named 'no_such_module'): put the folder holding "
                           "no_such_module.py on the path"),
    ("__main__:Net", "records its builder as __main__:Net, which only the process that trained it had: define it in "
                     "a module of its own"),
])
@pytest.mark.slow  # runs a whole training run of tiny_convnet (tests/tiers.py)
def test_a_builder_that_cannot_be_imported_is_named_with_what_to_do(trained, tmp_path, builder, words):
    _, out = trained
    folder = tmp_path / "run"
    shutil.copytree(out, folder)
    record = json.loads((folder / "best.json").read_text())
    (folder / "best.json").write_text(json.dumps({**record, "builder": builder}))
    entry = models._MODELS.pop("tiny_convnet")
    try:
        with pytest.raises(ConfigError, match=re.escape(f"--model tiny_convnet: {folder / 'best.json'} {words}")):
            run.load_run(folder)
    finally:
        models._MODELS["tiny_convnet"] = entry


@pytest.mark.slow  # a process that runs JAX
def test_a_registered_user_model_is_predicted_from_a_new_process(trained, sample, tmp_path):
    _, out = trained
    env = cpu_process_env(1)
    env["PYTHONPATH"] += os.pathsep + str(Path(__file__).parent)  # where the builder's module is
    proc = subprocess.Popen([sys.executable, "-m", "kaggle_utils", "predict", "--checkpoint", str(out), "--data-dir",
                             sample.root, "--out", str(tmp_path / "pred")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    finish(proc)
    predicted, trained_probs = (np.loadtxt(folder / "probabilities.csv", delimiter=",", skiprows=1,
                                           usecols=range(1, 11)) for folder in (tmp_path / "pred", out))
    np.testing.assert_allclose(predicted, trained_probs, atol=1e-6)


def test_a_module_of_yours_starts_from_its_own_saved_variables(sample, tmp_path):
    config, _ = run.resolve(tiny_config(sample).replace(weights=str(tmp_path / "w.msgpack")),
                            run.open_data(tiny_config(sample), sample.root))
    model = run.build_model(config)
    saved = init_variables(TinyConvNet(num_classes=1000), 16, seed=7)  # pretrained on another label set
    checkpoint.save(tmp_path / "w.msgpack", saved, manifest={"model": "tiny_convnet"})
    run.check_config(config)
    started = run.initial_variables(config, model)
    for layer in ("stem", "conv", "norm"):
        np.testing.assert_array_equal(started["params"][layer]["kernel" if layer != "norm" else "scale"],
                                      saved["params"][layer]["kernel" if layer != "norm" else "scale"])
    assert started["params"]["head"]["kernel"].shape == (32, 10)  # the new head: at its init (no 'classifier')
    given = run.initial_variables(config.replace(weights=None), model, pretrained=saved)
    np.testing.assert_array_equal(given["params"]["conv"]["kernel"], saved["params"]["conv"]["kernel"])
    checkpoint.save(tmp_path / "other.msgpack", saved, manifest={"model": "tf_efficientnetv2_b0"})
    with pytest.raises(ConfigError, match="its manifest other.json says they are tf_efficientnetv2_b0's variables, "
                                          "not --model tiny_convnet's"):
        run.check_config(config.replace(weights=str(tmp_path / "other.msgpack")))


@pytest.mark.slow  # runs a whole training run of tiny_convnet (tests/tiers.py)
def test_cross_validation_trains_a_registered_module_per_fold_with_a_task_tx_and_variables_given(sample, tmp_path):
    saved = init_variables(TinyConvNet(num_classes=10), 16, seed=7)
    task = SoftmaxClassification(label_smoothing=0.0).with_metric("error", lambda sums: 1 - sums["correct"] / sums[
        "count"], mode="min")
    result = run.cross_validate(tiny_config(sample, steps=3, eval_every=3, monitor="val_error"), tmp_path / "cv",
                                folds=2, progress=False, task=task, tx=optax.sgd(0.01), variables=saved)
    scores = json.loads((tmp_path / "cv" / "cv.json").read_text())
    assert len(scores["folds"]) == 2 and 0 <= scores["oof"]["acc"] <= 1 and result.remaining == ()
    assert all(isinstance(run.load_run(tmp_path / "cv" / f"fold{k}")[0], TinyConvNet) for k in range(2))
    assert (tmp_path / "cv" / "submission.csv").is_file()
    for k in range(2):  # every fold records what it was given, and trains with the task's label smoothing
        record = json.loads((tmp_path / "cv" / f"fold{k}" / "config.json").read_text())
        assert record["config"]["task"]["label_smoothing"] == 0.0 and record["given"]["label_smoothing"] == 0.0
        assert "SoftmaxClassification with metrics error" in record["task"] and "optax transform" in record["tx"]
        assert record["variables"]["sha256"] == checkpoint.digest(saved)
        assert "val_error" in result.trained[k].best


def test_a_given_task_that_contradicts_a_flag_the_config_changed_is_refused(sample, tmp_path):
    task = SoftmaxClassification(label_smoothing=0.0)
    with pytest.raises(ConfigError, match=r"--label-smoothing 0.2 and the task given to run.train "
                                          r"\(SoftmaxClassification, label_smoothing 0.0\) disagree"):
        run.train(tiny_config(sample, label_smoothing=0.2), tmp_path / "refused", task=task)
    assert not (tmp_path / "refused").exists()
    config, used = run.run_task(tiny_config(sample), task)  # the default 0.1: the task's value is recorded
    assert used is task and config.task.label_smoothing == 0.0


@pytest.mark.parametrize("changes, message", [
    ({"layer_decay": 0.8}, "--layer-decay / --head-lr-mult read a model's lr_parts\\(\\); --model tiny_convnet"),
    ({"model": "no_such_net"}, "--model: unknown model 'no_such_net': choose one of .*tiny_convnet"),
])
def test_what_needs_lr_parts_or_an_unknown_name_is_refused(sample, tmp_path, changes, message):
    with pytest.raises(ConfigError, match=message):
        run.train(tiny_config(sample, **changes), tmp_path / "refused")
    assert not (tmp_path / "refused").exists()


def test_a_builder_gets_only_the_options_it_takes_and_remat_it_cannot_do_is_refused(sample, tmp_path):
    config = tiny_config(sample).replace(num_classes=10, image_size=16, drop_rate=0.3, precision="fp32")
    model = run.build_model(config)
    assert (model.num_classes, model.drop_rate) == (10, 0.3)
    with pytest.raises(ConfigError, match="--remat blocks: the builder of model 'tiny_convnet' takes no remat"):
        run.build_model(config.replace(remat="blocks"))
    assert models.registered("m").builder(num_classes=3).spec.name == "tf_efficientnetv2_m"  # short V2 names


def test_a_plan_without_data_asks_a_registered_module_for_its_size(tmp_path):
    with pytest.raises(ConfigError, match="--model tiny_convnet: a plan without data needs --image-size"):
        no_data(TrainConfig().replace(model="tiny_convnet"), None)
    assert no_data(TrainConfig().replace(model="tiny_convnet", image_size=24), 100).stored_size == 24
    assert no_data(TrainConfig().replace(model="tf_efficientnetv2_b0"), None).stored_size == 192  # timm's own size
