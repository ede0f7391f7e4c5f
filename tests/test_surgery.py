"""Model surgery on a small plain Flax model and on (shrunken) EfficientNets.

Expected counts and values are derived by hand from the architecture or by construction
(e.g. a grey image against its RGB copy), never read back from the code under test.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from kaggle_utils import checkpoint, surgery
from kaggle_utils.config import OptimConfig
from kaggle_utils.parallel import make_mesh
from kaggle_utils.efficientnet import create_model
from kaggle_utils.efficientnet.layers import BatchNorm as KitBatchNorm, LayerCfg
from kaggle_utils.train import SoftmaxClassification, StepConfig, create_train_state, make_optimizer, make_steps
from job_helpers import TEST_MODEL
from train_helpers import TinyCNN, batches, digits

ACTS = {"relu": nn.relu, "gelu": nn.gelu}


class PlainNet(nn.Module):
    """conv -> BN -> act -> conv (stride 2) -> BN -> act -> [pool -> classifier]; num_classes=0: the feature map."""

    num_classes: int = 10
    width: int = 8
    acts: tuple = ("relu", "relu")

    @property
    def num_features(self):
        return self.width

    @nn.compact
    def __call__(self, x, train=None):
        if train is None:
            train = self.is_mutable_collection("batch_stats") and not self.is_initializing()
        for i, (stride, act) in enumerate(zip((1, 2), self.acts)):
            x = nn.Conv(self.width, (3, 3), strides=stride, use_bias=False, name=f"conv{i}")(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9, name=f"bn{i}")(x)
            x = ACTS[act](x)
        if not self.num_classes:
            return x
        return nn.Dense(self.num_classes, name="classifier")(x.mean(axis=(1, 2)))


X8 = jnp.zeros((1, 8, 8, 3))


def one_device_steps(model, tx, num_classes=10, **config):
    return make_steps(model, tx, StepConfig(num_classes=num_classes, **config), mode="jit",
                      mesh=make_mesh(jax.devices()[:1]))


def digit_batches(n_batches, batch_size=32):
    images, labels = digits("train")
    return list(batches(images[:n_batches * batch_size], labels[:n_batches * batch_size], batch_size))


def train(steps, state, host_batches):
    losses = []
    for b in host_batches:
        state, metrics = steps.train(state, steps.put_batch(b))
        losses.append(float(steps.get(metrics)["task"]["loss_sum"]))
    return steps.get(state), losses


def forward(model, variables, x, **kw):
    """An evaluation (or, with mutable=, training) forward, jitted: eager Flax compiles op by op."""
    return jax.jit(lambda v, x: model.apply(v, x, **kw))(variables, x)


def trees_equal(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def random_stats(variables, seed=1):
    """Running statistics away from their init (mean 0, var 1), so using them is visible."""
    rng = np.random.default_rng(seed)
    stats = jax.tree.map(lambda s: s + np.abs(rng.normal(0.0, 0.5, s.shape)).astype(s.dtype), variables["batch_stats"])
    return {**variables, "batch_stats": stats}


@pytest.fixture(scope="module")
def tiny():
    """TinyCNN (8x8 digits): Conv_0 -> BatchNorm_0 -> Conv_1 (stride 2) -> Dense_0."""
    return TinyCNN(), surgery.init_variables(TinyCNN(), X8, seed=3)


# --------------------------------------------------------------------------- paths and inspection


def test_flatten_unflatten_and_shapes(tiny):
    _, variables = tiny
    flat = surgery.flatten(variables)
    assert flat["params/Conv_0/kernel"] is variables["params"]["Conv_0"]["kernel"]
    assert trees_equal(surgery.unflatten(flat), variables)
    assert jax.tree.structure(surgery.unflatten(flat)) == jax.tree.structure(variables)
    assert surgery.shapes(variables)["params/Dense_0/kernel"] == (4 * 4 * 16, 10)  # 8x8 -> stride 2 -> 4x4x16
    with pytest.raises(surgery.SurgeryError, match="both a leaf and a prefix"):
        surgery.unflatten({"a/b": 1, "a/b/c": 2})


def test_param_table_counts_trainable_frozen_and_bytes(tiny):
    _, variables = tiny
    # by hand: 3x3 convs, Conv_0 without bias (before BN), Dense on the 4x4x16 map
    want = {"Conv_0": 3 * 3 * 3 * 16, "BatchNorm_0": 2 * 16, "Conv_1": 3 * 3 * 16 * 16 + 16, "Dense_0": 256 * 10 + 10}
    table = surgery.param_table(variables, frozen=r"^Conv_")
    assert {m: t + f for m, t, f in table.rows} == want
    assert table.frozen == want["Conv_0"] + want["Conv_1"]
    assert table.trainable == want["BatchNorm_0"] + want["Dense_0"]
    assert table.bytes_by_dtype == {"float32": 4 * (sum(want.values()) + 2 * 16)}  # + BN mean/var
    assert "Dense_0" in str(table) and "total" in str(table)


def test_count_flops_of_a_dense_layer_is_exact():
    model, x = nn.Dense(5), jnp.ones((4, 7))
    variables = model.init(jax.random.key(0), x)
    assert surgery.count_flops(model, variables, x) == 2 * 4 * 7 * 5 + 4 * 5  # multiply-adds + bias adds


def test_cast_round_trips_through_a_bf16_checkpoint(tiny, tmp_path):
    _, variables = tiny
    tree = {**variables, "step": np.int32(7)}
    small, report = surgery.cast(tree, jnp.bfloat16)
    assert (report.cast_leaves, report.kept_leaves) == (len(jax.tree.leaves(variables)), 1)
    assert report.bytes_after == (report.bytes_before - 4) // 2 + 4
    checkpoint.save(tmp_path / "half.msgpack", small)
    back, _ = surgery.cast(checkpoint.load(tmp_path / "half.msgpack"), jnp.float32)
    assert back["step"].dtype == np.int32 and int(back["step"]) == 7
    for path, leaf in surgery.flatten(variables).items():
        restored = surgery.flatten(back)[path]
        assert restored.dtype == np.float32
        np.testing.assert_array_equal(restored, np.asarray(jnp.asarray(leaf, jnp.bfloat16), np.float32))


# --------------------------------------------------------------------------- inheritance and rewiring


def test_inherit_report_on_a_changed_classifier(tiny):
    model, parent = tiny
    child = surgery.init_variables(TinyCNN(num_classes=7), X8, seed=4)
    parent_bf16, _ = surgery.cast(parent, jnp.bfloat16)
    tree, report = surgery.inherit(parent_bf16, child)
    # TinyCNN: 7 params (Conv_0 kernel, BN scale/bias, Conv_1 kernel/bias, Dense kernel/bias) + 2 BN stats
    assert len(report.inherited) == 7 and report.new == () and report.unused == ()
    assert sorted(report.mismatched) == [("params/Dense_0/bias", (10,), (7,)),
                                         ("params/Dense_0/kernel", (256, 10), (256, 7))]
    flat, fresh, old = surgery.flatten(tree), surgery.flatten(child), surgery.flatten(parent_bf16)
    for path in report.inherited:
        assert flat[path].dtype == fresh[path].dtype == jnp.float32  # the child's dtype
        np.testing.assert_array_equal(flat[path], np.asarray(old[path], np.float32))
    np.testing.assert_array_equal(flat["params/Dense_0/kernel"], fresh["params/Dense_0/kernel"])
    assert "mismatched 2" in str(report)


def test_inherit_with_nothing_in_common_is_an_error_that_shows_the_nesting():
    backbone = surgery.init_variables(PlainNet(num_classes=0), X8)
    head = surgery.init_variables(surgery.ClassifierHead(PlainNet(num_classes=0), 10), X8)
    with pytest.raises(surgery.SurgeryError, match=r"nothing to inherit.*looks like child '\w+/backbone/bn0/"):
        surgery.inherit(backbone, head)
    with pytest.raises(surgery.SurgeryError, match="differ in shape"):
        surgery.inherit({"w": jnp.ones(3)}, {"w": jnp.ones(4)})


def test_rewire_activation_keeps_the_unchanged_layers_activations():
    """The seed's NAS rewire: one activation swapped (ReLU -> GELU after the second conv)."""
    parent = PlainNet()
    variables = random_stats(surgery.init_variables(parent, X8, seed=5))
    child, child_vars, report = surgery.rewire(parent, variables, X8, acts=("relu", "gelu"))
    assert child.acts == ("relu", "gelu")
    assert (len(report.inherited), report.new, report.mismatched) == (12, (), ())  # 8 params + 4 BN stats
    x = jax.random.uniform(jax.random.key(0), (2, 8, 8, 3))
    before = surgery.extract_features(parent, variables, x, ["conv", "bn"])
    after = surgery.extract_features(child, child_vars, x, ["conv", "bn"])
    assert sorted(before) == ["bn0", "bn1", "conv0", "conv1"]
    for name in before:  # everything up to the changed activation
        np.testing.assert_array_equal(before[name], after[name])
    assert not np.allclose(forward(parent, variables, x), forward(child, child_vars, x))


