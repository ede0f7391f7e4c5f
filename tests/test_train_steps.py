"""Train / eval / predict steps: 8 devices == 1 device == a plain reference; pmap == jit."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn.metrics import confusion_matrix as sk_confusion

from kaggle_utils.config import OptimConfig
from kaggle_utils.parallel import make_mesh
from kaggle_utils.train import SoftmaxClassification, StepConfig, create_train_state, init_variables, make_optimizer, make_steps
from train_helpers import TinyCNN, batches, digits

MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
CONFIG = StepConfig(num_classes=10, mean=MEAN, std=STD, task=SoftmaxClassification(label_smoothing=0.1))


def reference_train(variables, tx, host_batches):
    """Plain single-device training written from the definitions, not from the kit's steps."""
    model = TinyCNN()  # unsynchronised BN: one device sees the whole batch
    params, stats = variables["params"], variables["batch_stats"]
    opt_state = tx.init(params)

    @jax.jit
    def step(params, stats, opt_state, b):
        x = (b["image"].astype(jnp.float32) / 255 - jnp.array(MEAN)) / jnp.array(STD)
        target = jax.nn.one_hot(b["label"], 10) * 0.9 + 0.01
        mask = b["mask"].astype(jnp.float32)

        def loss_fn(p):
            logits, upd = model.apply({"params": p, "batch_stats": stats}, x, mutable=["batch_stats"])
            per_example = -(target * jax.nn.log_softmax(logits)).sum(-1)
            return (per_example * mask).sum() / mask.sum(), upd["batch_stats"]

        (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state

    for b in host_batches:
        params, stats, opt_state = step(params, stats, opt_state, b)
    return params, stats


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def setup():
    images, labels = digits("train")
    host_batches = list(batches(images[:61], labels[:61], 32))  # second batch: 29 real + 3 padded
    assert not host_batches[-1]["mask"].all()
    tx = make_optimizer(0.01, OptimConfig(weight_decay=0.01, clip_norm=1.0))
    variables = init_variables(TinyCNN(), 8, seed=1)
    return host_batches, tx, variables


@pytest.fixture(scope="module")
def reference(setup):
    host_batches, tx, variables = setup
    return reference_train(variables, tx, host_batches)


@pytest.mark.parametrize("mode", ["pmap", "jit"])
@pytest.mark.parametrize("n_devices", [1, 8])
def test_train_steps_match_the_single_device_reference(setup, reference, mode, n_devices):
    host_batches, tx, variables = setup
    model = TinyCNN(bn_axis_name="data")
    steps = make_steps(model, tx, CONFIG, mode=mode, mesh=make_mesh(jax.devices()[:n_devices]))
    state = steps.put_state(jax.device_get(create_train_state(variables, tx)))
    for b in host_batches:
        state, metrics = steps.train(state, steps.put_batch(b))
    host = steps.get(state)
    ref_params, ref_stats = reference
    assert max_diff(host.params, ref_params) < 1e-5
    assert max_diff(host.batch_stats, ref_stats) < 1e-5
    assert max_diff(host.params, variables["params"]) > 1e-3  # it did train
    assert int(host.step) == 2
    figures = steps.get(metrics)
    assert int(figures["task"]["count"]) == 29  # padding never counts
    # the optimiser's figures are a group of their own, never mixed into the task's sums
    assert set(figures) == {"task", "optim"} and not set(figures["task"]) & set(figures["optim"])
    assert int(figures["optim"]["steps"]) == 1 and float(figures["optim"]["grad_norm"]) > 0


def test_pmap_and_jit_modes_give_identical_results(setup):
    host_batches, tx, variables = setup
    model = TinyCNN(bn_axis_name="data", drop_rate=0.5)  # dropout on: keys must match too
    outputs = {}
    for mode in ("pmap", "jit"):
        steps = make_steps(model, tx, dataclasses.replace(CONFIG, optim=OptimConfig(ema_decay=0.999)), mode=mode)
        state = steps.put_state(jax.device_get(steps.init_state(variables)))
        for b in host_batches:
            state, metrics = steps.train(state, steps.put_batch(b))
        last = steps.put_batch(host_batches[-1])
        outputs[mode] = steps.get((state, metrics, steps.evaluate(state, last), steps.predict(state, last)))
    assert max_diff(outputs["pmap"], outputs["jit"]) < 1e-6


def test_dropout_differs_per_replica_and_per_step():
    """Eight replicas see the same examples; with dropout their gradients differ only by the keys."""
    from kaggle_utils.train import replica_key
    mesh = make_mesh()

    def keys(rng, step):
        return jax.random.key_data(replica_key(rng, step))[None]

    f = jax.jit(jax.shard_map(keys, mesh=mesh, in_specs=(jax.sharding.PartitionSpec(),) * 2,
                              out_specs=jax.sharding.PartitionSpec("data"), check_vma=False))
    rng = jax.random.key_data(jax.random.key(0))
    k0, k1 = np.asarray(f(rng, jnp.int32(0))), np.asarray(f(rng, jnp.int32(1)))
    assert len({tuple(k) for k in k0}) == 8 and len({tuple(k) for k in k1}) == 8
    assert not {tuple(k) for k in k0} & {tuple(k) for k in k1}


def test_bf16_compute_keeps_fp32_state(setup):
    host_batches, tx, variables = setup

    steps = make_steps(TinyCNN(bn_axis_name="data", dtype=jnp.bfloat16), tx, CONFIG, mode="jit")
    state = steps.put_state(jax.device_get(create_train_state(variables, tx)))
    state, metrics = steps.train(state, steps.put_batch(host_batches[0]))
    assert np.isfinite(float(steps.get(metrics)["task"]["loss_sum"]))
    for leaf in jax.tree.leaves((state.params, state.batch_stats, state.opt_state)):
        assert leaf.dtype in (jnp.float32, jnp.int32), leaf.dtype


@pytest.mark.parametrize("mode", ["pmap", "jit"])
def test_masked_evaluation_is_exact_whatever_the_batch_size(setup, mode):
    _, tx, variables = setup
    images, labels = digits("val")  # 397 examples: no batch size below divides it
    model = TinyCNN()
    logits = model.apply(variables, (jnp.asarray(images, jnp.float32) / 255 - jnp.array(MEAN)) / jnp.array(STD))
    preds = np.asarray(jnp.argmax(logits, -1))
    want_loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, labels).sum())
    steps = make_steps(model, tx, CONFIG, mode=mode)
    state = steps.put_state(jax.device_get(create_train_state(variables, tx)))
    for batch_size in (8, 24, 64, 400):
        total = None
        for b in batches(images, labels, batch_size):
            m = steps.get(steps.evaluate(state, steps.put_batch(b)))
            total = m if total is None else jax.tree.map(np.add, total, m)
        assert int(total["count"]) == len(labels) == 397
        np.testing.assert_array_equal(total["confusion"], sk_confusion(labels, preds, labels=range(10)))
        assert int(total["correct"]) == int((preds == labels).sum())
        assert abs(float(total["loss_sum"]) - want_loss) < 1e-3 * abs(want_loss)


