"""Input channels: an RGB model's stem changed for grey or multi-band images, as timm does."""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from ..variable_trees import Patterns, VariableTreeError, flatten, listing, path_name, select_paths


@dataclasses.dataclass(frozen=True)
class ChannelReport:
    """What :func:`adapt_input_channels` did to which kernel."""

    path: str
    old_shape: tuple[int, ...]
    new_shape: tuple[int, ...]
    rule: str

    def __str__(self) -> str:
        return f"{self.path}: {self.old_shape} -> {self.new_shape} ({self.rule})"


def _stem_kernel(flat: dict, kernel: Patterns | None) -> str:
    if kernel is not None:
        hits = sorted(select_paths(flat, kernel, "adapt_input_channels kernel"))
    else:  # the one convolution that reads RGB: a 4-D HWIO kernel with 3 input channels
        hits = [p for p, leaf in flat.items() if np.ndim(leaf) == 4 and np.shape(leaf)[2] == 3]
    if len(hits) != 1:
        raise VariableTreeError(f"adapt_input_channels: cannot tell the stem kernel: {len(hits)} candidates "
                                f"({listing(hits) or 'no 4-D kernel with 3 input channels'}); pass kernel=<pattern>")
    return hits[0]


def adapt_input_channels(variables: dict, in_chans: int, *, kernel: Patterns | None = None
                         ) -> tuple[dict, ChannelReport]:
    """The stem convolution of an RGB model changed for ``in_chans`` input channels, as timm does.

    1 channel: the kernel summed over RGB (a grey image gives what its RGB copy gave); more: the RGB kernel
    repeated, scaled by ``3 / in_chans``. ``kernel``: the stem's pattern, when it is not the only 4-D kernel
    with 3 input channels. The module needs no change (its convolutions read the width from the input).
    """
    if in_chans < 1:
        raise VariableTreeError(f"adapt_input_channels: in_chans must be >= 1, got {in_chans}")
    flat = flatten(variables)
    path = _stem_kernel(flat, kernel)
    old = flat[path]
    if np.shape(old)[2] != 3:
        raise VariableTreeError(f"adapt_input_channels: {path} has shape {np.shape(old)}: expected an HWIO kernel "
                                "with 3 input channels")
    w = jnp.asarray(old, jnp.float32)
    if in_chans == 1:
        new, rule = w.sum(axis=2, keepdims=True), "summed over RGB"
    elif in_chans == 3:
        new, rule = w, "unchanged"
    else:
        new = jnp.tile(w, (1, 1, math.ceil(in_chans / 3), 1))[:, :, :in_chans] * (3.0 / in_chans)
        rule = f"RGB repeated, scaled by 3/{in_chans}"
    new = new.astype(old.dtype)
    tree = jax.tree.map_with_path(lambda kp, leaf: new if path_name(kp) == path else leaf, variables)
    return tree, ChannelReport(path, tuple(np.shape(old)), tuple(new.shape), rule)