def test_variant_and_rewire_reject_unknown_or_double_requests():
    with pytest.raises(surgery.SurgeryError, match="'depth' is not a field of PlainNet"):
        surgery.variant(PlainNet(), depth=3)
    model = create_model("tf_efficientnetv2_b0", num_classes=3)
    changed = surgery.variant(model, act="gelu", channel_multiplier=0.5, num_classes=4)  # module + spec fields
    assert (changed.act, changed.spec.channel_multiplier, changed.num_classes) == ("gelu", 0.5, 4)
    assert changed.spec.name == model.spec.name
    with pytest.raises(surgery.SurgeryError, match="exactly one"):
        surgery.rewire(model, {}, X8, child=model, act="gelu")


def test_replace_classifier_on_a_plain_model_needs_its_pattern(tiny):
    model, variables = tiny
    with pytest.raises(surgery.SurgeryError, match=r"pattern '\(\^\|/\)classifier/' matches no path.*Dense_0"):
        surgery.replace_classifier(model, variables, 7, X8)
    new_model, new_vars, report = surgery.replace_classifier(model, variables, 7, X8, classifier="Dense_0")
    assert new_model.num_classes == 7 and new_vars["params"]["Dense_0"]["kernel"].shape == (256, 7)
    assert {p for p, _, _ in report.mismatched} == {"params/Dense_0/kernel", "params/Dense_0/bias"}
    assert len(report.inherited) == 7


