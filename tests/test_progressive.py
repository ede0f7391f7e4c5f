"""Progressive learning (``--progressive-stages``): the schedule, a staged run's columns, sizes and compiles, resume."""
import csv
import json

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.train import steps as steps_module
from kaggle_utils.train.progressive import progressive_schedule

from job_helpers import TEST_MODEL


def test_the_schedule_is_the_official_rule_with_sizes_rounded_to_multiples_of_8():
    # EfficientNetV2-S: train 300, ibase 128, 4 stages; the official sizes 171, 214, 257, 300 (int of the rule)
    stages = progressive_schedule(4, 10, image_size=300, min_size=128, magnitude=15, mixup_alpha=0.2,
                                  cutmix_alpha=1.0, drop_rate=0.3, schedule_dropout=True)
    assert [s.image_size for s in stages] == [168, 216, 256, 300]
    assert [s.epochs for s in stages] == [2, 3, 2, 3]  # stage i ends at epoch floor(10 (i + 1) / 4)
    assert [s.first_epoch for s in stages] == [1, 3, 6, 8] and [s.number for s in stages] == [1, 2, 3, 4]
    np.testing.assert_allclose([s.magnitude for s in stages], np.linspace(5, 15, 4))
    np.testing.assert_allclose([s.mixup_alpha for s in stages], np.linspace(0, 0.2, 4))
    np.testing.assert_allclose([s.cutmix_alpha for s in stages], np.linspace(0, 1.0, 4))
    np.testing.assert_allclose([s.drop_rate for s in stages], np.linspace(0.1, 0.3, 4))


def test_low_end_values_start_no_higher_than_they_end_and_dropout_stays_unless_scheduled():
    stages = progressive_schedule(3, 3, image_size=32, min_size=8, magnitude=3, drop_rate=0.05)
    assert [s.image_size for s in stages] == [16, 24, 32]
    assert [s.magnitude for s in stages] == [3, 3, 3] and [s.drop_rate for s in stages] == [0.05] * 3
    assert [s.mixup_alpha for s in stages] == [0, 0, 0]
    scheduled = progressive_schedule(2, 2, image_size=32, min_size=8, magnitude=15, drop_rate=0.05,
                                     schedule_dropout=True)
    assert [s.drop_rate for s in scheduled] == [0.05, 0.05]


def test_the_paper_rule_starts_at_the_minimum_and_grows_evenly_to_the_size():
    # Algorithm 1: S_i = S_0 + (S_e - S_0) i / (M - 1): 128 + 172 i / 3 = 128, 185.3, 242.7, 300 -> multiples of 8
    stages = progressive_schedule(4, 10, image_size=300, min_size=128, magnitude=15, rule="paper")
    assert [s.image_size for s in stages] == [128, 184, 240, 300]
    assert [s.epochs for s in stages] == [2, 3, 2, 3]  # the epochs and values are the official rule's
    np.testing.assert_allclose([s.magnitude for s in stages], np.linspace(5, 15, 4))


def test_stages_whose_sizes_coincide_are_merged_with_the_later_one_s_values():
    # official rule, 16 -> 32 px in 3 stages: 21.3, 26.7, 32 round to 24, 24, 32
    stages = progressive_schedule(3, 6, image_size=32, min_size=16, magnitude=15, mixup_alpha=0.4)
    assert [(s.number, s.first_epoch, s.epochs, s.image_size) for s in stages] == [(1, 1, 4, 24), (2, 5, 2, 32)]
    assert [(s.magnitude, s.mixup_alpha) for s in stages] == [(10, 0.2), (15, 0.4)]  # stage 2 of 3's, then the run's
    with pytest.raises(ValueError, match="every stage from 24 to 32 px rounds to 32 px"):
        progressive_schedule(2, 2, image_size=32, min_size=24, magnitude=15)  # 28 rounds to 32: nothing to grow


def fake_data(tmp_path, stored_size=32):
    return run.RunData(tmp_path, {}, stored_size=stored_size, num_train=1000, max_label=9, description="x")


