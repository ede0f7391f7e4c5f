"""kaggle-utils: EfficientNet in Flax, TFRecord input, multi-device training for Kaggle.

``xla_cpu.apply()`` runs on the first import of anything in the kit: XLA reads its options once, when
JAX starts a backend, which the kit's entry points do soon after importing it.
"""
from . import xla_cpu

xla_cpu.apply()