def test_replace_classifier_of_a_padded_head_reinitialises_it():
    """104 and 100 classes are both 128 wide: same shapes, but the old columns mean other classes."""
    head = surgery.ClassifierHead(PlainNet(num_classes=0), 104, pad_to=128)
    variables = surgery.init_variables(head, X8, seed=1)
    new_head, new_vars, report = surgery.replace_classifier(head, variables, 100, X8, seed=2)
    assert new_head.num_outputs == 128 and new_head.num_classes == 100
    assert report.reinitialised == ("params/classifier/bias", "params/classifier/kernel")
    assert len(report.inherited) == 10  # the backbone: 6 params + 4 BN stats
    kernel = new_vars["params"]["classifier"]["kernel"]
    assert not np.allclose(kernel[:, :100], variables["params"]["classifier"]["kernel"][:, :100])
    assert np.all(kernel[:, 100:] == 0)  # the new padding is zero from the start


# --------------------------------------------------------------------------- heads


def test_attach_head_keeps_the_backbone_and_checks_the_fit():
    backbone = PlainNet(num_classes=0)
    bb_vars = random_stats(surgery.init_variables(backbone, X8, seed=7))
    head, variables, report = surgery.attach_head(backbone, bb_vars, 10, X8, drop_rate=0.3, head_init="random")
    assert report.new == ("params/classifier/bias", "params/classifier/kernel")
    assert trees_equal({k: v["backbone"] for k, v in variables.items()}, bb_vars)
    x = jax.random.uniform(jax.random.key(1), (3, 8, 8, 3))
    features = forward(backbone, bb_vars, x).mean(axis=(1, 2))
    dense = variables["params"]["classifier"]
    np.testing.assert_allclose(forward(head, variables, x), features @ dense["kernel"] + dense["bias"], atol=1e-5)

    wider = surgery.init_variables(PlainNet(num_classes=0, width=16), X8)
    with pytest.raises(surgery.SurgeryError, match=r"10 common paths all differ in shape"):
        surgery.attach_head(backbone, wider, 10, X8)
    incomplete = {**bb_vars, "batch_stats": {"bn0": bb_vars["batch_stats"]["bn0"]}}
    missing = r"(?s)do not fit the backbone PlainNet.*new \(fresh init\): batch_stats/backbone/bn1/mean"
    with pytest.raises(surgery.SurgeryError, match=missing):
        surgery.attach_head(backbone, incomplete, 10, X8)
    with pytest.raises(surgery.SurgeryError, match="expects 12 features but the backbone PlainNet outputs 8"):
        surgery.attach_head(backbone, bb_vars, 10, X8, num_features=12)
    with pytest.raises(surgery.SurgeryError, match="must be >= 1"):
        surgery.attach_head(backbone, bb_vars, 10, X8, pad_to=0)


