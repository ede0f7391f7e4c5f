"""Learning rates per part of a network: layer-wise decay (timm's ``--layer-decay``) and a classifier multiplier.

Early features transfer best and should move least; a new classifier needs the full rate. The model lists
its parts, input to output, as ``(group, regex of a path's first name, depth)`` (``EfficientNet.lr_parts``:
its stages, timm's ``coarse=True``); a part at depth ``d`` learns at ``lr x D ** (last - d)``, the last also
by ``head_lr_mult``. Scaling AdamW's update equals a per-group rate: its moments do not depend on the rate
and its decoupled decay is multiplied by it, as with timm's per-group ``lr``.
"""
import itertools
import re
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax

from ..variable_trees import VariableTreeError, flatten, listing, path_name

Part = tuple[str, str, int]  # (group, regex of the top-level names of its parameters, depth from the input)


class LrGroups(NamedTuple):
    """Each parameter's group and each group's lr multiplier (only groups the params have, input first)."""

    labels: Any  # a tree like the params: each leaf's group name
    multipliers: dict[str, float]

    def per_leaf(self) -> Any:
        """The tree of multipliers over the params that :func:`scale_by_tree` takes."""
        return jax.tree.map(self.multipliers.__getitem__, self.labels)


def group_multipliers(parts: Sequence[Part], *, layer_decay: float | None = None, head_lr_mult: float = 1.0
                      ) -> dict[str, float]:
    """Every group's lr multiplier, input first; needs no params, so a plan can describe the rates early."""
    decay = 1.0 if layer_decay is None else layer_decay
    last = max(depth for _, _, depth in parts)
    multipliers = {group: decay ** (last - depth) for group, _, depth in parts}
    multipliers[parts[-1][0]] *= head_lr_mult
    return multipliers


def assign_lr_groups(params: Any, parts: Sequence[Part], *, layer_decay: float | None = None,
                     head_lr_mult: float = 1.0) -> LrGroups:
    """The group of every leaf of ``params`` and each group's multiplier; a path no part matches is refused, named
    (the model would train at one rate while the plan line claims several)."""
    def group_of(path: str) -> str | None:
        return next((group for group, pattern, _ in parts if re.fullmatch(pattern, path.split("/", 1)[0])), None)

    unknown = [path for path in flatten(params) if group_of(path) is None]
    if unknown:
        hint = " (pass variables['params'], not the variables)" if unknown[0].startswith("params/") else ""
        raise VariableTreeError(f"learning-rate groups: no group for {listing(unknown)}{hint}; the model's parts: "
                                + ", ".join(f"{group} ({pattern})" for group, pattern, _ in parts))
    labels = jax.tree.map_with_path(lambda kp, _: group_of(path_name(kp)), params)
    present = set(jax.tree.leaves(labels))
    every = group_multipliers(parts, layer_decay=layer_decay, head_lr_mult=head_lr_mult)
    return LrGroups(labels, {group: m for group, m in every.items() if group in present})


def scale_by_tree(multipliers: Any) -> optax.GradientTransformation:
    """Each update times its leaf's multiplier (a tree of floats like the params): after AdamW, a per-leaf rate. A tree
    that does not fit the params is refused at ``init``, naming the paths."""

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


def _short(value: float) -> str:
    mantissa, exponent = f"{value:.2e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def describe_lr_groups(peak_lr: float, multipliers_by_group: Mapping[str, float]) -> str:
    """``lr by group: stem 1.2e-4, stage0 1.6e-4, ..., classifier 2e-3`` for the plan line; neighbouring
    groups at the same rate are shown once (``stem..head 2e-3``)."""
    runs = [[group for group, _ in run] for _, run in itertools.groupby(multipliers_by_group.items(), lambda g: g[1])]
    parts = [f"{run[0] if len(run) == 1 else f'{run[0]}..{run[-1]}'} {_short(peak_lr * multipliers_by_group[run[0]])}"
             for run in runs]
    return "lr by group: " + ", ".join(parts)
