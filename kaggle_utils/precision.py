"""The precision a run computes in, chosen from the device, and fp16's dynamic loss scaling.

``fp32`` on CPUs; ``bf16`` compute (fp32 weights, optimizer state, BN statistics, loss) on TPUs and GPUs of
compute capability 8.0+; ``fp16`` on GPUs without bf16 units (T4, V100), with a dynamic loss scale as
PyTorch's ``GradScaler`` (a step with an inf or NaN gradient is skipped, ``TrainState.step`` still counts it).
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

INITIAL_SCALE = 2.0 ** 15  # Flax's DynamicScale; GradScaler starts at 2^16 and halves on the first overflow
GROWTH_INTERVAL = 2000  # finite steps in a row before the scale doubles (both libraries' default)
MIN_SCALE = 1.0  # below 1 a scale cannot help: the overflow is in the forward pass, not in small gradients
MAX_SKIPS_IN_ROW = 25  # more consecutive overflows than halvings from 2^15 to 1 (15): the run diverged
PRECISIONS = ("fp32", "bf16", "fp16")
_DTYPES = {"fp32": jnp.float32, "bf16": jnp.bfloat16, "fp16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class Precision:
    """One of :data:`PRECISIONS`: the model's compute dtype, and whether gradients need loss scaling."""

    name: str

    def __post_init__(self):
        if self.name not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.name!r}")

    @property
    def compute_dtype(self) -> Any:
        return _DTYPES[self.name]

    @property
    def loss_scaling(self) -> bool:
        return self.name == "fp16"

    def describe(self) -> str:
        return {"fp32": "fp32", "bf16": "bf16 compute, fp32 weights",
                "fp16": "fp16 + loss scaling, fp32 weights"}[self.name]


def choose_precision(requested: str = "auto", device=None) -> tuple[Precision, str]:
    """``(precision, why)`` for ``requested`` ("auto" or a name) on ``device`` (default: the first one);
    ``why`` is what the plan prints, e.g. "Tesla T4, compute 7.5, no bf16 hardware"."""
    device = jax.devices()[0] if device is None else device
    kind = getattr(device, "device_kind", device.platform)
    if requested != "auto":
        return Precision(requested), f"asked for ({kind})"
    if device.platform == "tpu":
        return Precision("bf16"), f"{kind}: bf16 matrix units"
    if device.platform == "gpu":
        try:
            capability = float(device.compute_capability)
        except (AttributeError, TypeError, ValueError):  # a backend that does not say
            capability = None
        if capability is not None and capability >= 8.0:
            return Precision("bf16"), f"{kind}, compute {capability:g}: bf16 hardware"
        shown = f"compute {capability:g}" if capability is not None else "compute capability unknown"
        return Precision("fp16"), f"{kind}, {shown}, no bf16 hardware"
    return Precision("fp32"), f"{kind}: no fast half precision"


@struct.dataclass
class LossScale:
    """fp16's dynamic loss scale, part of the training state (so resume restores it exactly)."""

    scale: jax.Array  # float32
    good_steps: jax.Array  # finite steps since the last change of scale
    skipped: jax.Array  # steps skipped since the run began
    skipped_in_row: jax.Array  # consecutive skipped steps up to now

    @classmethod
    def create(cls, initial: float = INITIAL_SCALE) -> "LossScale":
        counters = (jnp.zeros((), jnp.int32) for _ in range(3))  # a donated state may not hold one buffer twice
        return cls(jnp.asarray(initial, jnp.float32), *counters)

    def update(self, finite: jax.Array) -> "LossScale":
        """The scale after a step whose gradients were ``finite`` (a scalar bool)."""
        grow = finite & (self.good_steps + 1 >= GROWTH_INTERVAL)
        scale = jnp.where(finite, jnp.where(grow, self.scale * 2.0, self.scale),
                          jnp.maximum(self.scale * 0.5, MIN_SCALE))
        one = jnp.ones((), jnp.int32)
        return LossScale(scale=scale, good_steps=jnp.where(finite & ~grow, self.good_steps + one, 0),
                         skipped=self.skipped + jnp.where(finite, 0, one),
                         skipped_in_row=jnp.where(finite, 0, self.skipped_in_row + one))


def overflow_verdict(scale: LossScale) -> str | None:
    """Why scaling cannot fix these overflows (a host ``LossScale``), or None while skips are normal."""
    in_row, value = int(scale.skipped_in_row), float(scale.scale)
    if in_row >= MAX_SKIPS_IN_ROW or (in_row and value <= MIN_SCALE):
        floor = " (its floor)" if value <= MIN_SCALE else ""
        return f"fp16 gradients overflowed {in_row} step(s) in a row, loss scale {value:g}{floor}"
    return None


def all_finite(tree) -> jax.Array:
    """True when every element of every leaf is finite (one fused reduction)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))