def test_new_heads_start_at_zero_so_a_fine_tune_starts_at_loss_ln_c():
    backbone = PlainNet(num_classes=0)
    bb_vars = random_stats(surgery.init_variables(backbone, X8, seed=7))
    head, variables, _ = surgery.attach_head(backbone, bb_vars, 10, X8, pad_to=128)
    assert not any(np.any(leaf) for leaf in jax.tree.leaves(variables["params"]["classifier"]))
    x = jax.random.uniform(jax.random.key(1), (3, 8, 8, 3))
    logits = forward(head, variables, x)[:, :10]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, jnp.array([0, 3, 9])).mean()
    np.testing.assert_allclose(loss, np.log(10), rtol=1e-6)
    _, replaced, _ = surgery.replace_classifier(head, variables, 7, X8)
    assert not any(np.any(leaf) for leaf in jax.tree.leaves(replaced["params"]["classifier"]))
    _, random_head, _ = surgery.replace_classifier(head, variables, 7, X8, head_init="random")
    assert np.any(random_head["params"]["classifier"]["kernel"])
    with pytest.raises(surgery.SurgeryError, match="head_init must be one of"):
        surgery.attach_head(backbone, bb_vars, 10, X8, head_init="ones")


def test_padded_head_trains_exactly_like_the_unpadded_one():
    backbone = PlainNet(num_classes=0)
    bb_vars = surgery.init_variables(backbone, X8, seed=2)
    plain, plain_vars, _ = surgery.attach_head(backbone, bb_vars, 10, X8, head_init="random")
    padded, padded_vars, _ = surgery.attach_head(backbone, bb_vars, 10, X8, pad_to=128, head_init="random")
    assert padded.num_outputs == 128
    # the padded head's real columns start equal to the unpadded head's; the padding is zero
    dense = plain_vars["params"]["classifier"]
    padded_vars["params"]["classifier"] = {"kernel": jnp.pad(dense["kernel"], ((0, 0), (0, 118))),
                                           "bias": jnp.pad(dense["bias"], (0, 118))}
    tx = make_optimizer(3e-2, OptimConfig(weight_decay=0.05, clip_norm=1.0))
    host_batches = digit_batches(4)
    results = {}
    for name, model, variables in (("plain", plain, plain_vars), ("padded", padded, padded_vars)):
        steps = one_device_steps(model, tx, task=SoftmaxClassification(label_smoothing=0.1))
        results[name] = train(steps, steps.put_state(jax.device_get(create_train_state(variables, tx))), host_batches)
    (plain_state, plain_losses), (padded_state, padded_losses) = results["plain"], results["padded"]
    np.testing.assert_allclose(padded_losses, plain_losses, rtol=1e-6)
    assert plain_losses[-1] < plain_losses[0]  # it did train
    trained = padded_state.params["classifier"]
    np.testing.assert_allclose(trained["kernel"][:, :10], plain_state.params["classifier"]["kernel"], atol=1e-6)
    assert np.all(trained["kernel"][:, 10:] == 0) and np.all(trained["bias"][10:] == 0)


