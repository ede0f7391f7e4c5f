"""Model surgery for Flax: reshape a pretrained network without losing what it learned.

Flax keeps a model's definition (a ``Module``) apart from its variables (nested dicts of arrays),
so every PyTorch habit (swap the head, load what fits, freeze the backbone) is two moves: change
the module, then carry over the variables that still fit. Everything works on variable trees and
module fields, so it applies to the kit's EfficientNets and to any Flax model alike:
:mod:`.inheritance` (:func:`inherit`: every leaf whose path and shape match), :mod:`.variants`
(:func:`variant`, :func:`rewire`, :func:`replace_classifier`), :mod:`.heads` (:func:`attach_head`),
:mod:`.freezing` (:func:`freeze`, :func:`freeze_batchnorm`, :func:`carry_optimizer_state`),
:mod:`.channels` (:func:`adapt_input_channels`), :mod:`.inspection` (:func:`extract_features`,
:func:`param_table`, :func:`count_flops`, :func:`cast`); paths and patterns are
:mod:`kaggle_utils.variable_trees`'.

Every operation returns a report of what it did (``print`` it); bad input (a pattern that matches
nothing, trees with nothing in common, a head that does not fit) is a :class:`SurgeryError` naming
what and where, never a silent no-op.
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
