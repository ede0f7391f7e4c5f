"""EfficientNet / EfficientNetV2 / Lite in Flax, numerically equal to timm; imports only jax, flax and numpy.

``arch``: block strings, builder, registry; ``layers``: padding/BN/conv rules; ``blocks``; ``model``.
"""
from .arch import BlockConfig, ModelSpec, build_blocks, get_spec, list_models, pretrained_cfg, resolve_name
from .layers import LayerCfg, conv2d
from .model import EfficientNet, create_model, efficientnet_v2_pretrained, load_weights

__all__ = ["BlockConfig", "EfficientNet", "LayerCfg", "ModelSpec", "build_blocks", "conv2d", "create_model",
           "efficientnet_v2_pretrained", "get_spec", "list_models", "load_weights", "pretrained_cfg", "resolve_name"]
