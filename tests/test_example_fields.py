"""Per-example fields (issue 47): a record's own values beyond image and label (a teacher's probabilities, a weight,
a soft label) reach the task's loss intact through the pipeline, padding, sharding (pmap and jit + shard_map),
micro-batching and mixing; and the distilled loss is the soft-target loss written out by hand."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kaggle_utils import data as kd
from kaggle_utils.config import OptimConfig
from kaggle_utils.data import ExampleFields, load_dataset
from kaggle_utils.data.tfrecords import BadRecordError
from kaggle_utils.device_augment import MixConfig, mix
from kaggle_utils.parallel import make_mesh
from kaggle_utils.train import (MultiLabelClassification, SoftmaxClassification, StepConfig, init_variables,
                                make_optimizer, make_steps)
from train_helpers import TinyCNN

CLASSES = 16


@dataclasses.dataclass(frozen=True)
class Probe(SoftmaxClassification):
    """A task whose per-example loss is made of its fields only: which row of ``code`` reached which label."""

    def fields(self):
        return ("label", "code")

    def targets(self, batch, num_classes):
        return {"label": jax.nn.one_hot(batch["label"], num_classes), "code": batch["code"]}

    def example_losses(self, logits, targets):
        # row i's code holds i + 1 at its own label's column and 1000 x that elsewhere: the sum over the real rows
        # is sum(i + 1) only if every code row met its own label row
        return 0.0 * logits.sum(-1) + jnp.sum(targets["code"] * targets["label"], axis=-1)


@dataclasses.dataclass(frozen=True)
class MixProbe(Probe):
    """Mixed like the targets: ``code`` (a copy of the one-hot label) must still equal the mixed label row."""

    def example_losses(self, logits, targets):
        unequal = 1000.0 * jnp.sum((targets["code"] - targets["label"]) ** 2, axis=-1)
        return 0.0 * logits.sum(-1) + unequal + (1.0 - jnp.max(targets["label"], axis=-1))  # the second: mixed?


def probe_batch(size=16, real=13):
    labels = np.arange(size, dtype=np.int32) % CLASSES
    code = np.where(np.eye(CLASSES, dtype=bool)[labels], 1.0, 1000.0) * (np.arange(size)[:, None] + 1.0)
    mask = np.arange(size) < real  # the last rows are padding: they never count
    images = np.random.default_rng(0).integers(0, 256, (size, 8, 8, 3), np.uint8)
    return {"image": images, "label": labels, "code": code.astype(np.float32), "mask": mask}


@pytest.fixture(scope="module")
def variables():
    return init_variables(TinyCNN(num_classes=CLASSES), 8)


def loss_sum(task, variables, batch, *, mode="jit", accumulate=1, mixing=None, devices=None):
    config = StepConfig(num_classes=CLASSES, task=task, optim=OptimConfig(accumulate_steps=accumulate), mix=mixing)
    steps = make_steps(TinyCNN(num_classes=CLASSES), make_optimizer(0.0), config, mode=mode,
                       mesh=make_mesh(jax.devices()[:devices] if devices else None))
    _, metrics = steps.train(steps.put_state(steps.init_state(variables)), steps.put_batch(batch))
    return float(steps.get(metrics)["task"]["loss_sum"])


@pytest.mark.parametrize("mode", ["pmap", "jit"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_field_reaches_the_loss_row_by_row_under_pmap_and_shard_map_and_micro_batches(variables, mode,
                                                                                          accumulate):
    """8 devices, 2 rows each, padding in the last device; micro-batches of one row."""
    assert loss_sum(Probe(), variables, probe_batch(), mode=mode, accumulate=accumulate) == sum(range(1, 14))


def test_a_field_is_mixed_with_the_same_partner_and_lambda_as_the_labels(variables):
    batch = probe_batch()
    batch["code"] = np.eye(CLASSES, dtype=np.float32)[batch["label"]]
    mixing = functools.partial(mix, config=MixConfig(CLASSES, mixup_alpha=1.0, cutmix_alpha=1.0, label_smoothing=0.0))
    total = loss_sum(MixProbe(), variables, batch, mixing=mixing)
    assert 0.0 < total < 13 * 0.5  # equal rows everywhere (else >= 1000), and mixed (else exactly 0)


def test_mix_blends_every_field_of_a_mapping_as_it_blends_the_label_rows():
    key, images = jax.random.key(3), jnp.asarray(np.random.default_rng(1).normal(size=(6, 8, 8, 3)), jnp.float32)
    labels = jnp.arange(6) % 4
    config = MixConfig(4, mixup_alpha=0.5, label_smoothing=0.0, mode="elem")
    mixed_images, alone = mix(key, images, labels, jnp.ones(6, bool), config)
    rows = jax.nn.one_hot(labels, 4)
    same_images, fields = mix(key, images, {"label": rows, "teacher": 2 * rows, "weight": jnp.arange(6.0)},
                              jnp.ones(6, bool), config)
    np.testing.assert_array_equal(same_images, mixed_images)
    np.testing.assert_allclose(fields["label"], alone, atol=1e-6)
    np.testing.assert_allclose(fields["teacher"], 2 * alone, atol=1e-6)
    lam = alone[jnp.arange(6), labels]  # each row's own share (distinct partners' labels)
    partner = 5 - np.arange(6)
    np.testing.assert_allclose(fields["weight"], lam * np.arange(6) + (1 - lam) * partner, atol=1e-5)


def test_the_distilled_loss_is_the_soft_target_loss_written_out_by_hand(variables):
    """alpha x teacher + (1 - alpha) x smoothed label at T = 1; at T = 2 Hinton's (1 - a) CE + a T^2 CE(s / T, p_T);
    a weight multiplies each row."""
    rng = np.random.default_rng(5)
    batch = probe_batch()
    del batch["code"]
    teacher = rng.dirichlet(np.ones(CLASSES), size=16).astype(np.float32)
    weight = rng.uniform(0.5, 2.0, 16).astype(np.float32)
    model = TinyCNN(num_classes=CLASSES)
    # the model's training forward, as the step runs it (dropout off: TinyCNN's default), on one device
    logits = np.asarray(model.apply(variables, (batch["image"] / 255.0 - 0.5) / 0.5, mutable=["batch_stats"])[0],
                        np.float64)
    log_p = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(
        1, keepdims=True)
    smoothed = np.eye(CLASSES)[batch["label"]] * 0.9 + 0.1 / CLASSES
    real = batch["mask"]
    for temperature in (1.0, 2.0):
        task = SoftmaxClassification(label_smoothing=0.1).with_teacher(0.7, temperature)
        got = loss_sum(task, variables, {**batch, "teacher": teacher, "weight": weight}, devices=1)  # BN: all rows
        if temperature == 1.0:
            per_row = -np.sum((0.7 * teacher + 0.3 * smoothed) * log_p, axis=1)
        else:
            scaled = logits / temperature
            log_q = scaled - scaled.max(1, keepdims=True)
            log_q -= np.log(np.exp(log_q).sum(1, keepdims=True))
            soft = teacher ** (1 / temperature) / np.sum(teacher ** (1 / temperature), axis=1, keepdims=True)
            per_row = 0.3 * -np.sum(smoothed * log_p, 1) + 0.7 * temperature ** 2 * -np.sum(soft * log_q, 1)
        np.testing.assert_allclose(got, np.sum((per_row * weight)[real]), rtol=2e-5)


def test_a_multi_label_student_learns_a_teacher_s_sigmoid_probabilities_as_soft_targets(variables):
    rng = np.random.default_rng(6)
    batch = probe_batch()
    del batch["code"]
    batch["label"] = (rng.uniform(size=(16, CLASSES)) < 0.3).astype(np.float32)
    teacher = rng.uniform(size=(16, CLASSES)).astype(np.float32)
    model = TinyCNN(num_classes=CLASSES)
    logits = np.asarray(model.apply(variables, (batch["image"] / 255.0 - 0.5) / 0.5, mutable=["batch_stats"])[0],
                        np.float64)
    target = 0.4 * teacher + 0.6 * batch["label"]  # no smoothing
    bce = np.maximum(logits, 0) - logits * target + np.log1p(np.exp(-np.abs(logits)))
    task = MultiLabelClassification().with_teacher(0.4)
    got = loss_sum(task, variables, {**batch, "teacher": teacher}, devices=1)
    np.testing.assert_allclose(got, bce.mean(1)[batch["mask"]].sum(), rtol=2e-5)


def test_a_task_that_reads_a_field_the_batch_lacks_says_so(variables):
    batch = probe_batch()
    del batch["code"]
    with pytest.raises(KeyError, match="SoftmaxClassification reads the batch field\\(s\\) teacher; the batch has "
                                       "label .*--teacher"):
        loss_sum(SoftmaxClassification().with_teacher(0.5), variables, batch)


# --------------------------------------------------------------------------- the pipeline


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    return kd.make_sample_dataset(tmp_path_factory.mktemp("fields"), image_size=8, num_examples=60,
                                  num_files=(2, 1, 2))


def test_fields_join_their_records_through_the_pipeline_and_its_padding(records):
    index = kd.tfrecords.scan_records(kd.list_tfrecords(records.split_dirs["train"]))
    teacher = np.random.default_rng(2).dirichlet(np.ones(10), size=len(index)).astype(np.float32)
    fields = ExampleFields.for_records(index.pairs(), {"teacher": teacher, "weight": np.arange(len(index),
                                                                                                 dtype=np.float32)})
    row_of = {f"{f}#{i}": r for r, (f, i) in enumerate(index.pairs())}
    dataset = load_dataset(records.split_dirs["train"], image_size=8, batch_size=16, fields=fields, with_records=True)
    seen = 0
    for batch in dataset:  # in order, the last batch padded
        rows = [row_of[r.decode()] for r, real in zip(batch["record"], batch["mask"]) if real]
        real = batch["mask"]
        np.testing.assert_array_equal(batch["teacher"][real], teacher[rows])
        np.testing.assert_array_equal(batch["weight"][real], np.arange(len(index))[rows])
        np.testing.assert_array_equal(batch["label"][real], index.labels[rows])
        assert batch["teacher"].dtype == np.float32 and not batch["teacher"][~real].any()
        seen += int(real.sum())
    assert seen == len(index) and len(index) % 16  # a padded last batch was read


def test_a_row_s_label_replaces_the_record_s_and_a_test_record_trains_on_it(records):
    train = kd.tfrecords.scan_records(kd.list_tfrecords(records.split_dirs["train"]))
    test = kd.tfrecords.scan_records(kd.list_tfrecords(records.split_dirs["test"]))
    pairs = train.pairs() + test.pairs()
    soft = np.random.default_rng(4).dirichlet(np.ones(10), size=len(pairs)).astype(np.float32)
    given = np.arange(len(pairs)) >= len(train)  # the test records: their labels come from the rows
    fields = ExampleFields.for_records(pairs, {"label": soft}, label_rows=given)
    files = kd.list_tfrecords(records.split_dirs["train"]) + kd.list_tfrecords(records.split_dirs["test"])
    row_of = {f"{f}#{i}": r for r, (f, i) in enumerate(pairs)}
    got = {}
    for batch in load_dataset(files, image_size=8, batch_size=8, fields=fields, with_records=True):
        for record, label, real in zip(batch["record"], batch["label"], batch["mask"]):
            if real:
                got[row_of[record.decode()]] = label
    assert sorted(got) == list(range(len(pairs)))
    for row, label in got.items():
        want = soft[row] if given[row] else np.eye(10)[train.labels[row]]
        np.testing.assert_allclose(label, want, atol=1e-7)


def test_a_record_without_a_row_is_a_bad_record_named(records):
    index = kd.tfrecords.scan_records(kd.list_tfrecords(records.split_dirs["train"]))
    fields = ExampleFields.for_records(index.pairs()[1:], {"weight": np.ones(len(index) - 1, np.float32)})
    with pytest.raises(BadRecordError, match=r"record 0: no row for this record in the fields given"):
        for _ in load_dataset(records.split_dirs["train"], image_size=8, batch_size=16, fields=fields):
            pass
