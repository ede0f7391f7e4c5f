"""Multi-label decisions (issue 49): per-class thresholds, the least classes per row, sample F1.

Expected values come from scikit-learn's ``f1_score`` and from brute force over the candidates, not from the
functions under test; the job's use of them (learnt on the validation split, saved, used by predict, overridden by
``--threshold``) is checked in tests/test_multilabel.py.
"""
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import f1_score

from kaggle_utils.config import TaskConfig
from kaggle_utils.metrics import multilabel_scores
from kaggle_utils.run import thresholds
from kaggle_utils.train import make_task


@pytest.fixture(scope="module")
def held_out():
    """Probabilities of 4 classes for 300 rows, each class with its own scale (so their best thresholds differ)."""
    rng = np.random.default_rng(0)
    labels = rng.random((300, 4)) < [0.5, 0.3, 0.1, 0.2]
    labels[~labels.any(1), 0] = True
    shift = np.array([0.0, -0.25, -0.4, 0.2])
    probs = np.clip(0.5 + shift + np.where(labels, 0.2, -0.2) + rng.normal(0, 0.15, labels.shape), 0.001, 0.999)
    return probs, labels


def test_each_class_gets_the_threshold_of_its_best_f1(held_out):
    probs, labels = held_out
    chosen = thresholds.learn_thresholds(probs, labels)
    for c in range(4):
        by_candidate = [f1_score(labels[:, c], probs[:, c] > t, zero_division=0) for t in thresholds.CANDIDATES]
        assert f1_score(labels[:, c], probs[:, c] > chosen[c]) == pytest.approx(max(by_candidate))
    assert chosen[2] < 0.35 < 0.55 < chosen[3]  # the shifted classes move their thresholds
    assert multilabel_scores(probs > chosen, labels)["f1"] > multilabel_scores(probs > 0.5, labels)["f1"] + 0.05


def test_a_class_with_no_positive_keeps_the_default():
    probs = np.array([[0.9, 0.2], [0.1, 0.7], [0.8, 0.6]])
    labels = np.array([[1, 0], [0, 0], [1, 0]])
    assert thresholds.learn_thresholds(probs, labels)[1] == thresholds.DEFAULT


def test_min_labels_fills_a_row_with_its_most_probable_classes_and_never_leaves_one_empty(held_out):
    probs, _ = held_out
    high = np.full(4, 0.97)  # almost nothing passes
    assert (~thresholds.decide(probs, high).any(1)).sum() > 250
    one = thresholds.decide(probs, high, min_labels=1)
    assert one.sum(1).min() == 1 and np.array_equal(one.argmax(1), probs.argmax(1))
    two = thresholds.decide(probs, high, min_labels=2)
    order = np.argsort(-probs, axis=1)
    assert np.array_equal(np.sort(np.flatnonzero(two[5])), np.sort(order[5, :2]))
    passing = thresholds.decide(probs, 0.3, min_labels=1)  # rows with enough classes keep them all
    assert np.array_equal(passing[(probs > 0.3).any(1)], (probs > 0.3)[(probs > 0.3).any(1)])


def test_sample_f1_is_scikit_learns_with_an_empty_row_right_when_nothing_is_true():
    truth = np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1]], bool)
    chosen = np.array([[1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1]], bool)
    scores = multilabel_scores(chosen, truth)
    assert scores["samples_f1"] == pytest.approx(f1_score(truth, chosen, average="samples", zero_division=1))
    assert scores["f1"] == pytest.approx(f1_score(truth, chosen, average="macro", zero_division=0))
    assert scores["acc"] == 0.5

    # the step's sums: exact over batches, masked rows left out
    task = make_task(TaskConfig(task="multilabel", threshold=0.5, label_smoothing=0.0))
    logits = jnp.where(jnp.asarray(np.vstack([chosen, [[1, 1, 1]]])), 3.0, -3.0)
    labels = jnp.asarray(np.vstack([truth, [[0, 0, 0]]]), jnp.float32)
    sums = task.metric_sums(logits, labels, jnp.array([True] * 4 + [False]), full=True)
    assert task.finish(sums)["samples_f1"] == pytest.approx(scores["samples_f1"])
