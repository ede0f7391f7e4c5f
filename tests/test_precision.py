"""Precision policy: the choice per device, what computes in half precision, fp16 loss scaling.

fp16 runs on XLA:CPU (slowly), so the training tests use the tiny CNN on 8x8 digits.
"""
import functools
import re
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from kaggle_utils import run, runtime
from kaggle_utils.config import LoopConfig, OptimConfig, TrainConfig
from kaggle_utils.parallel import AXIS, make_mesh
from kaggle_utils.precision import INITIAL_SCALE, MIN_SCALE, LossScale, Precision, choose_precision
from kaggle_utils.train import (SoftmaxClassification, StepConfig, TrainingDiverged, create_train_state,
                                fit, init_variables, make_optimizer, make_steps, train_step, make_schedule)
from train_helpers import TinyCNN, batches, digits

T4 = SimpleNamespace(platform="gpu", device_kind="Tesla T4", compute_capability="7.5")


# --------------------------------------------------------------------------- the choice


@pytest.mark.parametrize("device, chosen, why", [
    (T4, "fp16", "Tesla T4, compute 7.5, no bf16 hardware"),
    (SimpleNamespace(platform="gpu", device_kind="Tesla P100-PCIE-16GB", compute_capability="6.0"), "fp16",
     "compute 6, no bf16 hardware"),
    (SimpleNamespace(platform="gpu", device_kind="NVIDIA A100-SXM4-40GB", compute_capability="8.0"), "bf16",
     "compute 8: bf16 hardware"),
    (SimpleNamespace(platform="tpu", device_kind="TPU v5 lite"), "bf16", "TPU v5 lite: bf16 matrix units"),
    (SimpleNamespace(platform="cpu", device_kind="cpu"), "fp32", "no fast half precision"),
])
def test_auto_picks_the_fast_precision_of_each_device(device, chosen, why):
    precision, reason = choose_precision("auto", device)
    assert precision.name == chosen and why in reason
    assert choose_precision("fp32", device)[0].name == "fp32"  # asked for: used as asked


def test_the_job_and_the_notebook_runtime_pick_the_same_on_a_t4(monkeypatch, tmp_path):
    monkeypatch.setattr(jax, "devices", lambda *_: [T4])
    rt = runtime.detect(root=tmp_path)
    data = run.RunData(tmp_path, {}, stored_size=16, num_train=1000, max_label=9, description="x")
    config, plan = run.resolve(TrainConfig(), data)
    assert rt.precision == config.model.precision == "fp16"
    assert "fp16 + loss scaling, fp32 weights (Tesla T4, compute 7.5, no bf16 hardware)" in plan.describe(config)
    assert "precision fp16 (Tesla T4, compute 7.5, no bf16 hardware)" in str(rt)


# --------------------------------------------------------------------------- what computes in half precision


def _operand_types(text: str, op: str) -> list[str]:
    """Element types of every operand of every ``op`` in StableHLO text (``tensor<8x16xf16>`` -> ``f16``)."""
    found = []
    for line in text.splitlines():
        if f"stablehlo.{op}" in line:
            operands = line.rsplit(":", 1)[1].split("->")[0]
            found += re.findall(r"tensor<(?:[\dx?]+x)?([a-z]+\d+)>", operands)
    return found


@pytest.fixture(scope="module")
def lowered_steps():
    """The train step of test_efficientnet (16 px, batch 8) lowered under each policy."""
    from kaggle_utils.efficientnet import create_model

    out = {}
    for name in ("fp32", "bf16", "fp16"):
        precision = Precision(name)
        model = create_model("test_efficientnet", num_classes=10, dtype=precision.compute_dtype,
                             bn_axis_name=AXIS)
        variables = init_variables(model, 16)
        tx = make_optimizer(1e-3)
        state = create_train_state(variables, tx, loss_scale=precision.loss_scaling)
        step = functools.partial(train_step, model=model, tx=tx, config=StepConfig(num_classes=10))
        mapped = jax.shard_map(step, mesh=make_mesh(jax.devices()[:1]), in_specs=(P(), P(AXIS)), out_specs=P(),
                               check_vma=False)
        batch = {"image": jnp.zeros((8, 16, 16, 3), jnp.uint8), "label": jnp.zeros(8, jnp.int32),
                 "mask": jnp.ones(8, bool)}
        out[name] = jax.jit(mapped).lower(state, batch).as_text()
    return out


