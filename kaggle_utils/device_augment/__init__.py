"""Augmentation on the accelerator: pure JAX functions called inside the jitted train step.

``randaugment`` (uint8, before normalisation) and ``mixing`` (Mixup / CutMix on normalised images). Imports
only JAX, so a train step can use it without the input pipeline's stack.
"""
from .mixing import MixConfig, mix, partner_rows, smooth_targets
from .randaugment import (DEVICE_AUGMENTS, MAX_MAGNITUDE, RANDAUGMENT_OPS, RandAugmentConfig, make_device_augment,
                          rand_augment, rand_augment_batch)

__all__ = ["DEVICE_AUGMENTS", "MAX_MAGNITUDE", "MixConfig", "RANDAUGMENT_OPS", "RandAugmentConfig",
           "make_device_augment", "mix", "partner_rows", "rand_augment", "rand_augment_batch",
           "smooth_targets"]
