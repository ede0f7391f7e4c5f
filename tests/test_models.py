"""The model registry: ``--model`` names any registered Flax module, which then gets the whole kit."""
import json

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
import pytest

from kaggle_utils import job, models, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.run.target_plan import no_data


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


def test_a_registered_module_trains_predicts_and_reloads_through_run_train(sample, tmp_path):
    result = run.train(tiny_config(sample), tmp_path / "run", progress=False)
    assert len(result.history) == 2 and result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert result.plan.mean == (0.5, 0.5, 0.5) and result.plan.std == (0.25, 0.25, 0.25)  # its own preprocessing
    assert result.submission.is_file() and len(result.test_ids) == len(sample.test_labels)
    model, variables, config = run.load_run(tmp_path / "run")
    assert isinstance(model, TinyConvNet) and model.num_classes == 10 and model.drop_rate == config.model.drop_rate
    assert set(variables["params"]) == {"stem", "conv", "norm", "head"}
    # predict, from the run folder, as the job does it
    job.main(["predict", "--checkpoint", str(tmp_path / "run"), "--data-dir", sample.root, "--out",
              str(tmp_path / "predicted"), "--no-progress"])
    predicted, trained = (np.loadtxt(tmp_path / folder / "probabilities.csv", delimiter=",", skiprows=1,
                                     usecols=range(1, 11)) for folder in ("predicted", "run"))
    np.testing.assert_allclose(predicted, trained, atol=1e-6)


def test_cross_validation_trains_a_registered_module_per_fold(sample, tmp_path):
    result = run.cross_validate(tiny_config(sample, steps=3, eval_every=3), tmp_path / "cv", folds=2, progress=False)
    scores = json.loads((tmp_path / "cv" / "cv.json").read_text())
    assert len(scores["folds"]) == 2 and 0 <= scores["oof"]["acc"] <= 1 and result.remaining == ()
    assert all(isinstance(run.load_run(tmp_path / "cv" / f"fold{k}")[0], TinyConvNet) for k in range(2))
    assert (tmp_path / "cv" / "submission.csv").is_file()


@pytest.mark.parametrize("changes, message", [
    ({"weights": "w.msgpack"}, "--weights reads an EfficientNet's parameter names; --model tiny_convnet is not one"),
    ({"layer_decay": 0.8}, "--layer-decay / --head-lr-mult read a model's lr_parts\\(\\); --model tiny_convnet"),
    ({"model": "no_such_net"}, "--model: unknown model 'no_such_net': choose one of .*tiny_convnet"),
])
def test_what_needs_an_efficientnet_or_an_unknown_name_is_refused(sample, tmp_path, changes, message):
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
