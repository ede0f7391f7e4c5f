"""Device RandAugment: each JAX op against the TF op it copies, and the per-image policy."""
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from skimage import data

import kaggle_utils.data as kd
from kaggle_utils.data import augment as tf_augment
from kaggle_utils.device_augment import RandAugmentConfig, make_device_augment, rand_augment_batch, randaugment

tf = kd.tensorflow_on_host()

IMAGES = {  # real photos, small; one not square, one with a narrow range of values
    "astronaut": data.astronaut()[::8, ::8],
    "chelsea": data.chelsea()[::4, ::4],
    "dim": (data.astronaut()[::8, ::8] // 3 + 60).astype(np.uint8),
}
LEVELS = (-1.0, -0.55, -0.2, 0.3, 0.7, 1.0)
INTEGER_OPS = ("identity", "equalize", "solarize", "posterize")  # integer maths only: equal to the bit
FLOAT_OPS = ("autocontrast", "color", "contrast", "brightness", "sharpness")  # float blends, rounded to uint8
GEOMETRIC_OPS = tuple(randaugment.WARP_MATRICES)  # nearest neighbour: equal except where a coordinate is a .5 tie


@pytest.fixture(scope="module")
def tf_ops():
    """The TF ops compiled with XLA, as the TF RandAugment runs them."""
    return {name: tf.function(fn, jit_compile=True) for name, fn in tf_augment.RANDAUGMENT_OPS.items()}


def both(tf_ops, name, image, level):
    tf_out = tf_ops[name](tf.constant(image), tf.constant(level, tf.float32)).numpy()
    jax_out = np.asarray(jax.jit(randaugment.RANDAUGMENT_OPS[name])(jnp.asarray(image), jnp.float32(level)))
    assert jax_out.dtype == np.uint8 and jax_out.shape == image.shape
    return tf_out.astype(int), jax_out.astype(int)


def compared(tf_ops, name):
    """``(image, level, tf_out, jax_out)`` for every test image and level."""
    for image in IMAGES.values():
        for level in LEVELS:
            yield (image, level, *both(tf_ops, name, image, level))


def test_the_op_tables_name_the_same_ops_in_the_same_order():
    assert list(randaugment.RANDAUGMENT_OPS) == list(tf_augment.RANDAUGMENT_OPS)
    assert set(INTEGER_OPS + FLOAT_OPS + GEOMETRIC_OPS) == set(randaugment.RANDAUGMENT_OPS)


@pytest.mark.parametrize("name", INTEGER_OPS)
def test_integer_ops_equal_tf_exactly(tf_ops, name):
    for _, level, tf_out, jax_out in compared(tf_ops, name):
        np.testing.assert_array_equal(jax_out, tf_out, err_msg=f"{name} level {level}")


def test_equalize_subsamples_large_images_as_tf_does(tf_ops):
    """Above 384x384 both take the histogram over every second pixel; at 384x384 both take every pixel."""
    image = data.astronaut()  # 512x512
    tf_out, jax_out = both(tf_ops, "equalize", image, 0.0)
    np.testing.assert_array_equal(jax_out, tf_out)
    cropped = image[:384, :384]  # at the threshold: the full histogram
    np.testing.assert_array_equal(*both(tf_ops, "equalize", cropped, 0.0))


@pytest.mark.parametrize("name", FLOAT_OPS)
def test_float_ops_equal_tf_within_one_level(tf_ops, name):
    differing = total = 0
    for _, level, tf_out, jax_out in compared(tf_ops, name):
        assert np.abs(jax_out - tf_out).max() <= 1, f"{name} level {level}"
        differing += np.count_nonzero(jax_out != tf_out)
        total += tf_out.size
    assert differing <= total * 1e-3  # only where x + 0.5 lands within float rounding of an integer


def _tie_pixels(name, shape, level) -> np.ndarray:
    """Pixels whose source coordinate (exact, from the float32 matrix) is within 1e-3 of a .5 tie.

    There the nearest neighbour depends on the last bit of a float sum (fused multiply-add or
    not): TF's own eager and XLA-compiled ops pick different neighbours at some of them.
    """
    m = np.asarray(randaugment.WARP_MATRICES[name](jnp.float32(level), shape), np.float64)
    ys, xs = np.mgrid[0:shape[0], 0:shape[1]].astype(np.float64)
    near = [np.abs(np.abs(c - np.floor(c)) - 0.5) < 1e-3
            for c in (m[0] * xs + m[1] * ys + m[2], m[3] * xs + m[4] * ys + m[5])]
    return near[0] | near[1]


@pytest.mark.parametrize("name", GEOMETRIC_OPS)
def test_geometric_ops_equal_tf_except_at_rounding_ties(tf_ops, name):
    ties = total = 0
    for image, level, tf_out, jax_out in compared(tf_ops, name):
        tie = _tie_pixels(name, image.shape, level)
        np.testing.assert_array_equal(jax_out[~tie], tf_out[~tie], err_msg=f"{name} level {level}")
        ties += np.count_nonzero(tie)
        total += tie.size
    assert ties <= total * 0.05


@jax.jit
def every_op(image, level):
    """Every op at one level, compiled as one program (quicker than one compile per op)."""
    return {name: fn(image, level) for name, fn in randaugment.RANDAUGMENT_OPS.items()}


def test_magnitude_zero_is_the_identity_for_every_op_with_a_magnitude():
    image = jnp.asarray(IMAGES["chelsea"])
    for name, out in every_op(image, jnp.float32(0.0)).items():
        if name not in ("autocontrast", "equalize"):
            np.testing.assert_array_equal(np.asarray(out), np.asarray(image), err_msg=name)


# ------------------------------------------------------------------ the policy
BATCH = np.stack([IMAGES["astronaut"]] * 48)


def test_one_op_per_image_is_one_of_the_ops_with_either_sign():
    """num_ops=1 without flip: each image is some op at +-m/30 of the original (the shared warp included)."""
    config = RandAugmentConfig(num_ops=1, magnitude=12, flip=False)
    out = np.asarray(jax.jit(rand_augment_batch, static_argnums=2)(jax.random.key(3), jnp.asarray(BATCH), config))
    image = jnp.asarray(BATCH[0])
    candidates = {(name, sign): np.asarray(out) for sign in (-1, 1)
                  for name, out in every_op(image, jnp.float32(sign * 12 / 30)).items()}
    chosen = []
    for i, result in enumerate(out):
        matches = [key for key, candidate in candidates.items() if np.array_equal(result, candidate)]
        assert matches, f"image {i} is none of the ops"
        chosen.append(matches[0][0])
    assert len(set(chosen)) >= 8  # 48 draws over 14 ops


def test_batch_augment_is_per_image_and_deterministic_per_key():
    augment = jax.jit(make_device_augment("randaugment-device"))
    images = jnp.asarray(BATCH[:16])
    first, again = augment(jax.random.key(0), images), augment(jax.random.key(0), images)
    other = augment(jax.random.key(1), images)
    assert first.dtype == jnp.uint8 and first.shape == images.shape
    np.testing.assert_array_equal(np.asarray(first), np.asarray(again))
    assert not np.array_equal(np.asarray(first), np.asarray(other))
    distinct = {np.asarray(image).tobytes() for image in first}
    assert len(distinct) >= 14  # same input image, own draws each


def test_sequential_mode_gives_the_vmapped_result():
    images = jnp.asarray(BATCH[:6])
    settings = dict(num_ops=3, magnitude=(5, 25), ops=("equalize", "rotate", "color", "translate_y", "posterize"))
    run = jax.jit(rand_augment_batch, static_argnums=2)
    vmapped = run(jax.random.key(7), images, RandAugmentConfig(**settings))
    sequential = run(jax.random.key(7), images, RandAugmentConfig(**settings, sequential=True))
    np.testing.assert_array_equal(np.asarray(vmapped), np.asarray(sequential))


def test_none_is_the_identity_and_bad_settings_are_errors():
    images = jnp.asarray(BATCH[:2])
    assert make_device_augment(None)(jax.random.key(0), images) is images
    assert make_device_augment("none")(jax.random.key(0), images) is images
    with pytest.raises(ValueError, match="randaugment-device"):
        make_device_augment("randaugment-gpu")
    with pytest.raises(ValueError, match="magnitude"):
        RandAugmentConfig(magnitude=31)
    with pytest.raises(ValueError, match="magnitude"):
        RandAugmentConfig(magnitude=(20, 10))
    with pytest.raises(ValueError, match="unknown RandAugment ops"):
        RandAugmentConfig(ops=("rotate", "blur"))
    with pytest.raises(ValueError, match="uint8"):
        rand_augment_batch(jax.random.key(0), images.astype(jnp.float32)[0])
    assert RandAugmentConfig(magnitude=[5, 25]).magnitude == (5.0, 25.0)
    hash(RandAugmentConfig(ops=["rotate", "color"]))  # static argument of a jitted step


def test_importing_device_augment_loads_neither_tensorflow_torch_nor_the_data_package():
    code = ("import sys, kaggle_utils.device_augment; "
            "loaded = [m for m in ('tensorflow', 'torch', 'kaggle_utils.data', 'cv2', 'PIL') if m in sys.modules]; "
            "print(loaded); sys.exit(bool(loaded))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