# --------------------------------------------------------------------------- freezing


class KitBNNet(nn.Module):
    """A Dense and the kit's BatchNorm (``train`` at call time)."""

    @nn.compact
    def __call__(self, x):
        train = self.is_mutable_collection("batch_stats") and not self.is_initializing()
        return KitBatchNorm(LayerCfg(), name="bn")(nn.Dense(6, name="dense")(x), train)


@pytest.mark.parametrize("kind", ["flax", "kit"])
def test_frozen_batchnorm_normalises_with_running_stats_and_keeps_them(kind, tiny):
    if kind == "flax":  # flax BatchNorm with use_running_average set in the constructor
        model, variables, pattern = tiny[0], random_stats(tiny[1]), "BatchNorm_0"
        x = jax.random.uniform(jax.random.key(2), (16, 8, 8, 3))
    else:
        model = KitBNNet()
        x = 3 * jax.random.normal(jax.random.key(2), (16, 5)) + 1
        variables, pattern = random_stats(surgery.init_variables(model, x)), "^bn/"
    frozen = surgery.freeze_batchnorm(model, pattern)
    evaluation = forward(model, variables, x)
    out, updates = forward(frozen, variables, x, mutable=["batch_stats"])
    np.testing.assert_allclose(out, evaluation, atol=1e-6)  # running statistics, not the batch's
    assert trees_equal(updates["batch_stats"], variables["batch_stats"])
    out_free, updates_free = forward(model, variables, x, mutable=["batch_stats"])  # the control
    assert not np.allclose(out_free, evaluation, atol=1e-3)
    assert not trees_equal(updates_free["batch_stats"], variables["batch_stats"])


def test_freeze_mask_and_report(tiny):
    model, variables = tiny
    mask = surgery.flatten(surgery.freeze_mask(variables["params"], [r"^Conv_0/", "BatchNorm"]))
    assert {p for p, f in mask.items() if f} == {"Conv_0/kernel", "BatchNorm_0/scale", "BatchNorm_0/bias"}
    with pytest.raises(surgery.SurgeryError, match=r"pattern 'Conv_2' matches no path; paths look like: .*Conv_"):
        surgery.freeze_mask(variables["params"], ["Conv_0", "Conv_2"])
    frozen = surgery.freeze(model, optax.sgd(0.1), variables, [r"^Conv_0/", "BatchNorm"])
    report = frozen.report
    assert (report.frozen_leaves, report.frozen_values) == (3, 3 * 3 * 3 * 16 + 2 * 16)
    assert (report.trainable_leaves, report.trainable_values) == (4, 3 * 3 * 16 * 16 + 16 + 256 * 10 + 10)
    assert report.inference_batchnorms == ("BatchNorm_0",)
    assert frozen.model.num_classes == 10  # the wrapper passes the model's attributes through


