"""RandAugment on the accelerator: the TF-native :class:`kaggle_utils.data.RandAugment`'s policy from a JAX key,
its ops (:mod:`kaggle_utils.randaugment_ops`) on JAX's primitives, equal to the TF ones.

Under ``vmap`` a ``lax.switch`` with a per-image index computes every branch, so the five geometric ops
share one branch (one warp per slot, not five); ``sequential=True`` (``lax.map``: each image runs only its
branch) is worth it on a CPU, rarely on an accelerator.
"""
import dataclasses
import functools
from types import SimpleNamespace
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from .. import randaugment_ops
from ..randaugment_ops import MAX_MAGNITUDE, check_policy

# randaugment_ops' primitives in JAX, rounding as the TF ones
JAX_PRIMITIVES = SimpleNamespace(
    float32=lambda x: jnp.asarray(x, jnp.float32), int32=lambda x: jnp.asarray(x, jnp.int32),
    uint8=lambda x: jnp.asarray(x).astype(jnp.uint8),
    round_to_uint8=lambda x: jnp.clip(x + 0.5, 0.0, 255.0).astype(jnp.uint8),  # TF's saturate_cast(x + 0.5)
    arange=lambda n, dtype="int32": jnp.arange(n, dtype=dtype), zeros=lambda shape: jnp.zeros(shape, jnp.int32),
    meshgrid=jnp.meshgrid, reshape=jnp.reshape, stack=jnp.stack, concat=jnp.concatenate, pad=jnp.pad,
    take=lambda x, index: jnp.take(x, index, axis=0, mode="clip"),
    take_along_rows=lambda x, index: jnp.take_along_axis(x, index[:, None], axis=1)[:, 0],
    where=jnp.where, clip=jnp.clip, maximum=jnp.maximum, round=jnp.round, abs=jnp.abs, cos=jnp.cos, sin=jnp.sin,
    sum=jnp.sum, mean=jnp.mean, cumsum=jnp.cumsum,
    min=lambda x, axis: jnp.min(x, axis=tuple(axis)), max=lambda x, axis: jnp.max(x, axis=tuple(axis)),
    histogram=lambda values, size: jnp.zeros(size, jnp.int32).at[values].add(1, mode="drop"),
    last_nonzero=lambda x: x.shape[1] - 1 - jnp.argmax(x[:, ::-1] > 0, axis=1),
    identity_product=lambda x: jnp.dot(x, jnp.eye(x.shape[-1], dtype=jnp.float32), precision=lax.Precision.HIGHEST),
    left_shift=lambda a, b: jnp.left_shift(jnp.int32(a), b), bitwise_and=jnp.bitwise_and,
)
RANDAUGMENT_OPS = randaugment_ops.op_table(JAX_PRIMITIVES)
WARP_MATRICES = randaugment_ops.warp_matrices(JAX_PRIMITIVES)
warp = functools.partial(randaugment_ops.warp, JAX_PRIMITIVES)


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
