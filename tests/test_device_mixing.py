"""Device Mixup / CutMix: formulas, timm's targets, padding rows, determinism."""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from timm.data.mixup import mixup_target

from kaggle_utils.device_augment import MixConfig, mix, partner_rows

B, H, W, C = 8, 12, 10, 3
NUM_CLASSES = 10


# The formula tests call mix eagerly: its primitives compile once and serve every config, where a
# jitted mix compiles its gamma sampler again for each config. The jitted path (the train step's) is
# checked against the eager one in test_same_key_same_mix_other_key_other_mix.
run = mix
jitted_mix = jax.jit(mix, static_argnums=4)


def batch(seed=0):
    images = jax.random.normal(jax.random.key(seed), (B, H, W, C))
    return images, jnp.arange(B, dtype=jnp.int32)  # distinct labels: lambda is readable off the targets


def mixup_and_cutmix(mode: str) -> MixConfig:
    return MixConfig(NUM_CLASSES, mixup_alpha=1.0, cutmix_alpha=1.0, label_smoothing=0.1, mode=mode)


def box_of(changed: np.ndarray):
    """(rows, cols) spans of the True pixels, after checking they form one full rectangle."""
    rows, cols = np.flatnonzero(changed.any(1)), np.flatnonzero(changed.any(0))
    if rows.size == 0:
        return 0
    box = np.zeros_like(changed)
    box[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1] = True
    np.testing.assert_array_equal(changed, box)
    return box.sum()


def test_partners_are_the_real_rows_reversed():
    np.testing.assert_array_equal(partner_rows(jnp.ones(6, bool)), [5, 4, 3, 2, 1, 0])  # timm's flip
    mask = jnp.array([1, 0, 1, 1, 0, 1, 1], bool)
    np.testing.assert_array_equal(partner_rows(mask), [6, 1, 5, 3, 4, 2, 0])  # odd count: the middle stays


@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_mixup_images_follow_the_formula_and_targets_timms(mode):
    images, labels = batch()
    config = MixConfig(NUM_CLASSES, mixup_alpha=1.0, label_smoothing=0.0, mode=mode)
    out, targets = run(jax.random.key(1), images, labels, None, config)
    lam = np.asarray(targets)[np.arange(B), np.asarray(labels)]  # label smoothing off: on-value = lam
    x, partner = np.asarray(images), np.asarray(images)[::-1]
    np.testing.assert_allclose(np.asarray(out), lam[:, None, None, None] * x + (1 - lam[:, None, None, None]) * partner,
                               rtol=1e-6, atol=1e-6)
    if mode == "batch":
        assert np.allclose(lam, lam[0]) and 0 < lam[0] < 1
    else:
        assert len(np.unique(lam.round(6))) > 1


def test_targets_equal_timms_mixup_target_and_sum_to_one():
    smoothing = 0.1  # timm's default
    images, _ = batch()
    labels = jnp.array([3, 3, 0, 9, 1, 3, 7, 2], jnp.int32)
    config = MixConfig(NUM_CLASSES, mixup_alpha=0.4, label_smoothing=smoothing)
    out, targets = run(jax.random.key(5), images, labels, None, config)
    x, partner = np.asarray(images), np.asarray(images)[::-1]
    lam = float(np.median((np.asarray(out) - partner) / (x - partner)))  # lambda read off the images
    expected = mixup_target(torch.tensor(np.asarray(labels)), NUM_CLASSES, lam, smoothing).numpy()
    np.testing.assert_allclose(np.asarray(targets), expected, atol=1e-5)
    np.testing.assert_allclose(np.asarray(targets).sum(1), 1.0, atol=1e-6)


@pytest.mark.skipif("multi_label" not in inspect.signature(mixup_target).parameters,
                    reason="this timm's mixup_target has no multi_label (added after timm 1.0.26): no reference")
def test_multi_label_targets_equal_timms():
    images, _ = batch()
    multi_hot = (jax.random.uniform(jax.random.key(2), (B, NUM_CLASSES)) < 0.3).astype(jnp.float32)
    config = MixConfig(NUM_CLASSES, mixup_alpha=1.0, label_smoothing=0.2, multi_label=True)
    out, targets = run(jax.random.key(4), images, multi_hot, None, config)
    x, partner = np.asarray(images), np.asarray(images)[::-1]
    lam = float(np.median((np.asarray(out) - partner) / (x - partner)))
    expected = mixup_target(torch.tensor(np.asarray(multi_hot)), NUM_CLASSES, lam, 0.2, multi_label=True).numpy()
    np.testing.assert_allclose(np.asarray(targets), expected, atol=1e-5)


