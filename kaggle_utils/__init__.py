"""kaggle-utils: EfficientNet in Flax, TFRecord input, multi-device training for Kaggle.

``xla_cpu.apply()`` and ``xla_cpu.dispatch_inline()`` run on the first import of anything in the kit: XLA and
JAX read those options once, when JAX starts a backend, which the kit's entry points do soon after importing it.
"""
from . import xla_cpu

xla_cpu.apply()
xla_cpu.dispatch_inline()