@pytest.mark.parametrize("name, dtype", [("fp32", "f32"), ("bf16", "bf16"), ("fp16", "f16")])
def test_every_convolution_and_matmul_of_the_train_step_computes_in_the_policy_s_dtype(lowered_steps, name, dtype):
    text = lowered_steps[name]
    convs, dots = _operand_types(text, "convolution"), _operand_types(text, "dot_general")
    counts = {op: {t: found.count(t) for t in sorted(set(found))} for op, found in (("conv", convs), ("dot", dots))}
    print(f"{name}: operand dtypes {counts}")
    assert convs and set(convs) == {dtype}, counts
    assert dots and set(dots) == {dtype}, counts


# --------------------------------------------------------------------------- fp16 loss scaling

TRAIN, VAL = digits("train"), digits("val")
POISON = 10  # a class no digit has: a batch holding it gets an overflowing loss


class PoisonableTask(SoftmaxClassification):
    """Softmax CE, times 1e9 for an example of class POISON: its fp16 gradients overflow."""

    def loss(self, logits, targets):
        return super().loss(logits, targets) * (1.0 + 1e9 * targets[:, POISON])


def make_engine(precision: str, *, mode="jit", task=None, lr=0.03, total=24):
    schedule = make_schedule("cosine", lr, total, warmup_steps=2)
    tx = make_optimizer(schedule, OptimConfig(weight_decay=1e-4))
    model = TinyCNN(num_classes=11, bn_axis_name="data", dtype=Precision(precision).compute_dtype)
    task = task or SoftmaxClassification(label_smoothing=0.0)
    steps = make_steps(model, tx, StepConfig(num_classes=11, task=task, optim=OptimConfig(ema_decay=0.999)), mode=mode)
    state = jax.device_get(steps.init_state(init_variables(model, 8, seed=0), seed=3,
                                            loss_scale=Precision(precision).loss_scaling))
    return steps, state, schedule


def train_batches(epoch, poison_at=None):
    for i, b in enumerate(batches(*TRAIN, 64, shuffle_seed=epoch, pad=False)):
        if (epoch, i) == poison_at:
            b = {**b, "label": np.where(np.arange(64) == 0, POISON, b["label"])}
        yield b


def test_fp16_gradients_after_unscaling_agree_with_fp32_gradients():
    """SGD with lr -1 moves each parameter by its gradient: compare the moves."""
    moves = {}
    batch = next(batches(*TRAIN, 64))
    for name in ("fp32", "fp16"):
        model = TinyCNN(num_classes=11, bn_axis_name="data", dtype=Precision(name).compute_dtype)
        tx = optax.sgd(-1.0)
        steps = make_steps(model, tx, StepConfig(num_classes=11), mode="jit")
        variables = init_variables(TinyCNN(num_classes=11), 8, seed=0)
        state = create_train_state(variables, tx, loss_scale=Precision(name).loss_scaling)
        new, _ = steps.train(steps.put_state(jax.device_get(state)), steps.put_batch(batch))
        moves[name] = jax.tree.map(np.subtract, steps.get(new).params, jax.device_get(state.params))
    for a, b in zip(jax.tree.leaves(moves["fp16"]), jax.tree.leaves(moves["fp32"]), strict=True):
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b) + 1e-6


def test_an_overflow_is_skipped_halves_the_scale_and_the_run_recovers(tmp_path):
    steps, state, schedule = make_engine("fp16", task=PoisonableTask(label_smoothing=0.0))
    trace = []
    result = fit(steps, state, functools.partial(train_batches, poison_at=(2, 3)),
                 LoopConfig(steps_per_epoch=8, epochs=3, log_every=1, monitor="train_loss"),
                 lr_schedule=schedule, progress=False, out_dir=tmp_path,
                 hooks=[SimpleNamespace(on_log=lambda step, scalars: trace.append((step, scalars["loss_scale"],
                                                                                    scalars["skipped_steps"])))])
    print("loss scale trace (step, scale, skipped):", trace)
    assert [t for t in trace if t[2]][0] == (12, INITIAL_SCALE / 2, 1)  # step 12 = epoch 2's 4th batch
    assert trace[-1] == (24, INITIAL_SCALE / 2, 1)
    assert [r["skipped_steps"] for r in result.history] == [0, 1, 1]
    assert result.history[-1]["loss_scale"] == INITIAL_SCALE / 2
    assert result.history[-1]["train_acc"] > 0.8 and np.isfinite(result.history[-1]["train_loss"])
    # the schedule counted applied steps only: the last row's lr is the schedule at step 24 - 1 skipped
    assert result.history[-1]["lr"] == pytest.approx(float(schedule(23)))


