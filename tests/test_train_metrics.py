"""Metrics from confusion counts agree with scikit-learn, on device and on host."""
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import accuracy_score, confusion_matrix as sk_confusion, f1_score

from kaggle_utils import metrics


@pytest.fixture
def predictions():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 6, 300)
    preds = np.where(rng.random(300) < 0.6, labels, rng.integers(0, 6, 300))
    preds[preds == 5] = 4  # class 5 is never predicted: its F1 is 0, and it still counts
    labels[labels == 3] = 2  # class 3 never occurs as a label but is predicted
    return labels, preds


def test_confusion_matrix_matches_sklearn(predictions):
    labels, preds = predictions
    counts = metrics.confusion_matrix(labels, preds, 6)
    np.testing.assert_array_equal(counts, sk_confusion(labels, preds, labels=range(6)))


def test_device_confusion_counts_skip_masked_rows(predictions):
    labels, preds = predictions
    mask = np.arange(300) % 3 != 0
    counts = np.asarray(metrics.confusion_counts(jnp.asarray(labels), jnp.asarray(preds), 6, jnp.asarray(mask)))
    np.testing.assert_array_equal(counts, sk_confusion(labels[mask], preds[mask], labels=range(6)))
    np.testing.assert_array_equal(counts, metrics.confusion_matrix(labels, preds, 6, mask=mask))


def test_accuracy_and_f1_match_sklearn(predictions):
    labels, preds = predictions
    counts = metrics.confusion_matrix(labels, preds, 8)  # classes 6, 7 absent everywhere: left out
    assert metrics.accuracy(counts) == pytest.approx(accuracy_score(labels, preds))
    assert metrics.macro_f1(counts) == pytest.approx(f1_score(labels, preds, average="macro"))
    np.testing.assert_allclose(metrics.per_class_f1(counts)[:6],
                               f1_score(labels, preds, average=None, labels=range(6), zero_division=0))


def test_out_of_range_labels_are_rejected():
    with pytest.raises(ValueError, match="label 7 outside"):
        metrics.confusion_matrix([0, 7], [0, 1], 5)


def test_each_metric_declares_which_way_is_better():
    from kaggle_utils.train import MultiLabelClassification, SoftmaxClassification

    task = SoftmaxClassification().with_metric("error", lambda s: 0.0, mode="min").with_metric("score", lambda s: 1.0)
    columns = ("train_loss", "val_loss", "val_acc", "val_f1", "val_top5", "val_error", "val_score")
    assert [task.mode(c) for c in columns] == ["min", "min", "max", "max", "max", "min", "max"]
    assert MultiLabelClassification().mode("val_micro_f1") == "max" and MultiLabelClassification().mode("val_loss") == "min"
    with pytest.raises(ValueError, match="mode must be min or max"):
        task.with_metric("other", lambda s: 0.0, mode="lower")


@pytest.mark.parametrize("kind", ["softmax", "multilabel"])
def test_saved_probabilities_score_as_the_logits_they_came_from(kind):
    """CV scores its out-of-fold probabilities with the task's own metrics, through ``task.logits``."""
    from kaggle_utils.train import MultiLabelClassification, SoftmaxClassification

    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(64, 7)) * 3, jnp.float32)
    if kind == "softmax":
        task, labels = SoftmaxClassification(), jnp.asarray(rng.integers(0, 7, 64))
    else:
        task, labels = MultiLabelClassification(threshold=0.3), jnp.asarray(rng.random((64, 7)) < 0.3, jnp.float32)
    mask = jnp.ones(64, bool)
    direct = task.finish(task.metric_sums(logits, labels, mask, full=True))
    saved = np.asarray(task.probabilities(logits))  # as oof.csv holds them
    again = task.finish(task.metric_sums(task.logits(jnp.asarray(saved)), labels, mask, full=True))
    assert direct.keys() == again.keys() and len(direct) >= 4
    for name in direct:
        assert again[name] == pytest.approx(direct[name], rel=1e-4, abs=1e-6), name
