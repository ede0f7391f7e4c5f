"""Tasks: what a step optimises and what a split is scored by, kept out of the step itself.

A task reads the batch's fields it declares (:meth:`Task.fields`: ``label``; with a teacher, ``teacher``; a
``weight`` where the batch has one) into per-example targets (``targets``, each ``[B, ...]``, blended alike by
Mixup / CutMix), gives a per-example loss of them (``example_losses``), and scores a split in two halves:
``metric_sums`` in the jitted step (*sums* over real examples, exact across batches, devices and hosts: a mean of
per-batch F1 scores is not the split's F1) and ``finish`` on the host. Metrics read the labels, never the teacher.
"""
import dataclasses
import math
from typing import Callable, ClassVar, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..config import TaskConfig
from ..metrics import confusion_counts, macro_f1, multilabel_f1, row_f1
from ..registry import TASKS

UserMetric = Callable[[Mapping[str, np.ndarray]], float]


class MetricError(RuntimeError):
    """A user metric raised or returned something that is not a number; the message names it."""


def _sums(loss: jax.Array, correct: jax.Array, mask: jax.Array) -> dict:
    """The sums every task keeps: of the real rows' losses, correct rows and real rows."""
    return {"loss_sum": jnp.sum(jnp.where(mask, loss, 0.0)), "correct": jnp.sum(correct & mask, dtype=jnp.int32),
            "count": jnp.sum(mask, dtype=jnp.int32)}


def _ratio(value, count: int) -> float:
    return float(value) / count if count else float("nan")


