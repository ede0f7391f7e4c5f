"""Classification metrics from confusion counts: accuracy, per-class and macro F1.

One ``[C, C]`` count matrix (rows: true class) adds up exactly across batches, devices and hosts, so a split's
macro F1 is exact however it was batched. Macro F1 is scikit-learn's ``f1_score(average="macro")``; a multi-label
row's F1 (averaged over rows: the sample F1 of Kaggle's multi-label competitions) is 1 where the row has no class
and none is predicted (scikit-learn's ``average="samples", zero_division=1``).
"""
import jax
import jax.numpy as jnp
import numpy as np


def confusion_counts(labels: jax.Array, preds: jax.Array, num_classes: int, mask: jax.Array) -> jax.Array:
    """int32 ``[C, C]`` counts of (label, prediction) pairs where ``mask`` is True (jnp)."""
    true = jax.nn.one_hot(labels, num_classes, dtype=jnp.int32) * mask[:, None].astype(jnp.int32)
    pred = jax.nn.one_hot(preds, num_classes, dtype=jnp.int32)
    return true.T @ pred


def confusion_matrix(labels, preds, num_classes: int, mask=None) -> np.ndarray:
    """int64 ``[C, C]`` counts (numpy); rejects labels or predictions outside ``[0, C)``."""
    labels, preds = np.asarray(labels).ravel(), np.asarray(preds).ravel()
    if mask is not None:
        keep = np.asarray(mask, bool).ravel()
        labels, preds = labels[keep], preds[keep]
    for name, v in (("label", labels), ("prediction", preds)):
        if v.size and (v.min() < 0 or v.max() >= num_classes):
            raise ValueError(f"{name} {int(v.min() if v.min() < 0 else v.max())} outside [0, {num_classes})")
    counts = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(counts, (labels, preds), 1)
    return counts


def accuracy(confusion) -> float:
    confusion = np.asarray(confusion)
    total = confusion.sum()
    return float(np.trace(confusion) / total) if total else float("nan")


def class_scores(tp, fp, fn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class precision TP / (TP + FP), recall TP / (TP + FN) and F1 2 TP / (2 TP + FP + FN); 0 where the
    denominator is 0 (scikit-learn's ``zero_division=0``), so a class never predicted reads as 0, not as missing."""
    tp, fp, fn = (np.asarray(v, np.float64) for v in (tp, fp, fn))
    ratio = lambda num, den: np.divide(num, den, out=np.zeros_like(num), where=den > 0)  # noqa: E731
    return ratio(tp, tp + fp), ratio(tp, tp + fn), ratio(2 * tp, 2 * tp + fp + fn)


def confusion_scores(confusion) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`class_scores` of each class of a ``[C, C]`` confusion matrix."""
    confusion = np.asarray(confusion, np.float64)
    tp = np.diag(confusion)
    return class_scores(tp, confusion.sum(0) - tp, confusion.sum(1) - tp)


def per_class_f1(confusion) -> np.ndarray:
    """F1 of each class; 0 where the class never occurs."""
    return confusion_scores(confusion)[2]


def macro_f1(confusion) -> float:
    """Mean F1 over the classes present as a label or a prediction (scikit-learn's rule)."""
    confusion = np.asarray(confusion)
    present = (confusion.sum(0) + confusion.sum(1)) > 0
    return float(per_class_f1(confusion)[present].mean()) if present.any() else float("nan")


def multilabel_f1(tp, fp, fn) -> tuple[float, float]:
    """(macro F1 over the classes present as a label or a prediction, micro F1) of per-class multi-label counts."""
    tp, fp, fn = (np.asarray(v, np.float64) for v in (tp, fp, fn))
    present = 2 * tp + fp + fn > 0
    macro = float(class_scores(tp, fp, fn)[2][present].mean()) if present.any() else float("nan")
    total = (2 * tp + fp + fn).sum()
    return macro, float(2 * tp.sum() / total) if total else float("nan")


def row_f1(tp, fp, fn):
    """F1 of each multi-label row from its counts (jnp or numpy): 1 for a row with no class and no prediction."""
    den = 2 * tp + fp + fn
    return (2 * tp + (den == 0)) / (den + (den == 0))


def multilabel_scores(predicted, labels) -> dict[str, float]:
    """Exact-match ``acc``, macro ``f1``, ``micro_f1`` and ``samples_f1`` of bool decisions ``[N, C]`` against multi-hot
    ``labels``."""
    predicted, truth = np.asarray(predicted, bool), np.asarray(labels) > 0.5
    tp, fp, fn = (predicted & truth), (predicted & ~truth), (~predicted & truth)
    macro, micro = multilabel_f1(tp.sum(0), fp.sum(0), fn.sum(0))
    rows = row_f1(tp.sum(1).astype(np.float64), fp.sum(1), fn.sum(1))
    return {"acc": float(np.all(predicted == truth, 1).mean()), "f1": macro, "micro_f1": micro,
            "samples_f1": float(rows.mean())}
