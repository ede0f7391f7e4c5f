"""Model surgery for Flax: reshape a pretrained network without losing what it learned.

Flax keeps a model's definition apart from its variables, so every PyTorch habit (swap the head, load what
fits, freeze the backbone) is two moves: change the module, then :func:`inherit` every leaf whose path and
shape still match. Works on any Flax model; every operation returns a report (``print`` it).
"""
from ..variable_trees import (VariableTreeError, flatten, freeze_mask, freeze_optimizer, init_variables, shapes,
                              unflatten)
from .freezing import (BATCHNORM_INFERENCE, FreezeReport, FrozenBatchNorm, FrozenModelAndOptimizer,
                       carry_optimizer_state, freeze, freeze_batchnorm)
from .inheritance import InheritReport, inherit
from .inspection import CastReport, ParamTable, cast, count_flops, extract_features, param_table
from .variants import (ChannelReport, ClassifierHead, ModelAndVariables, adapt_input_channels, attach_head,
                       padded_width, replace_classifier, rewire, variant)

SurgeryError = VariableTreeError  # every operation here raises it (the base module's error, one class)

__all__ = ["BATCHNORM_INFERENCE", "CastReport", "ChannelReport", "ClassifierHead", "FreezeReport", "FrozenBatchNorm",
           "FrozenModelAndOptimizer", "InheritReport", "ModelAndVariables", "ParamTable", "SurgeryError",
           "adapt_input_channels", "attach_head", "carry_optimizer_state", "cast", "count_flops",
           "extract_features", "flatten", "freeze", "freeze_batchnorm", "freeze_mask", "freeze_optimizer",
           "inherit", "init_variables", "padded_width", "param_table", "replace_classifier", "rewire",
           "shapes", "unflatten", "variant"]