@dataclasses.dataclass(frozen=True)
class Task:
    """Base of the built-in tasks. Frozen and hashable: a task is part of the compiled step."""

    label_smoothing: float = 0.0
    user_metrics: tuple[tuple[str, UserMetric, str], ...] = ()  # (name, fn, "max" | "min": which way is better)
    distill_alpha: float = 0.0  # > 0: the loss learns the batch's ``teacher`` probabilities with this weight
    distill_temperature: float = 1.0  # both sides' logits divided by it (Hinton et al.), the teacher term x T^2
    minimized: ClassVar[tuple[str, ...]] = ("loss",)  # the built-in metrics where lower is better

    # ---- on the device
    def fields(self) -> tuple[str, ...]:
        """The batch fields the loss needs (a ``weight`` field, where a batch has one, weighs each example)."""
        return ("label", "teacher") if self.distill_alpha else ("label",)

    def targets(self, batch: Mapping[str, jax.Array], num_classes: int) -> dict[str, jax.Array]:
        """The per-example targets of a batch's fields: ``label`` (integer ``[B]`` or float rows ``[B, C]``) smoothed
        by timm's rule (off = smoothing / C, on = 1 - smoothing + off: a soft row stays a sum of 1), the ``teacher``'s
        probabilities at the temperature, a ``weight`` as it is."""
        missing = [name for name in self.fields() if name not in batch]
        if missing:
            raise KeyError(f"{type(self).__name__} reads the batch field(s) {', '.join(missing)}; the batch has "
                           f"{', '.join(sorted(batch))}" + (" (a teacher's: see --teacher)" if "teacher" in missing
                                                            else ""))
        targets, smoothing = self._unsmoothed(batch["label"], num_classes), self.label_smoothing
        out = {"label": targets * (1.0 - smoothing) + smoothing / targets.shape[-1] if smoothing else targets}
        if self.distill_alpha:
            teacher = batch["teacher"].astype(jnp.float32)
            t = self.distill_temperature
            out["teacher"] = teacher if t == 1.0 else self.probabilities(self.logits(teacher) / t)
        if "weight" in batch:
            out["weight"] = batch["weight"].astype(jnp.float32)
        return out

    def example_losses(self, logits: jax.Array, targets: Mapping[str, jax.Array]) -> jax.Array:
        """Per-example loss ``[B]`` of :meth:`targets` (mixed, where the batch was): the label's, with a teacher
        ``(1 - alpha) x`` that ``+ alpha x T^2 x`` the loss of ``logits / T`` against the teacher's (at T = 1, the
        loss of the soft targets ``alpha x teacher + (1 - alpha) x label``: every built-in loss is linear in them),
        times the ``weight``."""
        losses = self.loss(logits, targets["label"])
        if self.distill_alpha:
            alpha, t = self.distill_alpha, self.distill_temperature
            losses = (1.0 - alpha) * losses + alpha * t * t * self.loss(logits / t, targets["teacher"])
        return losses * targets["weight"] if "weight" in targets else losses

    def with_teacher(self, alpha: float, temperature: float = 1.0) -> "Task":
        """A copy that also learns a ``teacher`` field (its probabilities ``[B, C]``) with weight ``alpha``."""
        if not (0.0 < alpha <= 1.0 and temperature > 0):
            raise ValueError(f"a teacher needs 0 < alpha <= 1 and temperature > 0, got {alpha} and {temperature}")
        return dataclasses.replace(self, distill_alpha=float(alpha), distill_temperature=float(temperature))

    def _unsmoothed(self, labels: jax.Array, num_classes: int) -> jax.Array:
        if labels.ndim == 1:
            return jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
        return labels.astype(jnp.float32)

    def loss(self, logits: jax.Array, targets: jax.Array) -> jax.Array:
        """Per-example loss ``[B]`` of fp32 logits against float targets."""
        raise NotImplementedError

    def probabilities(self, logits: jax.Array) -> jax.Array:
        raise NotImplementedError

    def logits(self, probabilities: jax.Array) -> jax.Array:
        """Logits whose :meth:`probabilities` these are: saved probabilities scored by the task's own metrics."""
        raise NotImplementedError

    def metric_sums(self, logits: jax.Array, labels: jax.Array, mask: jax.Array, *, full: bool,
                    losses: jax.Array | None = None) -> dict:
        """Summed statistics of one batch's real rows; ``full`` (evaluation) adds the costly ones. ``losses``: the
        train step's own (smoothed or mixed targets); without them the loss is against the unsmoothed ``labels``,
        so validation losses compare across smoothing settings."""
        raise NotImplementedError

    def _losses(self, logits, labels, losses):
        return self.loss(logits, self._unsmoothed(labels, logits.shape[-1])) if losses is None else losses

    # ---- on the host
    def finish(self, sums: Mapping[str, np.ndarray], *, full: bool = True) -> dict[str, float]:
        """Scalar metrics from summed statistics; user metrics after evaluations (``full``) only."""
        out = self._finish(sums)
        for name, fn, _ in self.user_metrics if full else ():
            try:
                value = float(fn(sums))
            except Exception as err:
                raise MetricError(f"metric {name!r} ({getattr(fn, '__name__', fn)}) raised "
                                  f"{type(err).__name__}: {err} (it gets the summed statistics "
                                  f"{sorted(sums)})") from err
            out[name] = value
        return out

    def _finish(self, sums: Mapping[str, np.ndarray]) -> dict[str, float]:
        count = int(sums["count"])
        return {"loss": _ratio(sums["loss_sum"], count), "acc": _ratio(sums["correct"], count)}

    def metric_names(self, *, full: bool) -> tuple[str, ...]:
        """The names :meth:`finish` produces for a train window (``full=False``) or an evaluation."""
        names = self._metric_names(full)
        return names + tuple(name for name, _, _ in self.user_metrics) if full else names

    def _metric_names(self, full: bool) -> tuple[str, ...]:
        raise NotImplementedError

    def with_metric(self, name: str, fn: UserMetric, *, mode: str = "max") -> "Task":
        """A copy that also reports ``fn(sums)`` as ``name`` after every evaluation; ``mode="min"``: lower is better."""
        if not name.isidentifier():
            raise ValueError(f"metric name {name!r} must be a plain identifier (it becomes the column val_{name})")
        if name in self.metric_names(full=True):
            raise ValueError(f"metric {name!r} already exists in {type(self).__name__}")
        if mode not in ("min", "max"):
            raise ValueError(f"metric {name!r}: mode must be min or max, got {mode!r}")
        return dataclasses.replace(self, user_metrics=self.user_metrics + ((name, fn, mode),))

    def mode(self, column: str) -> str:
        """``"min"`` where lower is better for a history column (``val_loss``), else ``"max"``, as its metric says."""
        name = column.split("_", 1)[1] if column.startswith(("train_", "val_")) else column
        lower = self.minimized + tuple(metric for metric, _, mode in self.user_metrics if mode == "min")
        return "min" if name in lower else "max"


@dataclasses.dataclass(frozen=True)
class SoftmaxClassification(Task):
    """One class per image: softmax cross-entropy; accuracy, top-5 and macro F1 (the flower metric)."""

    top_k: int = 5

    def loss(self, logits, targets):
        return optax.softmax_cross_entropy(logits, targets)

    def probabilities(self, logits):
        return jax.nn.softmax(logits)

    def logits(self, probabilities):
        return jnp.log(jnp.maximum(probabilities, jnp.finfo(jnp.float32).tiny))

    def metric_sums(self, logits, labels, mask, *, full, losses=None):
        num_classes = logits.shape[-1]
        hard = labels if labels.ndim == 1 else jnp.argmax(labels, -1)  # mixed rows count as their main label
        preds = jnp.argmax(logits, -1)
        sums = _sums(self._losses(logits, labels, losses), preds == hard, mask)
        if full:
            if num_classes > self.top_k:  # the label among the k largest logits (ties count in its favour)
                label_logit = jnp.take_along_axis(logits, hard[:, None], axis=-1)
                top = jnp.sum(logits > label_logit, axis=-1) < self.top_k
                sums["top_k_correct"] = jnp.sum(top & mask, dtype=jnp.int32)
            sums["confusion"] = confusion_counts(hard, preds, num_classes, mask)
        return sums

    def _finish(self, sums):
        out = super()._finish(sums)
        if "top_k_correct" in sums:
            out[f"top{self.top_k}"] = _ratio(sums["top_k_correct"], int(sums["count"]))
        if "confusion" in sums:
            out["f1"] = macro_f1(sums["confusion"])
        return out

    def _metric_names(self, full):
        return ("loss", "acc", f"top{self.top_k}", "f1") if full else ("loss", "acc")


