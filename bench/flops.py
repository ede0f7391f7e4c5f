"""FLOPs of a training step and the dense peak FLOP/s of known cards: what share of a GPU a step reaches.

Used by model_speed.py's GPU modes; kept apart so the timing script stays about timing.
"""
from __future__ import annotations

# dense peak TFLOP/s by card (the vendors' datasheets): fp32 without TF32, fp16 and bf16 on tensor cores
PEAK_TFLOPS = {"T4": {"fp32": 8.1, "fp16": 65.0}, "P100": {"fp32": 9.3, "fp16": 18.7},
               "V100": {"fp32": 15.7, "fp16": 125.0}, "A100": {"fp32": 19.5, "fp16": 312.0, "bf16": 312.0},
               "L4": {"fp32": 30.3, "fp16": 121.0, "bf16": 121.0},
               "H100": {"fp32": 67.0, "fp16": 989.0, "bf16": 989.0}, "H200": {"fp32": 67.0, "fp16": 989.0, "bf16": 989.0}}


def train_flops_per_image(name: str, timm_model, size: int) -> float | None:
    """3x one forward's FLOPs as XLA counts them (backward ~ 2x forward); None where XLA gives no count."""
    import jax
    import jax.numpy as jnp

    from kaggle_utils.efficientnet import create_model
    from kaggle_utils.surgery import count_flops
    from kaggle_utils.variable_trees import VariableTreeError
    from weights_port.convert import convert_timm

    model = create_model(name, num_classes=timm_model.num_classes)
    variables = jax.tree.map(jnp.asarray, convert_timm(timm_model, name))
    try:
        return 3 * count_flops(model, variables, jnp.zeros((1, size, size, 3), jnp.float32))
    except VariableTreeError:
        return None


def peak_tflops(device_kind: str, precision: str) -> float | None:
    """The card's dense peak for ``precision`` from :data:`PEAK_TFLOPS` (None: card or precision unknown)."""
    for card, peaks in PEAK_TFLOPS.items():
        if card in device_kind:
            return peaks.get(precision)
    return None