def test_unfreezing_keeps_the_optimizer_state_of_the_parts_already_training(tiny):
    model, variables = tiny
    adam = optax.adamw(1e-2, weight_decay=0.01)  # no global clipping: each leaf's update is its own
    host_batches = digit_batches(3)
    head_only = surgery.freeze_optimizer(adam, r"^(Conv|BatchNorm)")
    state_paths = surgery.flatten(head_only.init(variables["params"]))
    assert not [p for p in state_paths if "/Conv" in p or "/BatchNorm" in p]  # frozen leaves hold no state
    assert sum("/Dense_0/" in p for p in state_paths) == 4  # Adam's mu and nu of kernel and bias
    steps1 = one_device_steps(model, head_only)
    state, _ = train(steps1, steps1.put_state(jax.device_get(create_train_state(variables, head_only))),
                     host_batches[:2])

    more = surgery.freeze_optimizer(adam, r"^(Conv_0|BatchNorm)")  # Conv_1 joins the training
    opt_state, report = surgery.carry_optimizer_state(state.opt_state, more, state.params)
    assert len(report.new) == 4 and all("/Conv_1/" in p for p in report.new)  # Adam's mu and nu of kernel, bias
    assert {p.rsplit("/", 1)[-1] for p in report.inherited} >= {"count"}
    old, carried = surgery.flatten(state.opt_state), surgery.flatten(opt_state)
    for path in (p for p in carried if "/Dense_0/" in p or p.endswith("count")):
        np.testing.assert_array_equal(carried[path], old[path])
    assert int(carried[next(p for p in carried if p.endswith("count"))]) == 2

    steps2 = one_device_steps(model, more)
    (after_more, _), (after_head, _) = (train(steps2, steps2.put_state(state.replace(opt_state=opt_state)),
                                              host_batches[2:]),
                                        train(steps1, steps1.put_state(state), host_batches[2:]))
    # the head moves exactly as if nothing had changed; Conv_1 now trains too
    np.testing.assert_allclose(after_more.params["Dense_0"]["kernel"], after_head.params["Dense_0"]["kernel"],
                               rtol=1e-6, atol=1e-7)
    assert not np.allclose(after_more.params["Conv_1"]["kernel"], state.params["Conv_1"]["kernel"])
    np.testing.assert_array_equal(after_head.params["Conv_1"]["kernel"], state.params["Conv_1"]["kernel"])


# --------------------------------------------------------------------------- input channels, features


def test_adapt_input_channels_grey_and_six(tiny):
    model, variables = tiny
    x = jax.random.uniform(jax.random.key(3), (2, 8, 8, 3))
    grey_vars, report = surgery.adapt_input_channels(variables, 1)
    assert (report.path, report.old_shape, report.new_shape) == ("params/Conv_0/kernel", (3, 3, 3, 16), (3, 3, 1, 16))
    grey = x[..., :1]
    np.testing.assert_allclose(forward(model, grey_vars, grey), forward(model, variables, jnp.repeat(grey, 3, -1)),
                               atol=1e-5)
    six_vars, _ = surgery.adapt_input_channels(variables, 6)
    np.testing.assert_allclose(forward(model, six_vars, jnp.concatenate([x, x], -1)), forward(model, variables, x),
                               atol=1e-5)
    five, _ = surgery.adapt_input_channels(variables, 5)
    k5, k3 = five["params"]["Conv_0"]["kernel"], variables["params"]["Conv_0"]["kernel"]
    np.testing.assert_allclose(k5, jnp.concatenate([k3, k3[:, :, :2]], 2) * 3 / 5, rtol=1e-6)
    with pytest.raises(surgery.SurgeryError, match="cannot tell the stem kernel: 2 candidates"):
        surgery.adapt_input_channels(variables, 1, kernel=r"Conv_\d/kernel")


