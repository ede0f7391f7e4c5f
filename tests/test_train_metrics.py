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
