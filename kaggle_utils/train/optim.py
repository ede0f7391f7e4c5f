"""Learning-rate schedules and optimizers by name (:mod:`kaggle_utils.registry`): small optax pieces, composed in
one place from the config's ``optim`` section.

* The peak rate scales linearly with the global batch (Goyal et al.): a base rate is quoted per
  ``reference_batch`` examples, so another device count or batch per device keeps the recipe.
* Every schedule starts with a linear warmup (Adam-type optimizers diverge without it at large batches).
* Weight decay skips biases and normalisation scales (1-D leaves); SGD's is L2 on the gradient
  (torch's ``weight_decay``), the others' decoupled. Gradients are clipped by their global norm
  after the sum over replicas, so the clip sees a single-device run's gradient.
* ``frozen`` leaves get no update and no optimizer state (``multi_transform`` with ``set_to_zero``);
  ``lr_multipliers`` (:mod:`.lr_groups`) scale each update after the optimizer, outside the
  freezing, so the optimizer state keeps its layout and frozen leaves stay at zero.
* A run's rates are a table in the optimizer's state (:class:`Schedule`, :func:`at_rate_table`), not constants of
  the compiled step: a run of another length, peak rate, warmup or schedule compiles the same program, so the
  persistent compilation cache serves a tune's trials, a CV's folds of other sizes and the next run alike.
"""
import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from ..config import ConfigError, OptimConfig
from ..registry import OPTIMIZERS, SCHEDULES
from ..variable_trees import freeze_optimizer
from .lr_groups import LrGroups, scale_by_tree


def scaled_lr(base_lr: float, global_batch_size: int, reference_batch: int = 256) -> float:
    return base_lr * global_batch_size / reference_batch


# ---- schedules: (section, peak rate, steps after the warmup, steps per epoch) -> the rate over those steps
SCHEDULES.register("cosine", lambda optim, peak, steps, _: optax.cosine_decay_schedule(peak, steps,
                                                                                      alpha=optim.end_lr_factor),
                   help="to --end-lr-factor x the peak", reads=("end_lr_factor",))
SCHEDULES.register("linear", lambda optim, peak, steps, _: optax.linear_schedule(peak, optim.end_lr_factor * peak,
                                                                                steps),
                   help="the same, linearly", reads=("end_lr_factor",))
SCHEDULES.register("constant", lambda optim, peak, steps, _: optax.constant_schedule(peak))


@SCHEDULES.register("step", help="x --decay-rate every --decay-epochs", reads=("decay_epochs", "decay_rate"))
def _step(optim: OptimConfig, peak: float, steps: int, steps_per_epoch: int) -> optax.Schedule:
    every = round(optim.decay_epochs * steps_per_epoch) if optim.decay_epochs else -(-steps // 3)  # default: thirds
    return optax.exponential_decay(peak, max(every, 1), optim.decay_rate, staircase=True)


@SCHEDULES.register("onecycle", help="optax's, rising over the warmup", own_warmup=True)
def _onecycle(optim: OptimConfig, peak: float, steps: int, warmup: int) -> optax.Schedule:
    return optax.cosine_onecycle_schedule(steps, peak, pct_start=max(warmup, 1) / steps)


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A run's rate by step (``schedule(step)``, the history's ``lr``) over its ``total_steps``: what
    :func:`make_optimizer` tabulates into the optimizer's state."""

    rate: optax.Schedule
    total_steps: int

    def __call__(self, step):
        return self.rate(step)

    def table(self) -> np.ndarray:
        """The rate at steps 0..L-1, L the power of two above ``total_steps`` (at least 64): runs whose lengths share
        L share a compiled step; past the end the last rate holds."""
        length = max(64, 1 << int(self.total_steps).bit_length())
        return np.asarray(jax.vmap(self.rate)(jnp.arange(length)), np.float32)


class RateTableState(NamedTuple):
    count: jax.Array  # updates applied
    rates: jax.Array  # the rate of each step
    inner: optax.OptState


def at_rate_table(make: Callable[[jax.Array], optax.GradientTransformation], rates) -> optax.GradientTransformation:
    """``make(rate)``, an optimizer at a fixed rate, updating at ``rates[step]`` (the last one past the end): the rates
    are state, so the compiled update does not depend on their values. ``make``'s state must not depend on the rate
    (true of optax's optimizers: the rate only scales)."""
    rates = jnp.asarray(rates, jnp.float32)

    def init(params):
        return RateTableState(jnp.zeros([], jnp.int32), rates, make(rates[0]).init(params))

    def update(updates, state, params=None):
        rate = state.rates[jnp.minimum(state.count, state.rates.shape[0] - 1)]
        updates, inner = make(rate).update(updates, state.inner, params)
        return updates, RateTableState(optax.safe_increment(state.count), state.rates, inner)

    return optax.GradientTransformation(init, update)


