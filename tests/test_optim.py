"""Optimizers and schedules by name (``--optimizer``, ``--schedule``), and ``run.train(tx=...)``: any optax transform."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from kaggle_utils import job, run
from kaggle_utils.config import ConfigError, OptimConfig, TrainConfig, config_from_args
from kaggle_utils.parallel import make_mesh
from kaggle_utils.registry import OPTIMIZERS
from kaggle_utils.train import StepConfig, init_variables, make_optimizer, make_steps
from kaggle_utils.train.optim import at_rate_table, make_schedule

from job_helpers import TEST_MODEL
from train_helpers import TinyCNN, batches, digits


@pytest.mark.parametrize("name, expected", [
    # peak 1, 20 steps, warmup 4: 0 -> 1 over the warmup, then the name's shape over the 16 steps left
    ("cosine", {0: 0.0, 2: 0.5, 4: 1.0, 12: (1.0 + 0.1) / 2, 20: 0.1}),  # half-way: the mean of peak and end
    ("linear", {2: 0.5, 4: 1.0, 12: 1 - 0.9 * 8 / 16, 20: 0.1}),
    ("constant", {2: 0.5, 4: 1.0, 19: 1.0}),
    ("step", {4: 1.0, 8: 1.0, 9: 0.5, 14: 0.25, 19: 0.125}),  # x0.5 every 5 steps after the warmup
])
def test_each_schedule_warms_up_then_follows_its_shape(name, expected):
    options = {"end_lr_factor": 0.1} if name in ("cosine", "linear") else {}
    if name == "step":
        options = {"decay_epochs": 5, "decay_rate": 0.5}  # of 1 step each
    schedule = make_schedule(OptimConfig(schedule=name, **options), 1.0, 20, warmup_steps=4, steps_per_epoch=1)
    for step, value in expected.items():
        assert float(schedule(step)) == pytest.approx(value, abs=1e-6), (name, step)


def test_onecycle_rises_over_the_warmup_from_a_25th_of_the_peak_then_anneals():
    schedule = make_schedule("onecycle", 2.0, 100, warmup_steps=30)
    values = [float(schedule(s)) for s in range(101)]
    assert values[0] == pytest.approx(2.0 / 25) and max(values) == pytest.approx(2.0)
    assert int(np.argmax(values)) == 30 and values[100] == pytest.approx(2.0 / 25 / 1e4, rel=1e-3)


def _updates(tx, params, steps):
    """The updates of ``steps`` optimizer steps towards 0 on a quadratic, one list per step."""
    state, out = tx.init(params), []
    for _ in range(steps):
        grads = jax.tree.map(lambda p: 2 * p, params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        out.append(updates)
    return out


@pytest.mark.parametrize("name", ["adamw", "sgd", "lamb", "lion", "adafactor"])
def test_the_rate_table_steps_like_the_optimizer_given_the_schedule_itself(name):
    schedule = make_schedule(OptimConfig(optimizer=name), 0.1, 12, warmup_steps=3)
    optim = OptimConfig(optimizer=name, weight_decay=0.1, clip_norm=None)
    params = {"kernel": jnp.linspace(-1.0, 2.0, 12).reshape(4, 3), "bias": jnp.full((3,), 0.5)}
    tabled = _updates(make_optimizer(schedule, optim), params, 14)  # past the end too
    plain = _updates(make_optimizer(schedule.rate, optim), params, 14)  # the optax schedule, compiled in
    for a, b in zip(jax.tree.leaves(tabled), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_runs_of_other_rates_and_lengths_compile_the_same_update():
    params = {"kernel": jnp.ones((4, 3)), "bias": jnp.ones((3,))}

    def update_program(schedule):
        tx = make_optimizer(schedule, OptimConfig())
        return jax.jit(tx.update).lower(params, tx.init(params), params).as_text()

    runs = [make_schedule("cosine", 0.01, 20, warmup_steps=2), make_schedule("linear", 0.3, 50, warmup_steps=9),
            make_schedule(OptimConfig(schedule="step", decay_epochs=2), 0.1, 40, steps_per_epoch=5)]
    assert len({update_program(schedule) for schedule in runs}) == 1
    assert update_program(runs[0]) != update_program(make_schedule("cosine", 0.01, 200))  # a longer table
    assert update_program(runs[0].rate) != update_program(runs[1].rate)  # an optax schedule: its numbers compiled in
    table = runs[1].table()  # 50 steps: the next power of two, at least 64 (the float32 rounding of a fused program)
    np.testing.assert_allclose(table, [float(runs[1](step)) for step in range(64)], rtol=0, atol=1e-6 * 0.3)


def test_past_the_end_of_its_table_the_last_rate_holds():
    tx = at_rate_table(optax.sgd, [1.0, 2.0, 3.0])
    state, rates = tx.init({"w": jnp.zeros(())}), []
    for _ in range(5):
        updates, state = tx.update({"w": jnp.ones(())}, state)  # sgd without momentum: -rate x gradient
        rates.append(-float(updates["w"]))
    assert rates == [1.0, 2.0, 3.0, 3.0, 3.0]


def quadratic_step(tx, params, target):
    state = tx.init(params)
    grads = jax.grad(lambda p: sum(jnp.sum((leaf - target) ** 2) for leaf in jax.tree.leaves(p)))(params)
    updates, _ = tx.update(grads, state, params)
    return optax.apply_updates(params, updates)


@pytest.mark.parametrize("name", ["adamw", "sgd", "lamb", "lion", "adafactor"])
def test_every_optimizer_moves_towards_the_minimum_and_decays_matrices_only(name):
    params = {"kernel": jnp.full((4, 3), 2.0), "bias": jnp.full((3,), 2.0)}
    moved = quadratic_step(make_optimizer(0.05, OptimConfig(optimizer=name, weight_decay=0.0, clip_norm=None)), params,
                           0.0)
    assert all(float(jnp.max(moved[k])) < 2.0 for k in params), name
    # no gradient at all: only the weight decay moves anything, and it leaves the 1-D bias alone
    decayed = quadratic_step(make_optimizer(0.05, OptimConfig(optimizer=name, weight_decay=0.5, clip_norm=None)),
                             params, 2.0)
    assert float(jnp.max(decayed["kernel"])) < 2.0 and np.array_equal(decayed["bias"], params["bias"]), name


def test_sgd_momentum_and_nesterov_follow_their_textbook_updates():
    lr, mu, grad = 0.1, 0.9, 1.0  # a constant gradient of 1 on a 2-D leaf, no decay
    params = {"w": jnp.zeros((2, 2))}
    grads = {"w": jnp.full((2, 2), grad)}
    for nesterov, expected in ((False, [-lr * 1, -lr * (1 + mu)]), (True, [-lr * (1 + mu), -lr * (1 + mu + mu * mu)])):
        tx = make_optimizer(lr, OptimConfig(optimizer="sgd", weight_decay=0.0, clip_norm=None, momentum=mu,
                                            nesterov=nesterov))
        state = tx.init(params)
        for step_update in expected:
            updates, state = tx.update(grads, state, params)
            assert float(updates["w"][0, 0]) == pytest.approx(step_update), (nesterov, step_update)


def test_betas_reach_the_optimizer():
    params = {"w": jnp.ones((2, 2))}
    grads = [{"w": jnp.full((2, 2), 0.3)}, {"w": jnp.full((2, 2), -1.0)}]  # changing: the moments' decays show

    def second_update(tx):
        state = tx.init(params)
        for g in grads:
            updates, state = tx.update(g, state, params)
        return updates["w"]

    ours = second_update(make_optimizer(0.01, OptimConfig(optimizer="adamw", weight_decay=0.0, clip_norm=None, b1=0.5,
                                                          b2=0.6)))
    np.testing.assert_allclose(ours, second_update(optax.adamw(0.01, b1=0.5, b2=0.6, weight_decay=0.0)), rtol=1e-6)
    assert not np.allclose(ours, second_update(optax.adamw(0.01, weight_decay=0.0)), rtol=1e-3)


def parse(*flags):
    return config_from_args(job.build_parser().parse_args(["train", "--out", "x", *flags]))


def test_the_flags_are_generated_from_the_config():
    config = parse("--optimizer", "sgd", "--momentum", "0.8", "--nesterov", "--schedule", "step",
                   "--decay-epochs", "2", "--decay-rate", "0.2", "--weight-decay", "0")
    optim = config.optim
    assert (optim.optimizer, optim.momentum, optim.nesterov, optim.schedule, optim.decay_epochs, optim.decay_rate,
            optim.weight_decay) == ("sgd", 0.8, True, "step", 2.0, 0.2, 0.0)
    with pytest.raises(SystemExit):
        parse("--optimizer", "rmsprop")


@pytest.mark.parametrize("changes, message", [
    ({"optimizer": "sgd", "b1": 0.8}, "--b1 would not be read by --optimizer sgd"),
    ({"momentum": 0.5, "nesterov": True}, "--momentum / --nesterov would not be read by --optimizer adamw"),
    ({"schedule": "constant", "end_lr_factor": 0.1}, "--end-lr-factor would not be read by .* --schedule constant"),
    ({"decay_rate": 0.5}, "--decay-rate would not be read by .* --schedule cosine"),
    ({"b2": 1.0}, r"--b2 1.0: must be in \[0, 1\)"),
    ({"optimizer": "sgd", "momentum": 0.0, "nesterov": True}, "--nesterov needs --momentum > 0"),
    ({"schedule": "step", "decay_epochs": 0.0}, "--decay-epochs 0.0: must be a finite number > 0"),
    ({"schedule": "step", "decay_rate": 0.0}, r"--decay-rate 0.0: must be in \(0, 1\]"),
])
def test_flags_the_optimizer_or_schedule_would_not_read_and_bad_values_are_refused(changes, message):
    with pytest.raises(ConfigError, match=message):
        run.check_config(TrainConfig().replace(**changes))


def fake_data(tmp_path):
    return run.RunData(tmp_path, {}, stored_size=32, num_train=640, max_label=9, description="x")


@pytest.mark.parametrize("optimizer, lr, weight_decay", [("adamw", 1e-2, 0.05), ("sgd", 0.1, 1e-4),
                                                         ("lion", 1e-3, 0.5)])
def test_each_optimizer_has_its_own_default_rate_and_decay_and_the_plan_names_them(tmp_path, optimizer, lr,
                                                                                  weight_decay):
    config, plan = run.resolve(TrainConfig().replace(batch_size=64, optimizer=optimizer, schedule="linear"),
                               fake_data(tmp_path))
    assert (config.optim.lr, config.optim.weight_decay) == (lr, weight_decay)
    assert plan.peak_lr == pytest.approx(lr * 64 / 256)
    assert f"{optimizer}, linear schedule, peak learning rate" in plan.describe(config)


def test_an_optimizer_of_yours_is_one_registration_and_trains(tmp_path):
    """Issue 47: a new optimizer was 3-4 edits (the flag's choices, its defaults, the dispatch); now its builder."""
    @OPTIMIZERS.register("test_rmsprop", help="lr 3e-3, no weight decay", lr=3e-3, weight_decay=0.0)
    def rmsprop(optim, schedule, weight_decay):
        return optax.rmsprop(schedule)

    try:
        config = parse("--optimizer", "test_rmsprop", "--model", TEST_MODEL, "--image-size", "16", "--batch-size", "8",
                       "--warmup-epochs", "0")
        assert "test_rmsprop (lr 3e-3, no weight decay)" in job.build_parser()._subparsers._group_actions[0].choices[
            "train"].format_help().replace("\n", " ").replace("  ", " ")
        run.check_config(config)
        config, plan = run.resolve(config, fake_data(tmp_path))
        assert (config.optim.lr, config.optim.weight_decay) == (3e-3, 0.0)
        tx = make_optimizer(plan.peak_lr, config.optim)  # what build_training makes of the config's section
        steps = make_steps(TinyCNN(), tx, StepConfig(num_classes=10), mode="jit", mesh=make_mesh(jax.devices()[:1]))
        variables = init_variables(TinyCNN(), 8)
        state = steps.put_state(steps.init_state(variables))
        images, labels = digits()
        state, metrics = steps.train(state, steps.put_batch(next(batches(images, labels, 8))))
        after = steps.get(state)
        assert int(after.step) == 1 and np.isfinite(float(steps.get(metrics)["task"]["loss_sum"]))
        moved = jax.tree.map(lambda a, b: not np.allclose(a, b), after.params, variables["params"])
        assert all(jax.tree.leaves(moved))
    finally:
        OPTIMIZERS._entries.pop("test_rmsprop")
    with pytest.raises(ConfigError, match="--optimizer 'test_rmsprop': choose one of adamw, sgd"):
        TrainConfig().replace(optimizer="test_rmsprop").check()


def tiny(sample, **changes):
    return TrainConfig().replace(**{"data_dir": sample.root, "model": TEST_MODEL, "batch_size": 64, "steps": 4,
                                    "eval_every": 2, "tensorboard": False, **changes})


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_the_seed_tutorial_s_constant_rate_adamw_is_one_command(sample, tmp_path):
    log = tmp_path / "log"
    job.main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--batch-size", "64", "--steps", "4",
              "--eval-every", "2", "--schedule", "constant", "--warmup-epochs", "0", "--lr", "0.00224",
              "--weight-decay", "1e-4", "--out", str(log), "--no-progress"])
    record = json.loads((log / "config.json").read_text())
    assert record["config"]["optim"]["schedule"] == "constant" and record["plan"]["warmup_steps"] == 0
    history = json.loads((log / "metrics.json").read_text())["history"]
    assert [row["lr"] for row in history] == pytest.approx([0.00224 * 64 / 256] * 2)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_custom_transform_trains_and_config_json_records_it(sample, tmp_path):
    result = run.train(tiny(sample), tmp_path / "tx", tx=optax.sgd(0.05, momentum=0.9), progress=False)
    assert all(math.isnan(row["lr"]) for row in result.history)  # its own rate: the run cannot know it
    assert all(math.isfinite(row["val_loss"]) for row in result.history)
    record = json.loads((tmp_path / "tx" / "config.json").read_text())
    assert record["tx"] == ("a custom optax transform replaced --optimizer and its settings, --lr and --schedule "
                            "(history lr: NaN)")

    def momentum_sgd(schedule):
        return optax.sgd(schedule, momentum=0.9)

    result = run.train(tiny(sample), tmp_path / "fn", tx=momentum_sgd, progress=False)
    record = json.loads((tmp_path / "fn" / "config.json").read_text())
    assert "momentum_sgd(schedule)" in record["tx"]
    assert [row["lr"] for row in result.history] == pytest.approx(
        [float(make_schedule("cosine", result.plan.peak_lr, 4, warmup_steps=result.plan.warmup_steps)(s))
         for s in (2, 4)])


def test_lr_auto_with_a_custom_transform_is_refused_before_anything_is_written(sample, tmp_path):
    with pytest.raises(ConfigError, match="--lr auto sweeps the rate of the kit's optimizer"):
        run.train(tiny(sample, lr="auto"), tmp_path / "refused", tx=optax.sgd(0.1))
    assert not (tmp_path / "refused").exists()