def test_extract_features_by_module_path(tiny):
    model, variables = tiny
    x = jax.random.uniform(jax.random.key(4), (2, 8, 8, 3))
    features = surgery.extract_features(model, variables, x, [r"^Conv_0$", "Dense"])
    assert sorted(features) == ["Conv_0", "Dense_0"]
    kernel = variables["params"]["Conv_0"]["kernel"]
    want = jax.lax.conv_general_dilated(x, kernel, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    np.testing.assert_allclose(features["Conv_0"], want, atol=1e-5)
    np.testing.assert_allclose(features["Dense_0"], forward(model, variables, x), atol=1e-6)
    with pytest.raises(surgery.SurgeryError, match=r"pattern 'conv_9' matches no path.*Conv_"):
        surgery.extract_features(model, variables, x, "conv_9")


# --------------------------------------------------------------------------- EfficientNet

# A shrunken tf_efficientnetv2_b0 (same block types, padding, BN): stem 32, then
# cn(16) | er(32, s2) | 2 x ir+SE(48, s2) | ir+SE(64, s2), head 128.
PARENT_ARCH = (("cn_r1_k3_s1_e1_c16_skip",), ("er_r1_k3_s2_e4_c32",), ("ir_r2_k3_s2_e4_c48_se0.25",),
               ("ir_r1_k3_s2_e6_c64_se0.25",))
# stage 2 rewired: one ConvBnAct block (another type, fewer blocks), same output width
CHILD_ARCH = PARENT_ARCH[:2] + (("cn_r1_k3_s2_e1_c48",),) + PARENT_ARCH[3:]
X16 = jnp.zeros((1, 16, 16, 3))


def small_effnet(**kw):
    return create_model("tf_efficientnetv2_b0", arch_def=PARENT_ARCH, num_features=128, **kw)


@pytest.fixture(scope="module")
def effnet():
    model = small_effnet(num_classes=10)
    return model, random_stats(surgery.init_variables(model, X16, seed=0))


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_rewire_one_stage_and_the_head_of_an_efficientnet(effnet):
    parent, variables = effnet
    child, child_vars, report = surgery.rewire(parent, variables, X16, arch_def=CHILD_ARCH, num_classes=5)
    # Leaves per block, from blocks.py: stem / head conv+BN: 3 params + 2 stats; cn: 3 + 2;
    # er without SE: 6 + 4; ir with SE: 13 + 6. Classifier: 2.
    stem = head = cn = 5
    er, ir = 10, 19
    assert len(surgery.flatten(variables)) == stem + cn + er + 2 * ir + ir + head + 2
    # Stage 2 (in 32 -> 48): the child's cn block has conv/kernel (new) and bn1 of 48 channels,
    # where the parent's first ir block has bn1 of its expanded width 32 * 4 = 128.
    assert report.new == ("params/blocks_2_0/conv/kernel",)
    assert sorted(report.mismatched) == sorted(
        [(f"{col}/blocks_2_0/bn1/{leaf}", (128,), (48,)) for col, leaves in
         (("params", ("scale", "bias")), ("batch_stats", ("mean", "var"))) for leaf in leaves]
        + [("params/classifier/kernel", (128, 10), (128, 5)), ("params/classifier/bias", (10,), (5,))])
    assert len(report.unused) == (ir - 4) + ir  # the rest of blocks_2_0, all of blocks_2_1
    assert len(report.inherited) == stem + cn + er + ir + head  # everything outside stage 2 and the head
    assert child.spec.arch_def == CHILD_ARCH and child.num_classes == 5

    x = jax.random.uniform(jax.random.key(5), (2, 16, 16, 3))
    before = surgery.extract_features(parent, variables, x, r"^stage_")
    after = surgery.extract_features(child, child_vars, x, r"^stage_")
    assert sorted(before) == [f"stage_{i}" for i in range(4)]
    for i in (0, 1):  # the unchanged stages compute the same activations
        np.testing.assert_array_equal(before[f"stage_{i}"], after[f"stage_{i}"])
    assert not np.allclose(before["stage_2"], after["stage_2"])


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_rewire_efficientnet_activation_inherits_everything(effnet):
    parent, variables = effnet
    child, child_vars, report = surgery.rewire(parent, variables, X16, act="gelu")
    assert child.act == "gelu" and parent.act is None  # SiLU, the variant's own
    assert len(report.inherited) == len(jax.tree.leaves(variables)) and not (report.new or report.mismatched)
    assert trees_equal(child_vars, variables)


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_efficientnet_inspection_and_input_channels(effnet):
    model, variables = effnet
    table = surgery.param_table(variables, frozen=r"^(conv_stem|bn1|blocks_)")
    assert [m for m, _, _ in table.rows] == ["blocks_0_0", "blocks_1_0", "blocks_2_0", "blocks_2_1", "blocks_3_0",
                                             "bn1", "bn2", "classifier", "conv_head", "conv_stem"]
    assert table.trainable == 128 * 64 + 2 * 128 + 128 * 10 + 10  # conv_head, bn2, classifier
    assert table.total == sum(np.size(p) for p in jax.tree.leaves(variables["params"]))
    flops = [surgery.count_flops(model, variables, jnp.zeros((n, 16, 16, 3))) for n in (1, 2)]
    assert flops[0] > 2 * 8 * 8 * 3 * 3 * 3 * 32  # at least the stem conv's multiply-adds
    assert abs(flops[1] / flops[0] - 2) < 0.02

    x = jax.random.uniform(jax.random.key(6), (2, 16, 16, 1))
    grey_vars, report = surgery.adapt_input_channels(variables, 1)
    assert report.path == "params/conv_stem/kernel" and report.new_shape == (3, 3, 1, 32)
    np.testing.assert_allclose(forward(model, grey_vars, x), forward(model, variables, jnp.repeat(x, 3, -1)),
                               rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_frozen_efficientnet_backbone_is_bit_identical_after_training(effnet):
    _, variables = effnet
    backbone = small_effnet(num_classes=0, global_pool="")
    bb_vars = {col: {k: v for k, v in tree.items() if k != "classifier"} for col, tree in variables.items()}
    model, head_vars, _ = surgery.attach_head(backbone, bb_vars, 10, jnp.zeros((1, 8, 8, 3)), drop_rate=0.2)
    tx = make_optimizer(1e-2, OptimConfig(weight_decay=0.05))
    frozen = surgery.freeze(model, tx, head_vars, r"^backbone/")
    assert len(frozen.report.inference_batchnorms) == 1 + 1 + 2 + 3 * 3 + 1  # stem, cn, er, 3 x ir, head
    steps = one_device_steps(frozen.model, frozen.tx)
    state, losses = train(steps, steps.put_state(jax.device_get(create_train_state(head_vars, frozen.tx))),
                          digit_batches(3))
    assert np.isfinite(losses).all()
    assert trees_equal(state.params["backbone"], head_vars["params"]["backbone"])
    assert trees_equal(state.batch_stats, head_vars["batch_stats"])
    assert not np.allclose(state.params["classifier"]["kernel"], head_vars["params"]["classifier"]["kernel"])


# --------------------------------------------------------------------------- the job


@pytest.mark.slow
def test_job_fine_tunes_ported_weights_with_a_frozen_backbone(tmp_path):
    """``--weights`` + ``--freeze``: the frozen backbone (BatchNorm statistics included) leaves the run as it came."""
    from kaggle_utils import job
    from kaggle_utils.data import make_sample_dataset
    from weights_port import port

    weights = tmp_path / "ported.msgpack"
    port(TEST_MODEL, weights, pretrained=False, verify_size=16)  # random weights, verified against timm
    data = make_sample_dataset(tmp_path / "data", image_size=16)
    out = tmp_path / "run"
    assert job.main(["train", "--data-dir", data.root, "--out", str(out), "--model", TEST_MODEL,
                     "--weights", str(weights), "--freeze", r"^(?!classifier/)", "--epochs", "1",
                     "--steps-per-epoch", "2", "--batch-size", "8", "--no-progress"]) == 0
    state = checkpoint.load(out / "last.msgpack")["state"]
    ported = checkpoint.load(weights)
    assert int(state["step"]) == 2
    assert trees_equal(state["batch_stats"], ported["batch_stats"])
    backbone = {k: v for k, v in ported["params"].items() if k != "classifier"}
    assert trees_equal({k: state["params"][k] for k in backbone}, backbone)
    assert state["params"]["classifier"]["kernel"].shape == (256, 10)
    moments = [v for p, v in surgery.flatten(state["opt_state"]).items() if "/mu/classifier/" in p]
    assert moments and all(np.any(m != 0) for m in moments)  # the head did get gradients
