"""Freezing a part of a model: no update, no optimizer state, and BatchNorm in inference mode.

The mask and optimizer wrapper are the engine's too (:mod:`kaggle_utils.variable_trees`); here is what only a
user's model needs: BatchNorm in inference mode, :func:`freeze` and :func:`carry_optimizer_state`.
"""
import dataclasses
import inspect
from typing import Any, Callable, NamedTuple

import optax
from flax import linen as nn

from ..efficientnet.layers import BatchNorm as KitBatchNorm
from ..variable_trees import Patterns, as_patterns, flatten, freeze_mask, freeze_optimizer, leaf_size, select_paths
from .inheritance import InheritReport, inherit


def carry_optimizer_state(opt_state: Any, tx: optax.GradientTransformation, params: Any
                          ) -> tuple[Any, InheritReport]:
    """The state of ``tx`` (e.g. with fewer leaves frozen) taking over all that fits from ``opt_state``: only the
    newly trained leaves start fresh (the report's ``new``); the other moments and the step count carry over."""
    return inherit(opt_state, tx.init(params))


def _frozen_modules(flat_params: dict, frozen: set[str]) -> frozenset[str]:
    """Modules (paths) all of whose own parameters are among the ``frozen`` paths."""
    modules: dict[str, bool] = {}
    for path in flat_params:
        module = path.rpartition("/")[0]
        modules[module] = modules.get(module, True) and path in frozen
    return frozenset(m for m, all_frozen in modules.items() if all_frozen)


def _flax_batchnorm_inference(module, next_fun, arguments):
    """Calls a copy of Flax's BatchNorm with ``use_running_average=True``, bound to the same variables
    (the flag may be fixed in the constructor, and passing it again at call time is an error)."""
    if module.use_running_average is True:  # already in inference mode (the copy, too)
        return next_fun(**arguments)
    arguments.pop("use_running_average", None)
    return module.clone(parent=module.scope, use_running_average=True)(**arguments)


# BatchNorm layers and how to call each in inference mode (running statistics, no update).
BATCHNORM_INFERENCE: dict[type, Callable] = {
    nn.BatchNorm: _flax_batchnorm_inference,
    KitBatchNorm: lambda module, next_fun, arguments: next_fun(**{**arguments, "train": False}),
}


def _batchnorm_interceptor(frozen_modules: frozenset[str]):
    def interceptor(next_fun, args, kwargs, context):
        module = context.module
        rule = BATCHNORM_INFERENCE.get(type(module))
        if rule is None or context.method_name != "__call__" or "/".join(module.path) not in frozen_modules:
            return next_fun(*args, **kwargs)
        bound = inspect.signature(context.orig_method).bind(*args, **kwargs)
        return rule(module, next_fun, dict(bound.arguments))

    return interceptor


@dataclasses.dataclass(frozen=True)
class FrozenBatchNorm:
    """``model`` whose BatchNorm layers with frozen parameters always run in inference mode (PyTorch's ``.eval()``
    on a frozen part: its ``batch_stats`` stay bit-identical), by ``nn.intercept_methods`` on the types in
    ``BATCHNORM_INFERENCE``, so no model code changes. Other attributes are ``model``'s."""

    model: Any
    patterns: tuple[str, ...]

    def apply(self, variables, *args, **kwargs):
        flat = flatten(variables.get("params", {}))
        frozen = _frozen_modules(flat, select_paths(flat, self.patterns, "freeze"))
        with nn.intercept_methods(_batchnorm_interceptor(frozen)):
            return self.model.apply(variables, *args, **kwargs)

    def __getattr__(self, name):
        if name == "model":  # not yet set (copy / unpickling): avoid recursing
            raise AttributeError(name)
        return getattr(self.model, name)


def freeze_batchnorm(model, patterns: Patterns) -> FrozenBatchNorm:
    """``model`` with the BatchNorm layers whose parameters ``patterns`` freeze kept in inference mode."""
    return FrozenBatchNorm(model, as_patterns(patterns))


@dataclasses.dataclass(frozen=True)
class FreezeReport:
    """What :func:`freeze` froze: parameter leaves and values, and the BatchNorm layers in inference mode."""

    frozen_leaves: int
    frozen_values: int
    trainable_leaves: int
    trainable_values: int
    inference_batchnorms: tuple[str, ...]  # module paths of BatchNorm layers kept in inference mode

    def __str__(self) -> str:
        return (f"frozen {self.frozen_leaves} leaves ({self.frozen_values:,} values); training "
                f"{self.trainable_leaves} leaves ({self.trainable_values:,} values); "
                f"{len(self.inference_batchnorms)} BatchNorm layers kept in inference mode")


class FrozenModelAndOptimizer(NamedTuple):
    """The model and optimizer that :func:`freeze` returns, and its report."""

    model: FrozenBatchNorm
    tx: optax.GradientTransformation
    report: FreezeReport


def freeze(model, tx: optax.GradientTransformation, variables: dict, patterns: Patterns) -> FrozenModelAndOptimizer:
    """Freezes the parameters ``patterns`` match: the model (BatchNorm) and the optimizer, with a report.
    Unfreeze by calling it again with fewer patterns, then :func:`carry_optimizer_state`."""
    flat = flatten(variables["params"])
    frozen = {p for p, f in flatten(freeze_mask(variables["params"], patterns)).items() if f}
    frozen_values = sum(leaf_size(flat[p]) for p in frozen)
    stats_modules = {path.rpartition("/")[0] for path in flatten(variables.get("batch_stats", {}))}
    report = FreezeReport(len(frozen), frozen_values, len(flat) - len(frozen),
                          sum(map(leaf_size, flat.values())) - frozen_values,
                          tuple(sorted(stats_modules & _frozen_modules(flat, frozen))))
    return FrozenModelAndOptimizer(freeze_batchnorm(model, patterns), freeze_optimizer(tx, patterns), report)