@pytest.mark.parametrize("mode, minmax", [("batch", None), ("elem", None), ("batch", (0.3, 0.7))])
def test_cutmix_pastes_the_partners_box_and_lambda_is_one_minus_its_area(mode, minmax):
    images, labels = batch()
    config = MixConfig(NUM_CLASSES, mixup_alpha=0.0, cutmix_alpha=1.0, cutmix_minmax=minmax, label_smoothing=0.0,
                       mode=mode)
    boxes = []
    for seed in range(4):
        out, targets = (np.asarray(a) for a in run(jax.random.key(seed), images, labels, None, config))
        x, partner = np.asarray(images), np.asarray(images)[::-1]
        for i in range(B):
            changed = (out[i] != x[i]).any(-1)
            np.testing.assert_array_equal(out[i][changed], partner[i][changed])
            area = box_of(changed)
            lam = targets[i, labels[i]]
            assert lam == pytest.approx(1 - area / (H * W), abs=1e-6)
            np.testing.assert_allclose(targets[i].sum(), 1.0, atol=1e-6)
            boxes.append(changed)
            if minmax is not None:
                rows, cols = changed.any(1).sum(), changed.any(0).sum()
                assert int(H * 0.3) <= rows < int(H * 0.7) and int(W * 0.3) <= cols < int(W * 0.7)
        if mode == "batch":  # one box for the whole batch (a row and its partner swap the same area)
            assert all(np.array_equal(b, boxes[-B]) for b in boxes[-B:])
    assert len({b.tobytes() for b in boxes}) > 1


@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_padding_rows_stay_as_they_are_and_real_rows_mix_only_with_real_rows(mode):
    images, labels = batch()
    mask = jnp.array([1, 1, 0, 1, 1, 1, 0, 0], bool)
    config = mixup_and_cutmix(mode)
    off, on = 0.1 / NUM_CLASSES, 0.9 + 0.1 / NUM_CLASSES
    smoothed = np.where(np.eye(NUM_CLASSES)[np.asarray(labels)] > 0, on, off)
    real = np.flatnonzero(np.asarray(mask))
    for seed in range(6):
        out, targets = (np.asarray(a) for a in run(jax.random.key(seed), images, labels, mask, config))
        for i in np.flatnonzero(~np.asarray(mask)):
            np.testing.assert_array_equal(out[i], np.asarray(images)[i])
            np.testing.assert_allclose(targets[i], smoothed[i], rtol=1e-6)
        padded_classes = np.asarray(labels)[~np.asarray(mask)]
        assert np.all(targets[real][:, padded_classes] == pytest.approx(off))  # no weight moved from padding
        np.testing.assert_allclose(targets[real].sum(1), 1.0, atol=1e-6)


def test_probability_zero_is_the_identity_with_smoothed_one_hot_targets():
    images, labels = batch()
    config = MixConfig(NUM_CLASSES, mixup_alpha=1.0, cutmix_alpha=1.0, prob=0.0, label_smoothing=0.1)
    out, targets = run(jax.random.key(0), images, labels, None, config)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(images))
    expected = mixup_target(torch.tensor(np.asarray(labels)), NUM_CLASSES, 1.0, 0.1).numpy()
    np.testing.assert_allclose(np.asarray(targets), expected, atol=1e-7)


@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_same_key_same_mix_other_key_other_mix_jitted_or_not(mode):
    images, labels = batch()
    config = mixup_and_cutmix(mode)
    first = jitted_mix(jax.random.key(9), images, labels, None, config)
    again = jitted_mix(jax.random.key(9), images, labels, None, config)
    eager = run(jax.random.key(9), images, labels, None, config)
    other = run(jax.random.key(10), images, labels, None, config)
    for a, b, c in zip(first, again, eager):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        np.testing.assert_allclose(np.asarray(a), np.asarray(c), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(np.asarray(first[0]), np.asarray(other[0]))


def test_bad_settings_and_inputs_are_errors():
    with pytest.raises(ValueError, match="mixes nothing"):
        MixConfig(NUM_CLASSES, mixup_alpha=0.0)
    with pytest.raises(ValueError, match="mode"):
        MixConfig(NUM_CLASSES, mode="pair")
    with pytest.raises(ValueError, match="cutmix_minmax"):
        MixConfig(NUM_CLASSES, cutmix_minmax=(0.8, 0.2))
    with pytest.raises(ValueError, match="prob"):
        MixConfig(NUM_CLASSES, prob=1.5)
    images, labels = batch()
    config = MixConfig(NUM_CLASSES)
    with pytest.raises(ValueError, match="float images"):
        mix(jax.random.key(0), images.astype(jnp.uint8), labels, None, config)
    with pytest.raises(ValueError, match="num_classes=10"):
        mix(jax.random.key(0), images, jnp.zeros((B, 4)), None, config)
    hash(config)
