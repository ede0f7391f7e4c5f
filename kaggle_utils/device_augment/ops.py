"""RandAugment's operations in JAX: :mod:`kaggle_utils.randaugment_ops` on JAX's primitives, jittable with a traced
``level``; ``uint8 [H, W, 3] image, level in [-1, 1] -> uint8 [H, W, 3]``, equal to the TF ones."""
import functools
from types import SimpleNamespace

import jax.numpy as jnp
from jax import lax

from .. import randaugment_ops

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
