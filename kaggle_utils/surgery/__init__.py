"""Model surgery for Flax: reshape a pretrained network without losing what it learned.

Flax keeps a model's definition (a ``Module``) apart from its variables (nested dicts of
arrays), so every PyTorch habit -- swap the head, load what fits, freeze the backbone --
becomes two moves here: change the module, then carry over the variables that still fit.
Everything below works on variable trees and module fields, never on a particular model's
internals, so it applies to the kit's EfficientNets and to any small Flax model alike.

* Paths (:mod:`kaggle_utils.variable_trees`, shared with the training engine): ``flatten`` /
  ``unflatten`` / ``shapes`` with ``/``-joined paths (``params/blocks_0_0/conv/kernel``);
  patterns are regular expressions searched in them; ``init_variables``.
* :mod:`.inheritance`: :func:`inherit` copies every leaf whose path and shape match.
* :mod:`.variants`: :func:`variant`, :func:`rewire` (a variant of a model that inherits all
  that fits), :func:`replace_classifier`; they return a :class:`ModelAndVariables`.
* :mod:`.heads`: :func:`attach_head` (a :class:`ClassifierHead` on a backbone, optionally
  padded to a multiple of 128 outputs).
* :mod:`.freezing`: :func:`freeze_mask`, :func:`freeze_optimizer` (frozen leaves get no update and
  no optimizer state), :func:`freeze_batchnorm` (BatchNorm layers whose parameters are frozen
  run in inference mode), :func:`freeze` (all three, with a report), :func:`carry_optimizer_state`
  (unfreezing keeps the optimizer state of what already trains).
* :mod:`.channels`: :func:`adapt_input_channels`; :mod:`.inspection`: :func:`extract_features`,
  :func:`param_table`, :func:`count_flops`, :func:`cast`.

Every operation returns a report of what it did (``print`` it), and bad input -- a pattern
that matches nothing, trees with nothing in common, a head that does not fit the backbone --
is a :class:`SurgeryError` naming what and where, never a silent no-op.
Imports only jax, flax, optax and numpy (plus the kit's BatchNorm layer, which does the same).
"""
from ..variable_trees import VariableTreeError, flatten, freeze_mask, freeze_optimizer, init_variables, shapes, unflatten
from .channels import ChannelReport, adapt_input_channels
from .freezing import (BATCHNORM_INFERENCE, FreezeReport, FrozenBatchNorm, FrozenModelAndOptimizer,
                     carry_optimizer_state, freeze, freeze_batchnorm)
from .heads import ClassifierHead, attach_head, padded_width
from .inheritance import InheritReport, inherit
from .inspection import CastReport, ParamTable, cast, count_flops, extract_features, param_table
from .variants import ModelAndVariables, replace_classifier, rewire, variant

SurgeryError = VariableTreeError  # every operation here raises it (the base module's error, one class)

__all__ = [
    "BATCHNORM_INFERENCE",
    "CastReport",
    "ChannelReport",
    "ClassifierHead",
    "FreezeReport",
    "FrozenBatchNorm",
    "FrozenModelAndOptimizer",
    "InheritReport",
    "ModelAndVariables",
    "ParamTable",
    "SurgeryError",
    "adapt_input_channels",
    "attach_head",
    "carry_optimizer_state",
    "cast",
    "count_flops",
    "extract_features",
    "flatten",
    "freeze",
    "freeze_batchnorm",
    "freeze_mask",
    "freeze_optimizer",
    "init_variables",
    "inherit",
    "padded_width",
    "param_table",
    "replace_classifier",
    "rewire",
    "shapes",
    "unflatten",
    "variant",
]