def test_a_skipped_step_changes_nothing_but_the_step_and_the_scale():
    steps, state, _ = make_engine("fp16", task=PoisonableTask(label_smoothing=0.0))
    poisoned = next(train_batches(0, poison_at=(0, 0)))
    new, figures = steps.train(steps.put_state(state), steps.put_batch(poisoned))
    new, figures = steps.get(new), steps.get(figures)
    for field in ("params", "batch_stats", "opt_state", "ema_params", "rng"):
        for a, b in zip(jax.tree.leaves(getattr(new, field)), jax.tree.leaves(getattr(state, field)), strict=True):
            np.testing.assert_array_equal(a, b, err_msg=field)
    assert int(new.step) == 1 and float(new.loss_scale.scale) == INITIAL_SCALE / 2
    assert int(new.loss_scale.skipped) == 1 and int(new.loss_scale.skipped_in_row) == 1
    assert int(figures["optim"]["skipped"]) == 1 and int(figures["task"]["count"]) == 0  # nothing counted


def test_the_scale_grows_after_a_run_of_finite_steps_and_never_drops_below_its_floor():
    scale = LossScale.create(4.0)
    scale = scale.replace(good_steps=jnp.int32(1998))
    grown = scale.update(jnp.bool_(True)).update(jnp.bool_(True))
    assert float(grown.scale) == 8.0 and int(grown.good_steps) == 0
    low = LossScale.create(MIN_SCALE)
    assert float(low.update(jnp.bool_(False)).scale) == MIN_SCALE


def test_overflow_at_every_step_stops_the_run_as_diverged_with_nothing_saved(tmp_path):
    class AlwaysOverflows(SoftmaxClassification):
        def loss(self, logits, targets):
            return super().loss(logits, targets) * 1e9

    steps, state, schedule = make_engine("fp16", task=AlwaysOverflows(label_smoothing=0.0))
    with pytest.raises(TrainingDiverged, match=r"fp16 gradients overflowed \d+ step\(s\) in a row, loss scale 1 "
                                               r"\(its floor\)"):
        fit(steps, state, train_batches, LoopConfig(steps_per_epoch=20, epochs=1, log_every=5,
                                                     monitor="train_loss"),
            lr_schedule=schedule, progress=False, out_dir=tmp_path)
    assert not (tmp_path / "last.msgpack").exists()


def test_fp16_learns_digits_as_well_as_fp32_with_the_same_seed():
    accuracy = {}
    for name in ("fp32", "fp16"):
        steps, state, schedule = make_engine(name)
        result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=8, epochs=3),
                     val_batches=lambda: batches(*VAL, 64), lr_schedule=schedule, progress=False)
        accuracy[name] = result.history[-1]["val_acc"]
    print("digits val accuracy:", accuracy)
    assert accuracy["fp32"] > 0.8 and abs(accuracy["fp16"] - accuracy["fp32"]) <= 0.02


def test_pmap_and_jit_agree_in_fp16():
    states = {}
    for mode in ("pmap", "jit"):
        steps, state, _ = make_engine("fp16", mode=mode, task=PoisonableTask(label_smoothing=0.0))
        state = steps.put_state(state)
        for b in train_batches(0, poison_at=(0, 1)):
            state, _ = steps.train(state, steps.put_batch(b))
        states[mode] = steps.get(state)
    assert int(states["jit"].loss_scale.skipped) == 1
    for a, b in zip(jax.tree.leaves(states["pmap"]), jax.tree.leaves(states["jit"]), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_fp16_resume_mid_run_is_exact(tmp_path):
    settings = LoopConfig(steps_per_epoch=8, epochs=2, log_every=2, checkpoint_every=5, monitor="train_loss")
    poisoned = functools.partial(train_batches, poison_at=(1, 2))
    steps, state, schedule = make_engine("fp16", task=PoisonableTask(label_smoothing=0.0))
    full = fit(steps, state, poisoned, settings, lr_schedule=schedule, progress=False, out_dir=tmp_path / "full")

    def dying(epoch):
        for i, b in enumerate(poisoned(epoch)):
            if (epoch, i) == (2, 3):
                raise KeyboardInterrupt
            yield b

    with pytest.raises(KeyboardInterrupt):
        fit(steps, state, dying, settings, lr_schedule=schedule, progress=False, out_dir=tmp_path / "cut")
    resumed = fit(steps, state, poisoned, settings, lr_schedule=schedule, progress=False, out_dir=tmp_path / "cut",
                  resume=True)
    assert int(resumed.state.loss_scale.skipped) == 1
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(full.state), strict=True):
        np.testing.assert_array_equal(a, b)
    def comparable(history):  # timings differ between runs; NaN (no validation split) is not equal to itself
        return [{k: v for k, v in row.items() if k not in ("img_per_s", "seconds") and v == v} for row in history]

    assert comparable(resumed.history) == comparable(full.history)
