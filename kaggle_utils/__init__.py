"""kaggle-utils: EfficientNet in Flax, TFRecord input, multi-device training for Kaggle.

``xla_cpu.apply()`` runs here, on the first import of anything in the kit, because XLA reads
its options once, when JAX starts a backend, and the kit's entry points (``runtime.setup``,
the job, the notebooks) start JAX soon after importing the kit.
"""
from . import xla_cpu

xla_cpu.apply()
