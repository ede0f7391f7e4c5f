"""Learning-rate schedule and optimizer: small optax pieces, composed in one place.

* The peak learning rate scales linearly with the global batch size (Goyal et al.): a base
  rate is quoted for ``reference_batch`` examples, so changing the number of devices or the
  batch per device keeps the recipe.
* Linear warmup then cosine decay: large-batch training with Adam-type optimizers diverges
  without warmup, and cosine needs no tuning of decay milestones.
* AdamW decays weights but not biases and normalisation scales (1-D leaves), the usual rule.
* Gradients are clipped by their global norm after they are summed over replicas, so the
  clip sees the same gradient as a single-device run.
* ``frozen`` marks leaves that must not move (a fine-tuned backbone): they get no update and
  no optimizer state (``optax.multi_transform`` with ``set_to_zero``).
* ``lr_multipliers`` give parts of the network their own rates (layer-wise decay, a faster new
  classifier; :mod:`.lr_groups`): each update is scaled after AdamW, outside the freezing, so
  the optimizer state without them keeps its layout, and frozen leaves stay at zero.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import optax

from ..variable_trees import freeze_optimizer
from .lr_groups import LrGroups, scale_by_tree

__all__ = ["make_optimizer", "scaled_lr", "warmup_cosine"]


def scaled_lr(base_lr: float, global_batch_size: int, reference_batch: int = 256) -> float:
    return base_lr * global_batch_size / reference_batch


def warmup_cosine(peak_lr: float, total_steps: int, warmup_steps: int = 0,
                  end_factor: float = 0.0) -> optax.Schedule:
    """0 -> ``peak_lr`` linearly over ``warmup_steps``, then cosine to ``end_factor * peak_lr``."""
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warmup_steps = min(max(warmup_steps, 0), total_steps - 1)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0 if warmup_steps else peak_lr, peak_value=peak_lr, warmup_steps=warmup_steps,
        decay_steps=total_steps, end_value=end_factor * peak_lr)


def _decay_mask(params) -> Any:
    return jax.tree.map(lambda p: p.ndim > 1, params)


def make_optimizer(schedule: optax.Schedule | float, *, weight_decay: float = 0.05, clip_norm: float | None = 1.0,
                   b1: float = 0.9, b2: float = 0.999, frozen: Any | Callable | None = None,
                   lr_multipliers: LrGroups | Any | None = None) -> optax.GradientTransformation:
    """Clip -> AdamW(schedule) with weight decay on matrices/kernels only -> per-leaf lr multipliers.

    ``frozen``: path patterns, a pytree of bools over the params (True = frozen), or a
    function of the params returning one (see :func:`kaggle_utils.variable_trees.freeze_optimizer`).
    ``lr_multipliers``: :func:`.lr_groups.assign_lr_groups`' result or a pytree of floats over the params;
    a leaf's update (decay included, as with a per-group lr) is multiplied by its value.
    """
    parts = []
    if clip_norm is not None:
        parts.append(optax.clip_by_global_norm(clip_norm))
    parts.append(optax.adamw(schedule, b1=b1, b2=b2, weight_decay=weight_decay, mask=_decay_mask))
    tx = optax.chain(*parts)
    if frozen is not None:
        tx = freeze_optimizer(tx, frozen)
    if lr_multipliers is None:
        return tx
    if isinstance(lr_multipliers, LrGroups):
        lr_multipliers = lr_multipliers.per_leaf()
    return optax.chain(tx, scale_by_tree(lr_multipliers))
