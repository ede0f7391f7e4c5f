"""Small model and in-memory data shared by the training-engine tests (fast on CPU).

The tiny CNN follows the kit's model contract: a forward with ``batch_stats`` mutable is a
training forward (batch statistics, dropout), anything else is evaluation.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_digits


class TinyCNN(nn.Module):
    num_classes: int = 10
    bn_axis_name: str | None = None  # "data": synchronised BN, as create_model(..., bn_axis_name="data")
    drop_rate: float = 0.0
    dtype: Any = jnp.float32  # compute dtype; parameters stay float32

    @nn.compact
    def __call__(self, x, train: bool | None = None):
        if train is None:
            train = self.is_mutable_collection("batch_stats") and not self.is_initializing()
        # no conv bias before BN: its gradient is zero up to rounding, which Adam would amplify
        x = nn.Conv(16, (3, 3), use_bias=False, dtype=self.dtype)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, dtype=self.dtype,
                         axis_name=self.bn_axis_name if train else None)(x)
        x = nn.relu(x)
        x = nn.Conv(16, (3, 3), strides=2, dtype=self.dtype)(x)
        x = nn.relu(x).reshape(x.shape[0], -1)
        x = nn.Dropout(self.drop_rate, deterministic=not train)(x)
        return nn.Dense(self.num_classes, dtype=self.dtype)(x).astype(jnp.float32)


def digits(split: str = "train"):
    """sklearn's 8x8 digits as uint8 RGB images: (images [N, 8, 8, 3], labels [N])."""
    d = load_digits()
    images = np.repeat((d.images * 255.0 / 16.0).round().astype(np.uint8)[..., None], 3, axis=-1)
    labels = d.target.astype(np.int32)
    cut = 1400
    return (images[:cut], labels[:cut]) if split == "train" else (images[cut:], labels[cut:])


def batches(images, labels, batch_size: int, *, shuffle_seed: int | None = None, pad: bool = True):
    """Host batches in the pipeline's format; the last one padded and masked when ``pad``."""
    order = np.arange(len(labels))
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(order)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        if len(idx) < batch_size and not pad:
            return
        mask = np.zeros(batch_size, bool)
        mask[:len(idx)] = True
        idx = np.concatenate([idx, np.zeros(batch_size - len(idx), idx.dtype)])
        yield {"image": images[idx], "label": labels[idx], "mask": mask}


def masked_rows(dataset, *keys: str) -> tuple[np.ndarray, ...]:
    """The real rows (``mask`` True) of every batch of a host dataset, one array per key; the dataset is closed."""
    try:
        batches = list(dataset)
    finally:
        dataset.close()
    return tuple(np.concatenate([b[key][b["mask"]] for b in batches]) for key in keys)
