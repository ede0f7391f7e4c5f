"""Augmentation on the accelerator: pure JAX functions called inside the jitted train step.

``randaugment``: the TF-native RandAugment's policy in JAX, per image with its own draws from a key
(uint8 in and out, before normalisation), with its single operations in ``ops``; ``mixing``: Mixup /
CutMix with timm's semantics on normalised images, giving soft targets (padding rows never mix).
Imports only JAX, so a train step can use it without loading the input pipeline's stack.
"""
from .mixing import MixConfig, mix, partner_rows, smooth_targets
from .ops import RANDAUGMENT_OPS
from .randaugment import (DEVICE_AUGMENTS, MAX_MAGNITUDE, RandAugmentConfig, make_device_augment, rand_augment,
                          rand_augment_batch)

__all__ = ["DEVICE_AUGMENTS", "MAX_MAGNITUDE", "MixConfig", "RANDAUGMENT_OPS", "RandAugmentConfig",
           "make_device_augment", "mix", "partner_rows", "rand_augment", "rand_augment_batch",
           "smooth_targets"]
