"""EfficientNet / EfficientNetV2 / Lite in Flax, numerically equal to timm.

``arch`` holds the block strings and the builder, ``layers`` the padding/BN/conv rules,
``blocks`` the four block types, ``model`` the network and weight loading.
``xla_cpu`` sets the XLA:CPU compiler option that the CPU path of ``layers.conv2d`` is
tuned for; it must run before JAX starts its backends, hence here, first. Imports only jax, flax and numpy.
"""
from . import xla_cpu

xla_cpu.apply()

from .arch import BlockConfig, ModelSpec, build_blocks, get_spec, list_models, pretrained_cfg, resolve_name  # noqa: E402
from .layers import LayerCfg, conv2d  # noqa: E402
from .model import EfficientNet, create_model, efficientnet_v2_pretrained, load_weights  # noqa: E402

__all__ = [
    "BlockConfig",
    "EfficientNet",
    "LayerCfg",
    "ModelSpec",
    "build_blocks",
    "conv2d",
    "create_model",
    "efficientnet_v2_pretrained",
    "get_spec",
    "list_models",
    "load_weights",
    "pretrained_cfg",
    "resolve_name",
]
