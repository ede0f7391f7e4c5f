"""Learning rates per part of a model: every leaf of an EfficientNet in one group in depth order (its parts as
the model describes them), timm's layer numbering, and the optimizer's update of each leaf equal to lr x its
group's multiplier.

Adam's first update is ``lr * g / (|g| + eps)`` elementwise (the bias-corrected moments are ``g``
and ``g**2``), so with a constant rate, no clipping and no decay the expected update of every
element is known in closed form, and the tests hold it to float32 rounding.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kaggle_utils.config import ConfigError, OptimConfig, TrainConfig
from kaggle_utils.efficientnet import create_model
from kaggle_utils.train import assign_lr_groups, describe_lr_groups, group_multipliers, make_optimizer
from kaggle_utils.variable_trees import VariableTreeError, abstract_variables, flatten, init_variables

LR, EPS = 1e-3, 1e-8
DECAY, HEAD = 0.5, 10.0


def sample(size=16):
    return jax.ShapeDtypeStruct((2, size, size, 3), jnp.float32)


def modules_by_depth(model) -> list[tuple[str, str]]:
    """(top-level module, its group) in the order the forward pass runs them."""
    blocks = [(f"blocks_{i}_{j}", f"stage{i}") for i, stage in enumerate(model.stages) for j in range(len(stage))]
    return [("conv_stem", "stem"), ("bn1", "stem"), *blocks, ("conv_head", "head"), ("bn2", "head"),
            ("classifier", "classifier")]


@pytest.mark.parametrize("name", ["test_efficientnet", pytest.param("tf_efficientnetv2_b0", marks=pytest.mark.slow)])
def test_every_leaf_is_in_one_group_in_order_of_depth(name):
    model = create_model(name, num_classes=10)
    params = abstract_variables(model, sample())["params"]
    groups = assign_lr_groups(params, model.lr_parts(), layer_decay=DECAY, head_lr_mult=HEAD)

    labels = flatten(groups.labels)
    assert labels.keys() == flatten(params).keys()  # one label per leaf, no leaf left out
    order = list(groups.multipliers)
    expected = modules_by_depth(model)
    assert order == list(dict.fromkeys(group for _, group in expected))  # stem, stage0.., head, classifier
    for module, group in expected:
        assert {g for path, g in labels.items() if path.split("/")[0] == module} == {group}, module

    stages = len(model.stages)
    assert groups.multipliers == pytest.approx({
        "stem": DECAY ** (stages + 1), **{f"stage{i}": DECAY ** (stages - i) for i in range(stages)},
        "head": DECAY, "classifier": HEAD})


def test_layer_numbering_is_timms_per_stage_grouping():
    """Our multipliers equal timm's layer scales for its coarse (per-stage) group_matcher."""
    timm = pytest.importorskip("timm")
    from timm.models import group_parameters

    torch_model = timm.create_model("test_efficientnet", num_classes=10)
    layer_of = group_parameters(torch_model, torch_model.group_matcher(coarse=True), reverse=True)
    last = max(layer_of.values())
    model = create_model("test_efficientnet", num_classes=10)
    ours = assign_lr_groups(abstract_variables(model, sample())["params"], model.lr_parts(), layer_decay=DECAY)
    by_module = {path.split("/")[0]: ours.multipliers[g] for path, g in flatten(ours.labels).items()}
    for name, layer in layer_of.items():
        parts = name.split(".")
        module = "blocks_{}_{}".format(*parts[1:3]) if parts[0] == "blocks" else parts[0]
        assert by_module[module] == pytest.approx(DECAY ** (last - layer)), name


def test_an_unknown_parameter_name_is_refused_by_path():
    parts = create_model("test_efficientnet").lr_parts()
    params = {"conv_stem": {"kernel": jnp.zeros((3, 3, 3, 8))}, "fc": {"kernel": jnp.zeros((8, 2))}}
    with pytest.raises(VariableTreeError, match=r"fc/kernel.*the model's parts: stem \(conv_stem\|bn1\)"):
        assign_lr_groups(params, parts, layer_decay=DECAY)
    with pytest.raises(VariableTreeError, match=r"params/conv_stem/kernel.*variables\['params'\]"):
        assign_lr_groups({"params": {"conv_stem": params["conv_stem"]}}, parts)


@pytest.fixture(scope="module")
def trained():
    """A tiny model's params and the gradients of one batch."""
    model = create_model("test_efficientnet", num_classes=10)
    variables = init_variables(model, sample(), seed=0)
    images = jax.random.normal(jax.random.key(1), (4, 16, 16, 3))
    labels = jax.nn.one_hot(jnp.arange(4) % 10, 10)

    @jax.jit
    def grads_of(params):
        def loss(p):
            logits, _ = model.apply({**variables, "params": p}, images, mutable=["batch_stats"])
            return optax.softmax_cross_entropy(logits, labels).mean()
        return jax.grad(loss)(params)

    params = variables["params"]
    return params, grads_of(params), assign_lr_groups(params, model.lr_parts(), layer_decay=DECAY, head_lr_mult=HEAD)


def first_update(tx, grads, params):
    return jax.jit(tx.update)(grads, tx.init(params), params)[0]