def test_the_plan_computes_the_stages_and_its_line_lists_them(tmp_path):
    config = TrainConfig().replace(batch_size=64, epochs=4, image_size=32, progressive_stages=3,
                                   progressive_min_size=8, augment="randaugment", mixup_alpha=0.4,
                                   progressive_dropout=True, drop_rate=0.3)
    config, plan = run.resolve(config, fake_data(tmp_path))
    assert [(s.first_epoch, s.epochs, s.image_size) for s in plan.stages] == [(1, 1, 16), (2, 1, 24), (3, 2, 32)]
    line = plan.describe(config)
    assert ("progressive learning in 3 stages (official rule; size, RandAugment magnitude, mixup alpha, dropout; "
            "evaluation at 32px): "
            "1: epoch 1 at 16px m 5 mixup 0 dropout 0.1; 2: epoch 2 at 24px m 10 mixup 0.2 dropout 0.2; "
            "3: epochs 3-4 at 32px m 15 mixup 0.4 dropout 0.3") in line
    # without --progressive-min-size a small image starts from half its size: 16 + 16 (i + 1) / 3 -> 24, 24, 32,
    # the first two merged (the plan says so); the paper's rule from 16: 16, 24, 32
    config = config.replace(progressive_min_size=None)
    _, default = run.resolve(config, fake_data(tmp_path))
    assert [(s.first_epoch, s.image_size) for s in default.stages] == [(1, 24), (3, 32)]
    assert "progressive learning in 2 stages of 3 asked, those of one size merged" in default.describe(config)
    _, paper = run.resolve(config.replace(progressive_rule="paper"), fake_data(tmp_path))
    assert [s.image_size for s in paper.stages] == [16, 24, 32]
    assert run.resolve(config.replace(progressive_stages=0, progressive_min_size=None, progressive_dropout=False),
                       fake_data(tmp_path))[1].stages == ()


@pytest.mark.parametrize("changes, message", [
    ({"progressive_stages": 1}, "--progressive-stages 1: one stage is a fixed-size run"),
    ({"progressive_stages": -2}, "--progressive-stages -2: must be >= 0"),
    ({"epochs": 2}, "--epochs 2 cannot make --progressive-stages 3"),
    ({"steps": 30}, "--progressive-stages 3 needs --epochs, not --steps"),
    ({"progressive_min_size": 32}, "--progressive-min-size 32: must be at least 8 and smaller than --image-size 32"),
    ({"progressive_min_size": 4}, "--progressive-min-size 4: must be at least 8"),
    ({"image_size": 12}, "--image-size 12 is too small to grow into"),
    ({"progressive_stages": 0, "progressive_dropout": True}, "--progressive-dropout needs --progressive-stages"),
    ({"progressive_stages": 0, "progressive_min_size": 16}, "--progressive-min-size needs --progressive-stages"),
    ({"progressive_stages": 0, "progressive_rule": "paper"}, "--progressive-rule needs --progressive-stages"),
    ({"progressive_stages": 2, "progressive_min_size": 24},
     r"--progressive-stages 2 \(--progressive-min-size 24, --image-size 32\): every stage from 24 to 32 px rounds"),
    ({"randaugment_magnitude": 31}, r"--randaugment-magnitude 31: must be in \[0, 30\]"),
    ({"augment": "none", "randaugment_magnitude": 9}, "--randaugment-magnitude needs --augment"),
    ({"augment": "color-jitter", "randaugment_magnitude": 9}, "--randaugment-magnitude needs --augment .* with "
                                                              "--augment color-jitter nothing"),
    ({"augment": "randaugment", "color_jitter": 0.3}, "--color-jitter needs --augment color-jitter"),
])
def test_a_schedule_that_cannot_be_is_refused_by_flag(tmp_path, changes, message):
    config = TrainConfig().replace(**{"batch_size": 64, "epochs": 3, "image_size": 32, "progressive_stages": 3,
                                      "augment": "randaugment", **changes})
    with pytest.raises(ConfigError, match=message):
        run.check_config(config)  # as a run checks it, once, before resolve
        run.resolve(config, fake_data(tmp_path))


def test_a_refused_schedule_writes_nothing(sample, tmp_path):
    config = TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, batch_size=64, epochs=2,
                                   progressive_stages=3, image_size=32)
    with pytest.raises(ConfigError, match="--epochs 2 cannot make --progressive-stages 3"):
        run.train(config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("augment", ["none", "randaugment", "imgaug"])
def test_each_host_route_reads_an_epoch_at_its_stage_s_size(sample, tmp_path, augment):
    config = TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, batch_size=16, epochs=3, image_size=32,
                                   progressive_stages=3, progressive_min_size=8, augment=augment)
    data = run.open_data(config, sample.root)
    config, plan = run.resolve(config, data)
    for epoch, size in ((1, 16), (2, 24), (3, 32)):
        dataset = run.train_dataset(run.epoch_config(config, plan.stages, epoch), plan, data, epoch)
        try:
            batch = next(iter(dataset))
        finally:
            dataset.close()
        assert batch["image"].shape == (16, size, size, 3), (augment, epoch)


