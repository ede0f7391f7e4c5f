"""Mixup and CutMix with ``timm.data.Mixup``'s semantics, on the device inside the jitted train step.

Each row mixes with its partner in the batch reversed over the real rows only (``mask``): padding never
mixes, and with an odd count the middle row is its own partner. Randomness comes only from the key. The targets
may be one array (labels, smoothed here as timm does) or a mapping of per-example float fields (a task's targets:
labels, a teacher's probabilities, weights), each blended with the same partner and lambda as the images.
"""
import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class MixConfig:
    """timm ``Mixup`` arguments (same names and defaults); hashable, so a static part of a jitted step."""

    num_classes: int
    mixup_alpha: float = 1.0  # Mixup is enabled when > 0
    cutmix_alpha: float = 0.0  # CutMix is enabled when > 0 (or when cutmix_minmax is set)
    cutmix_minmax: tuple[float, float] | None = None  # box side ratios instead of alpha, e.g. (0.2, 0.8)
    prob: float = 1.0  # of mixing a batch (or an element)
    switch_prob: float = 0.5  # of CutMix instead of Mixup when both are enabled
    mode: str = "batch"  # "batch" | "elem"
    correct_lam: bool = True  # lambda from the clipped CutMix box's area
    label_smoothing: float = 0.1
    multi_label: bool = False  # float targets are independent labels: smoothed towards 0.5, as timm

    def __post_init__(self):
        if self.num_classes < 1:
            raise ValueError(f"MixConfig.num_classes must be >= 1, got {self.num_classes}")
        if self.mode not in ("batch", "elem"):
            raise ValueError(f"MixConfig.mode must be 'batch' or 'elem', got {self.mode!r}")
        for name in ("prob", "switch_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"MixConfig.{name} must be in [0, 1], got {getattr(self, name)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"MixConfig.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.mixup_alpha < 0 or self.cutmix_alpha < 0:
            raise ValueError(f"MixConfig alphas must be >= 0, got mixup_alpha={self.mixup_alpha}, "
                             f"cutmix_alpha={self.cutmix_alpha}")
        if self.cutmix_minmax is not None:
            low, high = self.cutmix_minmax
            if not 0.0 < low < high <= 1.0:
                raise ValueError(f"MixConfig.cutmix_minmax must be (low, high) with 0 < low < high <= 1, "
                                 f"got {self.cutmix_minmax}")
            object.__setattr__(self, "cutmix_minmax", (float(low), float(high)))
        if not (self.mixup_enabled or self.cutmix_enabled):
            raise ValueError("MixConfig mixes nothing: set mixup_alpha > 0, cutmix_alpha > 0 or cutmix_minmax "
                             "(or do not call mix)")

    @property
    def mixup_enabled(self) -> bool:
        return self.mixup_alpha > 0

    @property
    def cutmix_enabled(self) -> bool:
        return self.cutmix_alpha > 0 or self.cutmix_minmax is not None


def smooth_targets(labels: jax.Array, config: MixConfig) -> jax.Array:
    """Integer labels ``[B]`` or float targets ``[B, C]`` -> smoothed float32 targets ``[B, C]``, as timm's
    ``mixup_target``: one-hot with ``off = s / C``, ``on = 1 - s + off``; float targets as distributions
    (``y (1 - s) + s / C``) or, with ``multi_label``, as independent labels (``y (1 - s) + s / 2``)."""
    s, c = config.label_smoothing, config.num_classes
    if jnp.issubdtype(labels.dtype, jnp.integer):
        if labels.ndim != 1:
            raise ValueError(f"integer labels must be [B], got shape {labels.shape}")
        off = s / c
        return jnp.where(jax.nn.one_hot(labels, c, dtype=jnp.bool_), 1.0 - s + off, off).astype(jnp.float32)
    if labels.ndim != 2 or labels.shape[1] != c:
        raise ValueError(f"float targets must be [B, num_classes={c}], got shape {labels.shape}")
    labels = labels.astype(jnp.float32)
    return labels * (1.0 - s) + (0.5 * s if config.multi_label else s / c)


def partner_rows(mask: jax.Array) -> jax.Array:
    """Index of each row's partner: the batch reversed over the real rows; padded rows are their own."""
    size = mask.shape[0]
    real_first = jnp.argsort(~mask, stable=True)  # real rows in order, then the padding
    rank = jnp.cumsum(mask) - 1
    count = jnp.sum(mask)
    partner = real_first[jnp.clip(count - 1 - rank, 0, size - 1)]
    return jnp.where(mask, partner, jnp.arange(size))


def _draw(key: jax.Array, shape: tuple, config: MixConfig):
    """``(mixed?, cutmix?, lambda)`` for one batch (``shape=()``) or per element (``(B,)``)."""
    k_apply, k_switch, k_lam = jax.random.split(key, 3)
    mixed = jax.random.uniform(k_apply, shape) < config.prob
    if config.mixup_enabled and config.cutmix_enabled:
        cutmix = jax.random.uniform(k_switch, shape) < config.switch_prob
    else:
        cutmix = jnp.full(shape, config.cutmix_enabled)
    # with cutmix_minmax the box sets lambda, so its alpha only has to be a valid Beta parameter
    alpha = jnp.where(cutmix, config.cutmix_alpha if config.cutmix_alpha > 0 else 1.0,
                      config.mixup_alpha if config.mixup_alpha > 0 else 1.0)
    # Beta(alpha, alpha) from one log-gamma draw of both parts (jax.random.beta runs two slow-to-compile
    # samplers); in log space, so small alphas do not underflow to 0/0
    log_gamma = jax.random.loggamma(k_lam, jnp.broadcast_to(alpha, (2, *alpha.shape)))
    lam = jnp.exp(log_gamma[0] - jnp.logaddexp(log_gamma[0], log_gamma[1]))
    return mixed, cutmix & mixed, jnp.where(mixed, lam, 1.0)


def _span(key: jax.Array, size: int, lam: jax.Array, config: MixConfig) -> tuple[jax.Array, jax.Array]:
    """[low, high) of the CutMix box along one axis of ``size`` pixels (timm's rand_bbox / _minmax)."""
    k_cut, k_pos = jax.random.split(key)
    if config.cutmix_minmax is not None:
        low, high = config.cutmix_minmax
        cut = jax.random.randint(k_cut, (), int(size * low), int(size * high))
        start = jax.random.randint(k_pos, (), 0, size - cut + 1)
        return start, start + cut
    cut = jnp.floor(size * jnp.sqrt(1.0 - lam)).astype(jnp.int32)
    centre = jax.random.randint(k_pos, (), 0, size)
    return jnp.clip(centre - cut // 2, 0, size), jnp.clip(centre + (cut + 1) // 2, 0, size)


def _box(key: jax.Array, height: int, width: int, lam: jax.Array, config: MixConfig):
    """``(box mask [H, W], lambda)`` for one image shape and one drawn lambda."""
    k_y, k_x = jax.random.split(key)
    y_low, y_high = _span(k_y, height, lam, config)
    x_low, x_high = _span(k_x, width, lam, config)
    ys, xs = jnp.arange(height)[:, None], jnp.arange(width)[None, :]
    box = (ys >= y_low) & (ys < y_high) & (xs >= x_low) & (xs < x_high)
    if config.correct_lam or config.cutmix_minmax is not None:
        lam = 1.0 - ((y_high - y_low) * (x_high - x_low)).astype(jnp.float32) / (height * width)
    return box, lam


def mix(key: jax.Array, images: jax.Array, labels: jax.Array | Mapping[str, jax.Array], mask: jax.Array | None,
        config: MixConfig) -> tuple[jax.Array, jax.Array | dict[str, jax.Array]]:
    """Mix one replica's float images ``[B, H, W, C]`` and their targets: labels (integer ``[B]`` or float
    ``[B, C]``) -> ``(images, soft targets [B, C])``; a mapping of float fields ``[B, ...]`` -> ``(images, the
    fields mixed alike)`` (not smoothed: a task's targets are). ``mask``: bool ``[B]``, False for padding rows (None:
    all real)."""
    if images.ndim != 4 or not jnp.issubdtype(images.dtype, jnp.floating):
        raise ValueError(f"mix takes float images [B, H, W, C] (normalised), got {images.dtype} {images.shape}")
    batch, height, width = images.shape[:3]
    mask = jnp.ones(batch, bool) if mask is None else mask.astype(bool)
    fields = dict(labels) if isinstance(labels, Mapping) else {"targets": smooth_targets(labels, config)}
    for name, rows in fields.items():
        if rows.shape[:1] != (batch,) or not jnp.issubdtype(rows.dtype, jnp.floating):
            raise ValueError(f"mix: {name} {rows.dtype} {rows.shape} is not a float field of the batch's {batch} "
                             "rows (integer labels go alone, to be smoothed)")
    if mask.shape != (batch,):
        raise ValueError(f"mix: images {images.shape} and mask {mask.shape} disagree on B")
    k_draw, k_box = jax.random.split(key)
    shape = () if config.mode == "batch" else (batch,)
    mixed, cutmix, lam = _draw(k_draw, shape, config)
    if config.cutmix_enabled:
        if config.mode == "batch":
            box, box_lam = _box(k_box, height, width, lam, config)
        else:
            box, box_lam = jax.vmap(_box, in_axes=(0, None, None, 0, None))(
                jax.random.split(k_box, batch), height, width, lam, config)
        lam = jnp.where(cutmix, box_lam, lam)
    else:
        box = jnp.zeros((height, width), bool)
    partner = partner_rows(mask)
    keep = mask & mixed

    def blend(rows):  # a row and its partner's, by lambda; padding and unmixed rows as they were
        extra = (1,) * (rows.ndim - 1)
        lam_rows = lam.reshape(lam.shape + extra).astype(rows.dtype)
        return jnp.where(keep.reshape(keep.shape + extra), rows * lam_rows + rows[partner] * (1 - lam_rows), rows)

    pasted = jnp.where(box[..., None], images[partner], images)
    out = jnp.where(cutmix.reshape(cutmix.shape + (1, 1, 1)), jnp.where(keep[:, None, None, None], pasted, images),
                    blend(images))
    mixed_fields = {name: blend(rows) for name, rows in fields.items()}
    return out, mixed_fields if isinstance(labels, Mapping) else mixed_fields["targets"]