def make_schedule(optim: OptimConfig | str, peak_lr: float, total_steps: int, *, warmup_steps: int = 0,
                  steps_per_epoch: int = 1) -> Schedule:
    """0 -> ``peak_lr`` linearly over ``warmup_steps``, then ``optim.schedule`` (a name: that schedule with the
    section's defaults) over the rest of ``total_steps``, as its :data:`~kaggle_utils.registry.SCHEDULES` entry
    says (``steps_per_epoch``: for ``--decay-epochs``). A schedule registered with ``own_warmup`` (onecycle: it
    rises from peak / 25 over the warmup, at least one step) takes the whole run and the warmup's length instead.
    """
    optim = OptimConfig(schedule=optim) if isinstance(optim, str) else optim
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    entry = SCHEDULES[optim.schedule]
    warmup = min(max(warmup_steps, 0), total_steps - 1)
    if entry.defaults.get("own_warmup"):
        return Schedule(entry.build(optim, peak_lr, total_steps, warmup), total_steps)
    after = entry.build(optim, peak_lr, total_steps - warmup, steps_per_epoch)
    rate = optax.join_schedules([optax.linear_schedule(0.0, peak_lr, warmup), after], [warmup]) if warmup else after
    return Schedule(rate, total_steps)


# ---- optimizers: (section, schedule, weight decay) -> the transform; defaults: lr per 256 images, weight decay.
# Lion wants ~10x less lr and ~10x more decay than AdamW (Chen et al. 2023), SGD Goyal et al.'s 0.1 with L2 1e-4
def _decay_mask(params) -> Any:
    return jax.tree.map(lambda p: p.ndim > 1, params)


def _adam_like(make, b1: float, b2: float):
    def build(optim: OptimConfig, schedule, weight_decay: float) -> optax.GradientTransformation:
        return make(schedule, b1=b1 if optim.b1 is None else optim.b1, b2=b2 if optim.b2 is None else optim.b2,
                    weight_decay=weight_decay, mask=_decay_mask)
    return build


OPTIMIZERS.register("adamw", _adam_like(optax.adamw, 0.9, 0.999), help="lr 1e-2, weight decay 0.05",
                    reads=("b1", "b2"), lr=1e-2, weight_decay=0.05)
OPTIMIZERS.register("sgd", lambda optim, schedule, weight_decay: optax.chain(
    optax.add_decayed_weights(weight_decay, _decay_mask),
    optax.sgd(schedule, momentum=optim.momentum or None, nesterov=optim.nesterov)),
    help="lr 0.1, weight decay 1e-4 as L2", reads=("momentum", "nesterov"), lr=0.1, weight_decay=1e-4)
OPTIMIZERS.register("lamb", _adam_like(optax.lamb, 0.9, 0.999), help="lr 1e-2, weight decay 0.05",
                    reads=("b1", "b2"), lr=1e-2, weight_decay=0.05)
OPTIMIZERS.register("lion", _adam_like(optax.lion, 0.9, 0.99), help="lr 1e-3, weight decay 0.5", reads=("b1", "b2"),
                    lr=1e-3, weight_decay=0.5)
OPTIMIZERS.register("adafactor", lambda optim, schedule, weight_decay: optax.adafactor(
    schedule, weight_decay_rate=weight_decay or None, weight_decay_mask=_decay_mask),
    help="lr 1e-2, weight decay 0.05", lr=1e-2, weight_decay=0.05)


def default_lr(optimizer: str) -> float:
    """The rate per 256 images ``--optimizer`` runs at without ``--lr``."""
    if "lr" not in OPTIMIZERS[optimizer].defaults:
        raise ConfigError(f"--optimizer {optimizer} was registered without a default rate (lr=): give --lr")
    return OPTIMIZERS[optimizer].defaults["lr"]


def default_weight_decay(optimizer: str) -> float:
    return OPTIMIZERS[optimizer].defaults.get("weight_decay", 0.0)


def make_optimizer(schedule: optax.Schedule | float, optim: OptimConfig = OptimConfig(), *,
                   tx: optax.GradientTransformation | None = None, frozen: Any | Callable | None = None,
                   lr_multipliers: LrGroups | Any | None = None) -> optax.GradientTransformation:
    """Clip by ``optim.clip_norm`` -> ``optim.optimizer`` (its :data:`~kaggle_utils.registry.OPTIMIZERS` entry at
    ``schedule``; ``optim.weight_decay`` None: the entry's default), or ``tx`` as it is -> multipliers. A
    :class:`Schedule` (:func:`make_schedule`'s) is read from a table in the state (:func:`at_rate_table`); any other
    schedule or rate is given to the optimizer as it is.

    ``frozen``: path patterns, a pytree of bools over the params (True = frozen), or a function of the params
    returning one (see :func:`kaggle_utils.variable_trees.freeze_optimizer`). ``lr_multipliers``:
    :func:`.lr_groups.assign_lr_groups`' result or a pytree of floats over the params; a leaf's update (decay
    included, as with a per-group lr) is multiplied by its value.
    """
    if tx is None:
        decay = default_weight_decay(optim.optimizer) if optim.weight_decay is None else optim.weight_decay
        entry = OPTIMIZERS[optim.optimizer]
        make = lambda rate: entry.build(optim, rate, decay)  # noqa: E731  (the entry at one rate or schedule)
        core = at_rate_table(make, schedule.table()) if isinstance(schedule, Schedule) else make(schedule)
        tx = optax.chain(*([optax.clip_by_global_norm(optim.clip_norm)] if optim.clip_norm is not None else []), core)
    if frozen is not None:
        tx = freeze_optimizer(tx, frozen)
    if lr_multipliers is None:
        return tx
    if isinstance(lr_multipliers, LrGroups):
        lr_multipliers = lr_multipliers.per_leaf()
    return optax.chain(tx, scale_by_tree(lr_multipliers))
