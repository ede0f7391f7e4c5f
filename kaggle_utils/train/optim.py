"""Learning-rate schedules and optimizers by name: small optax pieces, composed in one place.

* The peak rate scales linearly with the global batch (Goyal et al.): a base rate is quoted per
  ``reference_batch`` examples, so another device count or batch per device keeps the recipe.
* Every schedule starts with a linear warmup (Adam-type optimizers diverge without it at large batches).
* Weight decay skips biases and normalisation scales (1-D leaves); SGD's is L2 on the gradient
  (torch's ``weight_decay``), the others' decoupled. Gradients are clipped by their global norm
  after the sum over replicas, so the clip sees a single-device run's gradient.
* ``frozen`` leaves get no update and no optimizer state (``multi_transform`` with ``set_to_zero``);
  ``lr_multipliers`` (:mod:`.lr_groups`) scale each update after the optimizer, outside the
  freezing, so the optimizer state keeps its layout and frozen leaves stay at zero.
"""
from typing import Any, Callable

import jax
import optax

from ..variable_trees import freeze_optimizer
from .lr_groups import LrGroups, scale_by_tree

# name -> (lr per 256 images, weight decay) when none is given: Lion wants ~10x less lr and ~10x more decay
# than AdamW (Chen et al. 2023), SGD Goyal et al.'s 0.1 with L2 1e-4
OPTIMIZERS = {"adamw": (1e-2, 0.05), "sgd": (0.1, 1e-4), "lamb": (1e-2, 0.05), "lion": (1e-3, 0.5),
              "adafactor": (1e-2, 0.05)}
BETAS = {"adamw": (0.9, 0.999), "lamb": (0.9, 0.999), "lion": (0.9, 0.99)}  # the optimizers with b1, b2


def scaled_lr(base_lr: float, global_batch_size: int, reference_batch: int = 256) -> float:
    return base_lr * global_batch_size / reference_batch


def make_schedule(name: str, peak_lr: float, total_steps: int, *, warmup_steps: int = 0, end_factor: float = 0.0,
                  decay_steps: int | None = None, decay_rate: float = 0.1) -> optax.Schedule:
    """0 -> ``peak_lr`` linearly over ``warmup_steps``, then ``name`` over the rest of ``total_steps``.

    ``cosine`` / ``linear`` end at ``end_factor * peak_lr``; ``step`` multiplies the rate by
    ``decay_rate`` every ``decay_steps``; ``constant`` stays at the peak; ``onecycle`` rises from
    peak / 25 over the warmup (at least one step) and anneals to peak / 25e4 (optax's defaults).
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    warmup = min(max(warmup_steps, 0), total_steps - 1)
    if name == "onecycle":
        return optax.cosine_onecycle_schedule(total_steps, peak_lr, pct_start=max(warmup, 1) / total_steps)
    rest = total_steps - warmup
    after = {"cosine": lambda: optax.cosine_decay_schedule(peak_lr, rest, alpha=end_factor),
             "linear": lambda: optax.linear_schedule(peak_lr, end_factor * peak_lr, rest),
             "constant": lambda: optax.constant_schedule(peak_lr),
             "step": lambda: optax.exponential_decay(peak_lr, max(decay_steps or -(-rest // 3), 1), decay_rate,
                                                     staircase=True)}[name]()
    return optax.join_schedules([optax.linear_schedule(0.0, peak_lr, warmup), after], [warmup]) if warmup else after


def _decay_mask(params) -> Any:
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _core(name: str, schedule, weight_decay: float, b1: float | None, b2: float | None, momentum: float,
          nesterov: bool) -> optax.GradientTransformation:
    if name == "sgd":
        return optax.chain(optax.add_decayed_weights(weight_decay, _decay_mask),
                           optax.sgd(schedule, momentum=momentum or None, nesterov=nesterov))
    if name == "adafactor":
        return optax.adafactor(schedule, weight_decay_rate=weight_decay or None, weight_decay_mask=_decay_mask)
    if name not in BETAS:
        raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")
    default_b1, default_b2 = BETAS[name]
    make = {"adamw": optax.adamw, "lamb": optax.lamb, "lion": optax.lion}[name]
    return make(schedule, b1=default_b1 if b1 is None else b1, b2=default_b2 if b2 is None else b2,
                weight_decay=weight_decay, mask=_decay_mask)


def make_optimizer(schedule: optax.Schedule | float, *, optimizer: str | optax.GradientTransformation = "adamw",
                   weight_decay: float | None = None, clip_norm: float | None = 1.0, b1: float | None = None,
                   b2: float | None = None, momentum: float = 0.9, nesterov: bool = False,
                   frozen: Any | Callable | None = None, lr_multipliers: LrGroups | Any | None = None
                   ) -> optax.GradientTransformation:
    """Clip -> ``optimizer`` (an ``OPTIMIZERS`` name at ``schedule``, or any optax transform as is) -> multipliers.

    ``weight_decay`` / ``b1`` / ``b2``: None is the optimizer's default (``OPTIMIZERS``, ``BETAS``);
    ``momentum`` and ``nesterov`` are SGD's. ``frozen``: path patterns, a pytree of bools over the
    params (True = frozen), or a function of the params returning one (see
    :func:`kaggle_utils.variable_trees.freeze_optimizer`). ``lr_multipliers``:
    :func:`.lr_groups.assign_lr_groups`' result or a pytree of floats over the params; a leaf's
    update (decay included, as with a per-group lr) is multiplied by its value.
    """
    if isinstance(optimizer, str):
        decay = OPTIMIZERS.get(optimizer, (0, 0))[1] if weight_decay is None else weight_decay
        core = _core(optimizer, schedule, decay, b1, b2, momentum, nesterov)
        tx = optax.chain(*([optax.clip_by_global_norm(clip_norm)] if clip_norm is not None else []), core)
    else:
        tx = optimizer
    if frozen is not None:
        tx = freeze_optimizer(tx, frozen)
    if lr_multipliers is None:
        return tx
    if isinstance(lr_multipliers, LrGroups):
        lr_multipliers = lr_multipliers.per_leaf()
    return optax.chain(tx, scale_by_tree(lr_multipliers))
