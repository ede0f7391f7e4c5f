"""timm state_dict -> Flax variables, by a few generic rules (no per-model table).

The Flax tree mirrors timm's module names, so converting is renaming plus layout:
``blocks.3.11.conv_pw.weight`` -> ``params/blocks_3_11/conv_pw/kernel`` (OIHW -> HWIO), BatchNorm's
tensors -> ``params/{scale,bias}`` and ``batch_stats/{mean,var}``, Linear ``(out, in)`` -> ``(in, out)``.
"""
import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from kaggle_utils.checkpoint import CheckpointError, check_tree
from kaggle_utils.efficientnet import create_model, resolve_name
from kaggle_utils.variable_trees import abstract_variables, unflatten

_BLOCK = re.compile(r"^blocks\.(\d+)\.(\d+)\.")
# timm leaf -> (collection, Flax leaf): a BatchNorm's tensors by name (in fp32)
_BN_RULES = {"weight": ("params", "scale"), "bias": ("params", "bias"),
             "running_mean": ("batch_stats", "mean"), "running_var": ("batch_stats", "var")}
# (timm leaf, rank) -> (Flax leaf, axes): every other module's tensors by name and rank, transposed to Flax's layout
_RULES = {("weight", 4): ("kernel", (2, 3, 1, 0)),  # conv OIHW -> HWIO
          ("weight", 2): ("kernel", (1, 0)),  # Linear (out, in) -> Dense (in, out)
          ("bias", 1): ("bias", (0,))}


class ConversionError(CheckpointError):
    """The checkpoint does not fit the named Flax model; the message names the keys."""


def flax_name(module_path: str) -> list[str]:
    """``'blocks.3.11.se.conv_reduce'`` -> ``['blocks_3_11', 'se', 'conv_reduce']``."""
    module_path = _BLOCK.sub(lambda m: f"blocks_{m.group(1)}_{m.group(2)}.", module_path + ".").rstrip(".")
    return module_path.split(".") if module_path else []


def is_batchnorm_counter(key: str) -> bool:
    """BatchNorm's ``num_batches_tracked``: a step count, not a weight (Flax has no place for it; exports omit it)."""
    return key.rpartition(".")[2] == "num_batches_tracked"


def _to_numpy(value) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch.Tensor
        value = value.detach().cpu().float().numpy() if value.is_floating_point() else value.detach().cpu().numpy()
    return np.asarray(value)


def convert_state_dict(state_dict: Mapping[str, Any]) -> dict:
    """Applies the generic rules to every tensor; no knowledge of the architecture."""
    bn_modules = {k.rsplit(".", 1)[0] for k in state_dict if k.endswith(".running_mean") or k == "running_mean"}
    flat: dict[str, np.ndarray] = {}
    for key, tensor in state_dict.items():
        if is_batchnorm_counter(key):
            continue
        module, _, leaf = key.rpartition(".")
        value = _to_numpy(tensor)
        if module in bn_modules and leaf in _BN_RULES:
            (collection, name), value = _BN_RULES[leaf], value.astype(np.float32)
        elif module not in bn_modules and (leaf, value.ndim) in _RULES:
            (name, axes), collection = _RULES[leaf, value.ndim], "params"
            value = value.transpose(axes)
        else:
            raise ConversionError(f"no conversion rule for {key!r} with shape {value.shape}"
                                  + (" (a BatchNorm tensor)" if module in bn_modules else ""))
        flat["/".join([collection, *flax_name(module), name])] = value
    return {"params": {}, "batch_stats": {}, **unflatten(flat)}


def convert_timm(model_or_state_dict, name: str, *, num_classes: int | None = None) -> dict:
    """Converts a timm EfficientNet (module or state_dict) into ``{"params", "batch_stats"}``, checked against
    ``create_model(name, num_classes=...)`` (default: the checkpoint's classifier): a key that does not fit is a
    :class:`ConversionError`."""
    name = resolve_name(name)
    source = model_or_state_dict
    state_dict = source.state_dict() if hasattr(source, "state_dict") else source
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"expected a torch module or a state_dict, got {type(source).__name__}")
    variables = convert_state_dict(state_dict)
    head = state_dict.get("classifier.weight")
    if num_classes is None:
        num_classes = int(head.shape[0]) if head is not None else 0
    model = create_model(name, num_classes=num_classes)
    expected = abstract_variables(model, jax.ShapeDtypeStruct((1, 64, 64, 3), jnp.float32))
    try:
        check_tree(variables, expected, what=f"timm checkpoint converted for {name} (num_classes={num_classes})")
    except CheckpointError as e:
        raise ConversionError(str(e)) from None
    return variables
