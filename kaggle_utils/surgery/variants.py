"""Variants of a model: other fields, another block layout, another classifier, its variables inherited."""
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from flax import linen as nn

from ..variable_trees import Patterns, VariableTreeError, abstract_variables, flatten, init_variables, unflatten
from .inheritance import inherit


class ModelAndVariables(NamedTuple):
    """A changed model, its variables, and the report of how they were obtained."""

    model: Any
    variables: dict
    report: Any


def variant(model: nn.Module, **changes) -> nn.Module:
    """``model`` with some fields changed, e.g. ``act="gelu"`` or ``num_classes=104``; a name may also be a
    field of a dataclass-valued field (the EfficientNet's ``spec``: ``arch_def``, ``channel_multiplier``).
    Unknown or ambiguous names are errors."""
    own = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name not in ("parent", "name")}
    direct = {k: v for k, v in changes.items() if k in own}
    configs = {f: v for f, v in own.items() if dataclasses.is_dataclass(v) and not isinstance(v, (type, nn.Module))}
    nested: dict[str, dict] = {}
    for key, value in changes.items():
        if key in direct:
            continue
        holders = [f for f, cfg in configs.items() if key in {g.name for g in dataclasses.fields(cfg)}]
        if len(holders) != 1:
            problem = "is ambiguous" if holders else "is not a field"
            raise VariableTreeError(f"variant: {key!r} {problem} of {type(model).__name__} (fields: {sorted(own)}"
                               + "".join(f"; {f}: {sorted(g.name for g in dataclasses.fields(c))}"
                                         for f, c in configs.items()) + ")")
        nested.setdefault(holders[0], {})[key] = value
    updates = {**direct, **{f: dataclasses.replace(configs[f], **kv) for f, kv in nested.items()}}
    return model.clone(**updates)


def rewire(model: nn.Module, variables: dict, sample_input, *, child: nn.Module | None = None,
           reinit: Patterns = (), seed: int = 0, **changes) -> ModelAndVariables:
    """A variant of ``model`` (``child``, or ``model`` with ``changes``) that inherits all that fits.

    E.g. ``rewire(model, variables, x, act="gelu")``, ``arch_def=...``, or any module built by hand as
    ``child``; when every leaf is inherited, nothing is initialised (nor compiled).
    """
    if (child is None) == (not changes):
        raise VariableTreeError("rewire: give either child= or field changes, exactly one of the two")
    child = variant(model, **changes) if child is None else child
    tree, report = inherit(variables, abstract_variables(child, sample_input), reinit=reinit)
    if report.new or report.mismatched or report.reinitialised:  # some leaves need fresh values
        tree, report = inherit(variables, init_variables(child, sample_input, seed=seed), reinit=reinit)
    return ModelAndVariables(child, tree, report)


def replace_classifier(model: nn.Module, variables: dict, num_classes: int, sample_input, *,
                       classifier: Patterns = r"(^|/)classifier/", seed: int = 0,
                       head_init: str = "zeros") -> ModelAndVariables:
    """``model`` for ``num_classes`` classes: a fresh classifier, everything else kept.

    ``classifier``: patterns of the classifier's leaves (e.g. ``"Dense_1"`` for a model that does not
    name it ``classifier``), re-initialised even when the shape stays (a padded head of 104 or 100
    classes is 128 wide either way): to zeros (``head_init``, as :func:`~.heads.attach_head`) or randomly.
    """
    if "num_classes" not in {f.name for f in dataclasses.fields(model)}:
        raise VariableTreeError(f"replace_classifier: {type(model).__name__} has no num_classes field; "
                           "build the new model yourself and use rewire(..., child=new_model)")
    new_model, tree, report = rewire(model, variables, sample_input, reinit=classifier, seed=seed,
                                     num_classes=num_classes)
    fresh = set(report.reinitialised) | set(report.new) | {p for p, _, _ in report.mismatched}
    flat = {path: (initial_head(leaf, head_init) if path in fresh else leaf) for path, leaf in flatten(tree).items()}
    return ModelAndVariables(new_model, unflatten(flat), report)


HEAD_INITS = ("zeros", "random")


def initial_head(classifier: Any, head_init: str) -> Any:
    """A new classifier's leaves as ``head_init`` wants them: zeros, or as initialised (``"random"``)."""
    if head_init not in HEAD_INITS:
        raise VariableTreeError(f"head_init must be one of {HEAD_INITS}, got {head_init!r}")
    return jax.tree.map(jnp.zeros_like, classifier) if head_init == "zeros" else classifier
