"""Learning rates per part of an EfficientNet: layer-wise decay and a classifier multiplier.

Fine-tuning a pretrained backbone with one rate either under-trains the new classifier or
damages the early features, which transfer best and so should move least (timm's
``--layer-decay``, fastai's discriminative rates). Each parameter gets a *group* from its path,
each group an lr multiplier, and :func:`scale_by_tree` multiplies each leaf's AdamW update by it.

Depth is counted as timm counts it for EfficientNet (``group_matcher`` read by
``group_parameters(..., reverse=True)``): the stem is layer 0, stage ``i`` layer ``i + 1``, the head
conv (``conv_head``/``bn2``) joins the last stage's layer (timm's ``MATCH_PREV_GROUP``) and the
classifier, matched by no pattern, is the last layer, at scale 1. A layer ``l`` learns at
``lr x D ** (last - l)``; ``--head-lr-mult`` then multiplies the classifier alone.

One layer per *stage* (timm's ``coarse=True`` grouping), not per block: timm's
``param_groups_layer_decay`` asks for ``coarse=False``, one layer per block, which puts the stem of
``tf_efficientnetv2_s`` (40 blocks) at ``0.75 ** 41 ~ 7e-6`` of the rate, frozen in all but name,
and makes a value of D mean something different for every variant. Per stage, D means the same
for every EfficientNet (6-7 stages); timm's per-block D is roughly this D ** (1 / blocks per stage).

Scaling the update after AdamW is the same as a per-group learning rate: AdamW's moments do not
depend on the rate, and its decoupled decay is multiplied by the rate, so a group's decay
shrinks with its rate as with timm's per-group ``lr`` (torch's AdamW: ``p -= lr * wd * p``).
"""
from __future__ import annotations

import math
import re
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ..config import ConfigError, flag_of
from ..variable_trees import VariableTreeError, flatten, listing, path_name

__all__ = ["LrGroups", "assign_lr_groups", "check_lr_group_values", "describe_lr_groups", "group_multipliers",
           "lr_group", "scale_by_tree"]

_STAGE = re.compile(r"blocks_(\d+)_\d+")
_FIXED = {"conv_stem": "stem", "bn1": "stem", "conv_head": "head", "bn2": "head", "classifier": "classifier"}


class LrGroups(NamedTuple):
    """Each parameter's group and each group's lr multiplier (only groups the params have, stem first)."""

    labels: Any  # a tree like the params: each leaf's group name
    multipliers: dict[str, float]

    def per_leaf(self) -> Any:
        """The tree of multipliers over the params that :func:`scale_by_tree` takes."""
        return jax.tree.map(self.multipliers.__getitem__, self.labels)


def lr_group(path: str) -> str | None:
    """``stem``, ``stage<i>``, ``head`` or ``classifier`` for a path relative to the params
    (``blocks_2_0/conv_pw/kernel`` -> ``stage2``); None for a name no EfficientNet has."""
    module = path.split("/", 1)[0]
    if module in _FIXED:
        return _FIXED[module]
    stage = _STAGE.fullmatch(module)
    return f"stage{stage.group(1)}" if stage else None


def group_multipliers(num_stages: int, *, layer_decay: float | None = None, head_lr_mult: float = 1.0
                      ) -> dict[str, float]:
    """Every group's lr multiplier for an EfficientNet of ``num_stages`` stages, stem first.

    Needs no params, so a plan can describe the rates before the model is built.
    """
    decay = 1.0 if layer_decay is None else layer_decay
    last = num_stages + 1  # the classifier's layer; the head conv shares the last stage's
    layers = {"stem": 0, **{f"stage{i}": i + 1 for i in range(num_stages)}, "head": num_stages, "classifier": last}
    multipliers = {group: decay ** (last - layer) for group, layer in layers.items()}
    multipliers["classifier"] *= head_lr_mult
    return multipliers


def assign_lr_groups(params: Any, *, layer_decay: float | None = None, head_lr_mult: float = 1.0) -> LrGroups:
    """The group of every leaf of an EfficientNet's ``params`` and the multiplier of each group.

    A path no EfficientNet has is an error that names it: a model with other names would
    otherwise train at one rate while the plan line claims several.
    """
    unknown = [path for path in flatten(params) if lr_group(path) is None]
    if unknown:
        hint = (" (pass variables['params'], not the variables)" if unknown[0].startswith("params/") else "")
        raise VariableTreeError(
            f"learning-rate groups: no group for {listing(unknown)}{hint}; an EfficientNet's parameters start with "
            f"conv_stem, bn1, blocks_<stage>_<block>, conv_head, bn2 or classifier")
    labels = jax.tree.map_with_path(lambda kp, _: lr_group(path_name(kp)), params)
    present = set(jax.tree.leaves(labels))
    num_stages = 1 + max((int(g[len("stage"):]) for g in present if g.startswith("stage")), default=-1)
    every = group_multipliers(num_stages, layer_decay=layer_decay, head_lr_mult=head_lr_mult)
    return LrGroups(labels, {group: m for group, m in every.items() if group in present})


def scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    """Each update times its leaf's multiplier (a tree of floats like the params).

    Chained after AdamW it is a per-leaf learning rate (see the module's docstring). Its state
    is empty; a tree that does not fit the params is refused at ``init``, naming the paths.
    """

    def init(params):
        if jax.tree.structure(params) != jax.tree.structure(multipliers):
            ours, theirs = set(flatten(multipliers)), set(flatten(params))
            raise VariableTreeError(
                f"lr multipliers do not fit the params: only in the params: {listing(sorted(theirs - ours))}; "
                f"only in the multipliers: {listing(sorted(ours - theirs))}")
        return optax.EmptyState()

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda u, m: u * jnp.asarray(m, u.dtype), updates, multipliers), state

    return optax.GradientTransformation(init, update)


def check_lr_group_values(layer_decay: float | None, head_lr_mult: float) -> None:
    """Refuses values no run can use, naming the flag (the job's other value checks live in run.resolve)."""
    if layer_decay is not None and not (math.isfinite(layer_decay) and 0 < layer_decay <= 1):
        raise ConfigError(f"{flag_of('layer_decay')} must be in (0, 1] (the stem learns at lr x D^(stages + 1); "
                          f"above 1 the early layers would learn fastest), got {layer_decay}")
    if not (math.isfinite(head_lr_mult) and head_lr_mult > 0):
        raise ConfigError(f"{flag_of('head_lr_mult')} must be a positive number (to keep the classifier fixed, "
                          f"use {flag_of('freeze')} classifier), got {head_lr_mult}")


def _short(value: float) -> str:
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def describe_lr_groups(peak_lr: float, multipliers_by_group: Mapping[str, float]) -> str:
    """``lr by group: stem 1.2e-4, stage0 1.6e-4, ..., classifier 2e-3`` for the plan line.

    Neighbouring groups at the same rate are shown once (``stem..head 2e-3``), so the line stays short
    when only ``--head-lr-mult`` is set.
    """
    runs: list[list] = []  # [first group, last group, multiplier]
    for group, m in multipliers_by_group.items():
        if runs and math.isclose(runs[-1][2], m, rel_tol=1e-9):
            runs[-1][1] = group
        else:
            runs.append([group, group, m])
    parts = [f"{first if first == last else f'{first}..{last}'} {_short(peak_lr * m)}" for first, last, m in runs]
    return "lr by group: " + ", ".join(parts)