def test_each_group_moves_at_its_own_rate(trained):
    params, grads, groups = trained
    tx = make_optimizer(LR, OptimConfig(weight_decay=0.0, clip_norm=None), lr_multipliers=groups)
    updates = first_update(tx, grads, params)
    multiplier = groups.per_leaf()
    for path, u in flatten(updates).items():
        g, m = np.asarray(flatten(grads)[path]), flatten(multiplier)[path]
        np.testing.assert_allclose(np.asarray(u), -LR * m * g / (np.abs(g) + EPS), rtol=1e-5, atol=1e-12,
                                   err_msg=path)

    # the statement, as one number: a stage's kernel moves at its share of the classifier's rate
    def typical(path):
        u, g = np.abs(np.asarray(flatten(updates)[path])), np.abs(np.asarray(flatten(grads)[path]))
        return np.median(u[g > 1e-4])

    ratio = typical("blocks_1_0/conv_exp/kernel") / typical("classifier/kernel")
    assert ratio == pytest.approx(groups.multipliers["stage1"] / HEAD, rel=1e-3)
    assert ratio < 0.05  # 0.5**4 / 10: the test can tell a scaled update from an unscaled one


def test_weight_decay_is_scaled_with_the_rate(trained):
    """With zero gradients the update is the decay alone: lr x multiplier x wd x p, on kernels only."""
    params, _, groups = trained
    wd = 0.1
    tx = make_optimizer(LR, OptimConfig(weight_decay=wd, clip_norm=None), lr_multipliers=groups)
    updates = first_update(tx, jax.tree.map(jnp.zeros_like, params), params)
    expected = jax.tree.map(lambda p, m: -LR * m * wd * p * (p.ndim > 1), params, groups.per_leaf())
    for path, u in flatten(updates).items():
        np.testing.assert_allclose(np.asarray(u), np.asarray(flatten(expected)[path]), rtol=1e-6, atol=1e-12,
                                   err_msg=path)


def test_frozen_leaves_stay_still_with_lr_groups(trained):
    params, grads, groups = trained
    tx = make_optimizer(LR, OptimConfig(weight_decay=0.05, clip_norm=1.0), frozen=["^conv_stem", "^bn1", "^blocks_0_"],
                        lr_multipliers=groups)
    updates = flatten(first_update(tx, grads, params))
    frozen = [p for p in updates if p.split("/")[0] in ("conv_stem", "bn1", "blocks_0_0")]
    assert frozen and all(not np.any(np.asarray(updates[p])) for p in frozen)
    assert all(np.any(np.asarray(u)) for p, u in updates.items() if p not in frozen)


def test_multipliers_that_do_not_fit_the_params_are_refused(trained):
    params, _, _ = trained
    tx = make_optimizer(LR, lr_multipliers={"classifier": {"kernel": 1.0}})
    with pytest.raises(VariableTreeError, match="only in the params: blocks_0_0"):
        tx.init(params)


@pytest.mark.parametrize("layer_decay, head_lr_mult, flag", [
    (0.0, 1.0, "--layer-decay"), (1.5, 1.0, "--layer-decay"), (math.nan, 1.0, "--layer-decay"),
    (None, 0.0, "--head-lr-mult"), (None, -2.0, "--head-lr-mult"), (0.8, math.inf, "--head-lr-mult")])
def test_values_no_run_can_use_are_refused_by_flag(layer_decay, head_lr_mult, flag):
    with pytest.raises(ConfigError, match=flag):
        TrainConfig().replace(layer_decay=layer_decay, head_lr_mult=head_lr_mult).check()


def test_good_values_and_the_config_fields():
    for layer_decay, head_lr_mult in [(None, 1.0), (0.7, 10.0), (1.0, 0.5)]:
        TrainConfig().replace(layer_decay=layer_decay, head_lr_mult=head_lr_mult).check()
    optim = TrainConfig().replace(layer_decay=0.7, head_lr_mult=10.0).optim
    assert (optim.layer_decay, optim.head_lr_mult) == (0.7, 10.0)
    assert (TrainConfig().optim.layer_decay, TrainConfig().optim.head_lr_mult) == (None, 1.0)


def parts(stages: int) -> list:
    """The parts of an EfficientNet of ``stages`` stages, as ``EfficientNet.lr_parts`` gives them."""
    return [("stem", "a", 0), *((f"stage{i}", f"s{i}", i + 1) for i in range(stages)), ("head", "h", stages),
            ("classifier", "c", stages + 1)]


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_the_plan_line_gives_each_groups_rate():
    model = create_model("tf_efficientnetv2_b0")  # 6 stages: the helper groups and numbers as the model does
    assert [(g, d) for g, _, d in model.lr_parts()] == [(g, d) for g, _, d in parts(6)]
    line = describe_lr_groups(1e-3, group_multipliers(parts(2), layer_decay=0.5, head_lr_mult=2.0))
    assert line == "lr by group: stem 1.25e-4, stage0 2.5e-4, stage1..head 5e-4, classifier 2e-3"
    assert describe_lr_groups(2e-3, group_multipliers(parts(6), head_lr_mult=10.0)) == \
        "lr by group: stem..head 2e-3, classifier 2e-2"
