"""RandAugment on the accelerator: the TF-native :class:`kaggle_utils.data.RandAugment`'s policy from a JAX key.

Under ``vmap`` a ``lax.switch`` with a per-image index computes every branch, so the five geometric ops
share one branch (one warp per slot, not five); ``sequential=True`` (``lax.map``: each image runs only its
branch) is worth it on a CPU, rarely on an accelerator.
"""
import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from ..randaugment_ops import MAX_MAGNITUDE, check_policy
from .ops import RANDAUGMENT_OPS, WARP_MATRICES, warp


@dataclasses.dataclass(frozen=True)
class RandAugmentConfig:
    """RandAugment(num_ops, magnitude) settings; hashable, so a static argument of a jitted step."""

    num_ops: int = 2
    magnitude: float | tuple[float, float] = 15  # m, or (low, high) drawn uniformly per slot
    ops: tuple[str, ...] = tuple(RANDAUGMENT_OPS)
    flip: bool = True  # mirror half the images left-right first, as imgaug's and the TF RandAugment
    sequential: bool = False  # lax.map over the batch instead of vmap (see the module docstring)

    def __post_init__(self):
        object.__setattr__(self, "magnitude", check_policy("RandAugmentConfig", self.num_ops, self.magnitude, self.ops))
        object.__setattr__(self, "ops", tuple(self.ops))


def _branches(ops: Sequence[str]) -> tuple[list[Callable], jax.Array]:
    """Switch branches ``(image, level, op_index) -> image`` and each op's branch: the geometric ops share one
    warp branch, whose matrix the op index picks (an op that is not geometric never reaches it: identity)."""
    pixel_ops = [name for name in ops if name not in WARP_MATRICES]
    branches = [lambda image, level, index, fn=RANDAUGMENT_OPS[name]: fn(image, level) for name in pixel_ops]
    branch_of_op = [pixel_ops.index(name) if name in pixel_ops else len(pixel_ops) for name in ops]
    if len(pixel_ops) < len(ops):
        matrices = [WARP_MATRICES.get(name, lambda level, shape: jnp.eye(2, 3).reshape(-1)) for name in ops]
        branches.append(lambda image, level, index: warp(image, lax.switch(
            index, [functools.partial(matrix, shape=image.shape) for matrix in matrices], level)))
    return branches, jnp.asarray(branch_of_op, jnp.int32)


def rand_augment(key: jax.Array, image: jax.Array, config: RandAugmentConfig = RandAugmentConfig()) -> jax.Array:
    """One uint8 ``[H, W, 3]`` image, augmented with its own draws from ``key``."""
    if image.ndim != 3 or image.shape[-1] != 3 or image.dtype != jnp.uint8:
        raise ValueError(f"rand_augment needs a uint8 image [H, W, 3], got {image.dtype} {image.shape}")
    num_ops = config.num_ops
    draws = jax.random.uniform(key, (3 * num_ops + 1,))
    if config.flip:
        image = jnp.where(draws[-1] < 0.5, image[:, ::-1], image)
    low, high = config.magnitude
    branches, branch_of_op = _branches(config.ops)
    count = len(config.ops)

    def apply_one_op(slot, image):  # a loop, not unrolled: the ops are traced and compiled once
        which, sign_draw, magnitude_draw = draws[3 * slot], draws[3 * slot + 1], draws[3 * slot + 2]
        index = jnp.minimum((which * count).astype(jnp.int32), count - 1)
        sign = jnp.where(sign_draw < 0.5, -1.0, 1.0)
        level = sign * (low + magnitude_draw * (high - low)) / MAX_MAGNITUDE
        return lax.switch(branch_of_op[index], branches, image, level, index)

    return lax.fori_loop(0, num_ops, apply_one_op, image) if num_ops else image


def rand_augment_batch(key: jax.Array, images: jax.Array,
                       config: RandAugmentConfig = RandAugmentConfig()) -> jax.Array:
    """uint8 ``[B, H, W, 3]``: every image with its own key (``jax.random.split(key, B)``)."""
    if images.ndim != 4:
        raise ValueError(f"rand_augment_batch needs a uint8 batch [B, H, W, 3], got {images.dtype} {images.shape}")
    keys = jax.random.split(key, images.shape[0])
    if config.sequential:
        return lax.map(lambda pair: rand_augment(pair[0], pair[1], config), (keys, images))
    return jax.vmap(rand_augment, in_axes=(0, 0, None))(keys, images, config)


DEVICE_AUGMENTS = {"randaugment-device": RandAugmentConfig()}


def make_device_augment(name_or_config: str | RandAugmentConfig | None) -> Callable[[jax.Array, jax.Array], jax.Array]:
    """``augment`` argument -> ``fn(key, images_uint8 [B, H, W, 3]) -> images_uint8``, to call inside a jitted
    step with the replica's own key; ``None`` or ``"none"`` gives the identity, so a step calls it unconditionally."""
    if name_or_config is None or name_or_config == "none":
        return lambda key, images: images
    if isinstance(name_or_config, str):
        if name_or_config not in DEVICE_AUGMENTS:
            raise ValueError(f"device augment {name_or_config!r} is not known: use None, 'none', "
                             f"{', '.join(repr(k) for k in DEVICE_AUGMENTS)} or a RandAugmentConfig")
        name_or_config = DEVICE_AUGMENTS[name_or_config]
    if not isinstance(name_or_config, RandAugmentConfig):
        raise TypeError(f"device augment must be None, a name or a RandAugmentConfig, got "
                        f"{type(name_or_config).__name__}")
    return lambda key, images: rand_augment_batch(key, images, name_or_config)