@pytest.mark.parametrize("mode", ["pmap", "jit"])
def test_predict_returns_probabilities_of_the_global_batch_in_order(setup, mode):
    host_batches, tx, variables = setup
    model = TinyCNN()
    b = host_batches[0]
    x = (jnp.asarray(b["image"], jnp.float32) / 255 - jnp.array(MEAN)) / jnp.array(STD)
    want = jax.nn.softmax(model.apply(variables, x))
    want_tta = 0.5 * (want + jax.nn.softmax(model.apply(variables, x[:, :, ::-1])))
    for config, expected in ((CONFIG, want), (StepConfig(10, MEAN, STD, tta_flip=True), want_tta)):
        steps = make_steps(model, tx, config, mode=mode)
        state = steps.put_state(jax.device_get(create_train_state(variables, tx)))
        probs = steps.get(steps.predict(state, steps.put_batch(b)))
        assert probs.shape == (32, 10)
        np.testing.assert_allclose(probs, expected, atol=1e-6)
    assert max_diff(want, want_tta) > 1e-4  # the flip does change the input


def test_logits_narrower_than_num_classes_is_an_error(setup):
    host_batches, tx, variables = setup
    steps = make_steps(TinyCNN(), tx, StepConfig(num_classes=12), mode="jit")
    state = steps.put_state(jax.device_get(create_train_state(variables, tx)))
    with pytest.raises(ValueError, match="outputs 10 logits but num_classes is 12"):
        steps.train(state, steps.put_batch(host_batches[0]))


class MLP(nn.Module):
    """No BatchNorm: a batch's gradient is the sum of its parts' gradients, whatever the split."""

    @nn.compact
    def __call__(self, x, train: bool | None = None):
        x = nn.relu(nn.Dense(32)(x.reshape(x.shape[0], -1)))
        return nn.Dense(10)(x)


@pytest.mark.parametrize("mode", ["pmap", "jit"])
def test_k_micro_batches_give_the_gradient_of_the_whole_batch(setup, mode):
    """SGD with lr -1 moves each parameter by its gradient: 4 micro-batches of 16 move it as one batch of 64."""
    host_batches, _, _ = setup
    tx = optax.sgd(-1.0)
    variables = init_variables(MLP(), 8, seed=0)
    moved = {}
    for k in (1, 4):
        steps = make_steps(MLP(), tx, StepConfig(num_classes=10, optim=OptimConfig(accumulate_steps=k)), mode=mode,
                           mesh=make_mesh(jax.devices()[:2]))
        state = steps.put_state(jax.device_get(create_train_state(variables, tx)))
        state, figures = steps.train(state, steps.put_batch(host_batches[1]))  # 29 real + 3 padded
        moved[k] = jax.tree.map(np.subtract, steps.get(state).params, variables["params"])
        assert int(steps.get(figures)["task"]["count"]) == 29
    assert max_diff(moved[1], moved[4]) < 1e-6 and max_diff(moved[1], variables["params"]) > 0


def test_accumulation_with_batchnorm_trains_and_moves_the_statistics_once_per_micro_batch(setup):
    host_batches, tx, variables = setup
    steps = make_steps(TinyCNN(bn_axis_name="data"), tx,
                       StepConfig(num_classes=10, optim=OptimConfig(accumulate_steps=2)), mode="jit",
                       mesh=make_mesh(jax.devices()[:1]))
    state = steps.put_state(jax.device_get(create_train_state(variables, tx)))
    state, figures = steps.train(state, steps.put_batch(host_batches[0]))
    host = steps.get(state)
    assert int(host.step) == 1 and np.isfinite(float(steps.get(figures)["task"]["loss_sum"]))
    one = steps.get(make_steps(TinyCNN(bn_axis_name="data"), tx, StepConfig(num_classes=10), mode="jit",
                               mesh=make_mesh(jax.devices()[:1])).train(
        steps.put_state(jax.device_get(create_train_state(variables, tx))), steps.put_batch(host_batches[0]))[0])
    # two moves of the running mean (momentum 0.9 twice) differ from one move over the whole batch
    assert max_diff(host.batch_stats, one.batch_stats) > 1e-6