# --------------------------------------------------------------------------- a staged run
# 3 epochs of 3 steps, one stage each (16, 24, 32 px from the 16 px sample); checkpoints every 2 steps,
# so step 4's falls inside stage 2
STAGED = dict(model=TEST_MODEL, batch_size=64, epochs=3, steps_per_epoch=3, image_size=32, progressive_stages=3,
              progressive_min_size=8, mixup_alpha=0.4, progressive_dropout=True, checkpoint_every=2, log_every=1)


def staged_config(sample):
    return TrainConfig().replace(data_dir=sample.root, **STAGED)


@pytest.fixture(scope="module")
def staged_run(sample, tmp_path_factory):
    """A staged run, with the images each trace of the train step saw (a trace is what a compile starts from)."""
    traced = []
    original = steps_module.micro_step

    def recording(params, batch_stats, batch, *args, **kwargs):
        traced.append(batch["image"].shape)
        return original(params, batch_stats, batch, *args, **kwargs)

    out = tmp_path_factory.mktemp("staged") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(steps_module, "micro_step", recording)
        result = run.train(staged_config(sample), out, progress=False)
    return out, result, traced


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_rows_carry_the_stage_and_its_size_and_each_stage_compiles_once_at_its_size(staged_run):
    out, result, traced = staged_run
    per_device = 64 // jax.device_count()
    assert traced == [(per_device, s, s, 3) for s in (16, 24, 32)]  # one trace per stage, none per step
    assert [(r["stage"], r["image_size"]) for r in result.history] == [(1, 16), (2, 24), (3, 32)]
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["stage"], r["image_size"]) for r in rows] == [("1", "16"), ("2", "24"), ("3", "32")]
    report = json.loads((out / "metrics.json").read_text())
    assert sorted(report["stage_compile_s"]) == ["1", "2", "3"] and min(report["stage_compile_s"].values()) > 0
    assert [row["image_size"] for row in report["history"]] == [16, 24, 32]
    assert [s["image_size"] for s in json.loads((out / "config.json").read_text())["plan"]["stages"]] == [16, 24, 32]


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_tensorboard_gets_the_stage_and_image_size(staged_run):
    from kaggle_utils.data import tensorflow_on_host

    out, _, _ = staged_run
    tf = tensorflow_on_host()
    seen = {}
    for event_file in (out / "tensorboard").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            for value in event.summary.value:
                seen.setdefault(value.tag, {})[event.step] = value.simple_value
    assert seen["image_size"] == {1: 16, 2: 16, 3: 16, 4: 24, 5: 24, 6: 24, 7: 32, 8: 32, 9: 32}
    assert seen["stage"] == {step: (step - 1) // 3 + 1 for step in range(1, 10)}


class Killed(Exception):
    pass


class KillAfterStep:
    """Dies at the log of ``step``: after the checkpoint of the step before it, as a SIGKILL would leave it."""

    def __init__(self, step):
        self.step = step

    def on_log(self, step, scalars):
        if step == self.step:
            raise Killed(step)


def comparable(history):
    return [{k: v for k, v in row.items() if k not in ("img_per_s", "seconds")} for row in history]


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_killed_mid_stage_then_resumed_ends_like_the_uninterrupted_run(staged_run, sample, tmp_path):
    full, uninterrupted, _ = staged_run
    out = tmp_path / "run"
    with pytest.raises(Killed):
        run.train(staged_config(sample), out, hooks=[KillAfterStep(5)], progress=False)
    assert json.loads((out / "last.json").read_text())["step"] == 4  # mid epoch 2, mid stage 2
    resumed = run.train(staged_config(sample), out, resume=True, progress=False)
    assert comparable(resumed.history) == comparable(uninterrupted.history)
    report = json.loads((out / "metrics.json").read_text())
    assert sorted(report["stage_compile_s"]) == ["2", "3"]  # the stages this process compiled
    states = [checkpoint.load(d / "last.msgpack")["state"] for d in (full, out)]
    for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1]), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_cross_validation_trains_a_fold_in_stages(sample, tmp_path):
    result = run.cross_validate(staged_config(sample), tmp_path / "cv", folds=2, only_folds=[0], progress=False)
    assert sorted(result.trained) == [0] and result.remaining == (1,)  # one fold is enough: each is a run.train
    assert [(r["stage"], r["image_size"]) for r in result.trained[0].history] == [(1, 16), (2, 24), (3, 32)]
    assert (tmp_path / "cv" / "fold0" / "oof.csv").is_file()