@dataclasses.dataclass(frozen=True)
class FocalClassification(SoftmaxClassification):
    """Softmax focal loss (Lin et al.): ``-sum t (1 - p)^gamma log p``; gamma 0 is cross-entropy."""

    gamma: float = 2.0

    def loss(self, logits, targets):
        log_p = jax.nn.log_softmax(logits)
        weight = (1.0 - jnp.exp(log_p)) ** self.gamma
        return -jnp.sum(targets * weight * log_p, axis=-1)


@dataclasses.dataclass(frozen=True)
class MultiLabelClassification(Task):
    """Several labels per image (multi-hot ``label`` rows): sigmoid BCE, one decision per class (``threshold``).

    The loss is the mean over classes (timm's ``BinaryCrossEntropy``): its scale does not grow with the class
    count. Metrics: exact-match accuracy, macro F1 (scikit-learn's rule), micro F1, sample F1 (each row's F1,
    averaged: the metric of Kaggle's multi-label competitions).
    """

    threshold: float = 0.5

    def loss(self, logits, targets):
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, targets), axis=-1)

    def probabilities(self, logits):
        return jax.nn.sigmoid(logits)

    def logits(self, probabilities):
        p = jnp.clip(probabilities, 1e-7, 1 - 1e-7)
        return jnp.log(p) - jnp.log1p(-p)

    def _unsmoothed(self, labels, num_classes):
        if labels.ndim == 1:
            raise ValueError("the multi-label task needs multi-hot label rows [B, C]; this batch has integer "
                             "labels [B] (use the softmax task, or a source with several labels per image)")
        return super()._unsmoothed(labels, num_classes)

    def metric_sums(self, logits, labels, mask, *, full, losses=None):
        truth = labels > 0.5
        preds = logits > math.log(self.threshold / (1.0 - self.threshold))  # sigmoid(x) > t without the sigmoid
        real = mask[:, None]
        sums = _sums(self._losses(logits, labels, losses), jnp.all(preds == truth, axis=-1), mask)
        if full:
            hits = {"tp": preds & truth & real, "fp": preds & ~truth & real, "fn": ~preds & truth & real}
            sums.update({name: jnp.sum(hit, axis=0, dtype=jnp.int32) for name, hit in hits.items()})
            rows = row_f1(*(jnp.sum(hits[name], axis=1, dtype=jnp.float32) for name in ("tp", "fp", "fn")))
            sums["row_f1_sum"] = jnp.sum(jnp.where(mask, rows, 0.0))
        return sums

    def _finish(self, sums):
        out = super()._finish(sums)
        if "tp" in sums:
            out["f1"], out["micro_f1"] = multilabel_f1(sums["tp"], sums["fp"], sums["fn"])
        if "row_f1_sum" in sums:
            out["samples_f1"] = _ratio(sums["row_f1_sum"], int(sums["count"]))
        return out

    def _metric_names(self, full):
        return ("loss", "acc", "f1", "micro_f1", "samples_f1") if full else ("loss", "acc")


TASKS.register("softmax", lambda task: SoftmaxClassification(label_smoothing=task.label_smoothing),
               help="softmax cross-entropy; accuracy, top-5, macro F1")
TASKS.register("focal", lambda task: FocalClassification(label_smoothing=task.label_smoothing, gamma=task.focal_gamma),
               help="softmax focal loss, --focal-gamma")
AUTO_THRESHOLD = 0.5  # --threshold auto's decision while training; per-class ones are learnt after it (run.thresholds)
TASKS.register("multilabel",
               lambda task: MultiLabelClassification(label_smoothing=task.label_smoothing,
                                                     threshold=AUTO_THRESHOLD if task.threshold == "auto" else
                                                     task.threshold),
               help="several labels per image: sigmoid BCE, a class predicted above --threshold")


def make_task(task: TaskConfig | str = TaskConfig()) -> Task:
    """The task of a config's ``task`` section (checked where it is defined, :meth:`TaskConfig.check`), by its
    :data:`~kaggle_utils.registry.TASKS` entry; a name: that task with the section's defaults."""
    task = TaskConfig(task=task) if isinstance(task, str) else task
    return TASKS[task.task].build(task)
