"""The training state: everything a step reads and writes, a pytree of arrays only (replicated, donated, saved).

Weights and optimizer state stay float32 whatever the compute dtype (bf16 moments lose small updates). ``rng``
never changes: keys come from ``(rng, step, replica)``, so a resumed run draws the uninterrupted one's keys.
"""
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import struct

from .. import variable_trees
from ..precision import LossScale

__all__ = ["TrainState", "create_train_state", "inference_state", "init_variables"]


@struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    rng: jax.Array
    ema_params: Any = None
    loss_scale: Any = None  # precision.LossScale with fp16 compute

    def variables(self, *, ema: bool = True) -> dict:
        """Model variables for evaluation: the EMA weights when the state keeps them."""
        params = self.ema_params if ema and self.ema_params is not None else self.params
        return {"params": params, "batch_stats": self.batch_stats}


def _fp32(tree):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32) if jnp.issubdtype(x.dtype, jnp.floating) else
                        jnp.asarray(x), tree)


def create_train_state(variables: dict, tx: optax.GradientTransformation, *, seed: int = 0,
                       ema: bool = False, loss_scale: bool = False) -> TrainState:
    """A fresh fp32 state from model variables; ``loss_scale``: keep fp16's dynamic scale (``precision.LossScale``)."""
    if "params" not in variables:
        raise KeyError(f"variables need a 'params' collection; got {sorted(variables)}")
    params = _fp32(variables["params"])
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        batch_stats=_fp32(variables.get("batch_stats", {})),
        opt_state=tx.init(params),
        rng=jax.random.key_data(jax.random.key(seed)),
        ema_params=jax.tree.map(jnp.copy, params) if ema else None,
        loss_scale=LossScale.create() if loss_scale else None,
    )


def inference_state(variables: dict) -> TrainState:
    """A state that only evaluates / predicts: the variables, no optimizer state."""
    return TrainState(step=jnp.zeros((), jnp.int32), params=variables["params"],
                      batch_stats=variables.get("batch_stats", {}), opt_state=(),
                      rng=jax.random.key_data(jax.random.key(0)))


def init_variables(model, image_size: int, *, seed: int = 0, channels: int = 3) -> dict:
    """Random ``params`` / ``batch_stats`` of an image model for square inputs
    (:func:`kaggle_utils.variable_trees.init_variables`: a jitted init, faster to compile on CPU)."""
    shape = jax.ShapeDtypeStruct((1, image_size, image_size, channels), jnp.float32)
    variables = variable_trees.init_variables(model, shape, seed=seed)
    return {k: v for k, v in variables.items() if k in ("params", "batch_stats")}
