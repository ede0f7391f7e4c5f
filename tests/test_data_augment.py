"""Augmentation: TF-native RandAugment ops, the imgaug path on NumPy 2, the worker-process hook."""
import functools
import glob
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image, ImageOps

import kaggle_utils.data as kd
from kaggle_utils import randaugment_ops
from kaggle_utils.data import augment as pipeline_augment

SIZE = 32


def natural_batch(count: int, size: int = SIZE, seed: int = 0) -> np.ndarray:
    """Smooth colour gradients plus a bright square and noise: every op has something to change."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    images = []
    for _ in range(count):
        a, b, c = rng.uniform(0.2, 0.8, 3)
        image = np.stack([60 + 120 * a * xx, 50 + 140 * b * yy, 40 + 100 * c * (xx + yy) / 2], -1)
        x0, y0 = rng.integers(2, size // 2, 2)
        image[y0:y0 + size // 3, x0:x0 + size // 3] += 70
        images.append(image + rng.normal(0, 4, image.shape))
    return np.clip(images, 0, 255).astype(np.uint8)


def apply_op(name: str, image: np.ndarray, level: float) -> np.ndarray:
    """Eagerly (fast to run); the XLA-compiled versions are checked against these below."""
    return pipeline_augment.RANDAUGMENT_OPS[name](tf.constant(image), tf.constant(level, tf.float32)).numpy()


EAGER_RANDAUGMENT = kd.RandAugment(2, 15, jit_compile=False)  # tests build it once: tracing takes seconds


# ------------------------------------------------------------------ TF-native ops
@pytest.mark.parametrize("name", sorted(pipeline_augment.RANDAUGMENT_OPS))
def test_each_op_keeps_uint8_shape_and_magnitude_zero_is_identity(name):
    image = natural_batch(1)[0]
    out = apply_op(name, image, 0.8)
    assert out.dtype == np.uint8 and out.shape == image.shape
    changes = name != "identity"
    assert (np.abs(out.astype(int) - image).mean() > 0.5) == changes
    if name not in ("autocontrast", "equalize"):  # these two have no magnitude
        np.testing.assert_array_equal(apply_op(name, image, 0.0), image)


def test_equalize_matches_pil():
    image = natural_batch(1)[0]
    expected = np.stack([np.asarray(ImageOps.equalize(Image.fromarray(image[..., c]))) for c in range(3)], -1)
    np.testing.assert_array_equal(apply_op("equalize", image, 0.0), expected)


def test_autocontrast_stretches_each_channel_to_full_range():
    image = (natural_batch(1)[0] // 2 + 40).astype(np.uint8)
    out = apply_op("autocontrast", image, 0.0)
    assert out.min(axis=(0, 1)).tolist() == [0, 0, 0] and out.max(axis=(0, 1)).tolist() == [255, 255, 255]


def test_pointwise_ops_follow_their_definitions():
    image = natural_batch(1)[0]
    x = image.astype(float)
    np.testing.assert_array_equal(apply_op("solarize", image, 1.0), 255 - image)  # threshold 0: invert all
    np.testing.assert_array_equal(apply_op("posterize", image, 1.0), image & 0b11000000)  # 6 bits dropped
    darker = np.floor(x * 0.1 + 0.5)  # level -1: factor 1 - 0.9 = 0.1
    np.testing.assert_allclose(apply_op("brightness", image, -1.0), darker, atol=1)


def test_translate_moves_pixels_and_fills_with_grey():
    image = natural_batch(1)[0]
    out = apply_op("translate_x", image, 0.5)  # 0.5 * 0.33 * 32 = 5.28 -> 5 pixels
    np.testing.assert_array_equal(out[:, :-5], image[:, 5:])
    assert (out[:, -5:] == randaugment_ops.FILL_VALUE).all()


def test_shear_x_keeps_the_top_row_and_rotate_keeps_the_centre():
    image = natural_batch(1)[0]
    np.testing.assert_array_equal(apply_op("shear_x", image, 1.0)[0], image[0])
    rotated = apply_op("rotate", image, 1.0)
    assert not np.array_equal(rotated, image)
    centre = SIZE // 2
    np.testing.assert_array_equal(rotated[centre - 1:centre + 1, centre - 1:centre + 1],
                                  image[centre - 1:centre + 1, centre - 1:centre + 1])


def test_randaugment_changes_images_reproducibly_per_seed():
    images = natural_batch(16)
    first = kd.augment_images(images, EAGER_RANDAUGMENT, seed=1)
    assert first.dtype == np.uint8 and first.shape == images.shape
    changed = [not np.array_equal(a, b) for a, b in zip(first, images)]
    assert sum(changed) >= 14
    np.testing.assert_array_equal(kd.augment_images(images, EAGER_RANDAUGMENT, seed=1), first)
    assert not np.array_equal(kd.augment_images(images, EAGER_RANDAUGMENT, seed=2), first)


def test_xla_compiled_randaugment_in_the_pipeline_matches_the_op_by_op_version(tmp_path):
    """load_dataset(augment="randaugment") compiles with XLA; same seed -> same images as TF's kernels."""
    kd.write_split(tmp_path / "train", natural_batch(24), labels=list(range(24)), num_files=2)
    common = dict(labeled=True, image_size=SIZE, batch_size=8, seed=5)
    plain = np.concatenate([b["image"] for b in kd.load_dataset(tmp_path / "train", **common)])
    compiled = np.concatenate([b["image"] for b in kd.load_dataset(tmp_path / "train", augment="randaugment",
                                                                  **common)])
    eager = np.concatenate([b["image"] for b in kd.load_dataset(tmp_path / "train", augment=EAGER_RANDAUGMENT,
                                                               **common)])
    assert compiled.dtype == np.uint8 and compiled.shape == plain.shape
    assert (np.abs(compiled.astype(int) - plain).mean(axis=(1, 2, 3)) > 1).sum() >= 20
    difference = np.abs(compiled.astype(int) - eager)
    # identical draws; only pixels on a nearest-neighbour rounding edge (FMA in XLA) may land elsewhere
    assert (difference > 0).mean(axis=(1, 2, 3)).max() < 0.01


def test_randaugment_rejects_out_of_range_settings():
    with pytest.raises(ValueError, match="magnitude"):
        kd.RandAugment(2, 31)
    with pytest.raises(ValueError, match="unknown RandAugment ops"):
        kd.RandAugment(2, 10, ops=["rotate", "cutout"])


# ------------------------------------------------------------------ timm's colour jitter
def jitter(image: np.ndarray, seed: int, strength: float = 0.4) -> np.ndarray:
    return kd.ColorJitter(strength)(tf.constant(image), tf.constant([seed, 7], tf.int64)).numpy()


def test_colour_jitter_scales_a_grey_image_by_a_brightness_factor_within_its_strength():
    """A flat grey image: contrast and saturation blend it with itself, so only brightness moves it, to
    round(100 * b) with b in [0.6, 1.4] for strength 0.4; seeds draw across that range."""
    grey = np.full((8, 8, 3), 100, np.uint8)
    values = []
    for seed in range(40):
        out = jitter(grey, seed)
        assert out.dtype == np.uint8 and out.shape == grey.shape and len(np.unique(out)) == 1
        values.append(int(out[0, 0, 0]))
    assert 60 <= min(values) < 75 and 125 < max(values) <= 140


def test_colour_jitter_keeps_an_image_at_a_tiny_strength_and_is_reproducible_per_seed():
    images = natural_batch(4)
    for image in images:
        assert np.abs(jitter(image, 3, strength=1e-6).astype(int) - image).max() <= 1
        np.testing.assert_array_equal(jitter(image, 3), jitter(image, 3))
    changed = [np.abs(jitter(image, 3).astype(int) - image).mean() > 1 for image in images]
    assert sum(changed) >= 3


def test_colour_jitter_at_full_strength_can_take_the_colour_out():
    """Strength 1: saturation factors near 0 make a pixel's channels (nearly) its grey; a coloured image's channel
    spread falls below its original for some seed, and never rises above 2x plus clipping room."""
    image = natural_batch(1)[0]
    spread = lambda x: (x.max(-1).astype(int) - x.min(-1)).mean()  # noqa: E731
    spreads = [spread(jitter(image, seed, strength=1.0)) for seed in range(30)]
    assert min(spreads) < 0.3 * spread(image)


def test_colour_jitter_in_the_pipeline_keeps_batches_and_labels(tmp_path):
    kd.write_split(tmp_path / "train", natural_batch(12), labels=list(range(12)), num_files=2)
    common = dict(labeled=True, image_size=SIZE, batch_size=6, seed=0)
    plain = list(kd.load_dataset(tmp_path / "train", **common))
    jittered = list(kd.load_dataset(tmp_path / "train", augment="color-jitter", **common))
    assert kd.resolve_augment("color-jitter").per_image == kd.ColorJitter(0.4)
    for a, b in zip(plain, jittered, strict=True):
        assert b["image"].dtype == np.uint8 and b["image"].shape == a["image"].shape
        np.testing.assert_array_equal(b["label"], a["label"])
    changed = np.abs(np.concatenate([b["image"] for b in jittered]).astype(int)
                     - np.concatenate([a["image"] for a in plain])).mean(axis=(1, 2, 3)) > 1
    assert changed.sum() >= 9
    with pytest.raises(ValueError, match="strength must be in"):
        kd.ColorJitter(0)


# ------------------------------------------------------------------ imgaug on NumPy 2
def test_imgaug_randaugment_works_on_numpy_2_without_patching_numpy():
    assert int(np.__version__.split(".")[0]) >= 2
    iaa = kd.import_imgaug_augmenters()
    assert not hasattr(np, "sctypes")  # the import-time shim is gone again
    import imgaug.parameters as iap

    assert iap.Power(iap.Uniform(0.5, 1.0), 2).draw_samples(4).shape == (4,)  # reads np.complex
    images = natural_batch(8)
    np.random.seed(0)
    out = kd.ImgaugRandAugment(n=2, m=15)(images.copy())
    assert out.dtype == np.uint8 and out.shape == images.shape
    assert not np.array_equal(out, images)
    assert isinstance(iaa.RandAugment(n=2, m=15), iaa.Sequential)


# ------------------------------------------------------------------ the worker-process hook
@pytest.fixture(scope="module")
def invert_pool():
    with kd.ProcessPoolAugmenter(np.invert, num_workers=2) as pool:
        yield pool


@pytest.fixture(scope="module")
def invert_pool_tf_decode():
    with kd.ProcessPoolAugmenter(np.invert, num_workers=1, decode_jpegs=False) as pool:
        yield pool


def test_worker_pool_returns_what_the_function_returns(invert_pool):
    for size in (SIZE, 48):  # a larger batch grows the shared-memory slots
        images = natural_batch(6, size=size)
        np.testing.assert_array_equal(invert_pool(images), np.invert(images))


def test_worker_pool_runs_calls_concurrently(invert_pool):
    from concurrent.futures import ThreadPoolExecutor

    batches = [natural_batch(4, seed=s) for s in range(12)]
    with ThreadPoolExecutor(invert_pool.num_slots) as threads:
        results = list(threads.map(invert_pool, batches))
    for batch, result in zip(batches, results):
        np.testing.assert_array_equal(result, np.invert(batch))


@pytest.mark.parametrize("pool", ["invert_pool", "invert_pool_tf_decode"])
def test_load_dataset_with_a_worker_pool_applies_the_function_to_each_batch(tmp_path, pool, request):
    """Bit for bit: workers that decode the JPEGs themselves see the pixels tf.data decodes."""
    pool = request.getfixturevalue(pool)
    images = natural_batch(20, size=48)
    kd.write_split(tmp_path / "train", images, labels=list(range(20)), num_files=2)
    common = dict(labeled=True, image_size=48, batch_size=8)
    plain = list(kd.load_dataset(tmp_path / "train", **common))
    augmented = list(kd.load_dataset(tmp_path / "train", augment=pool, **common))
    assert len(plain) == len(augmented) == 3
    for a, b in zip(plain, augmented):
        np.testing.assert_array_equal(b["label"], a["label"])
        np.testing.assert_array_equal(b["image"][b["mask"]], np.invert(a["image"][a["mask"]]))


def test_a_failing_augmentation_raises_its_own_error_from_the_pipeline(tmp_path):
    kd.write_split(tmp_path / "train", natural_batch(8), labels=list(range(8)), num_files=1)
    flatten = functools.partial(np.reshape, shape=(-1,))  # returns the wrong shape
    dataset = kd.load_dataset(tmp_path / "train", labeled=True, image_size=SIZE, batch_size=4, augment=flatten,
                              augment_workers=1)
    try:
        with pytest.raises(kd.AugmentWorkerError, match=r"returned uint8 \(12288,\).*\(4, 32, 32, 3\)"):
            list(dataset)
    finally:
        dataset.close()


def test_lambdas_reach_workers_by_value_and_pools_clean_up():
    import multiprocessing

    shm_before, children_before = set(glob.glob("/dev/shm/psm_*")), set(multiprocessing.active_children())
    pool = kd.ProcessPoolAugmenter(lambda x: 255 - x, num_workers=2)
    processes = set(multiprocessing.active_children()) - children_before
    assert len(processes) == 2  # both started with the pool, not later from a tf.data thread
    images = natural_batch(2)
    np.testing.assert_array_equal(pool(images), 255 - images)
    # the pool's own segments: another test process (pytest-xdist) may create and free psm_* segments meanwhile
    segments = {f"/dev/shm/{slot.shm.name.lstrip('/')}" for slot in pool._slots if slot.shm is not None}
    assert segments and not segments & shm_before
    assert segments <= set(glob.glob("/dev/shm/psm_*"))  # SharedMemory names its segments psm_*: the check can see them
    pool.close()
    assert not any(p.is_alive() for p in processes)
    assert not segments & set(glob.glob("/dev/shm/psm_*"))
    with pytest.raises(RuntimeError, match="closed"):
        pool(images)


def test_workers_end_when_the_process_that_started_them_dies():
    """A training process killed (the kill/resume case) or ended without closing its pool leaves no workers."""
    import subprocess
    import sys
    import time

    script = ("import multiprocessing, os, numpy as np, kaggle_utils.data as kd\n"
              "pool = kd.ProcessPoolAugmenter(np.invert, num_workers=2)\n"
              "print(*[p.pid for p in multiprocessing.active_children()], flush=True)\n"
              "os._exit(0)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": root})
    workers = [int(pid) for pid in done.stdout.split()]
    assert len(workers) == 2, done.stderr[-2000:]

    def alive(pid):
        try:
            with open(f"/proc/{pid}/status") as f:
                return "\tZ" not in f.read()  # a zombie has ended
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 30
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, workers))


def test_load_dataset_with_imgaug_keeps_batches_and_changes_pixels(tmp_path):
    images = natural_batch(12)
    kd.write_split(tmp_path / "train", images, labels=list(range(12)), num_files=2)
    common = dict(labeled=True, image_size=SIZE, batch_size=6, seed=0)
    plain = list(kd.load_dataset(tmp_path / "train", **common))
    dataset = kd.load_dataset(tmp_path / "train", augment="imgaug", augment_workers=1, **common)
    try:
        batches = list(dataset)
    finally:
        dataset.close()
    assert len(batches) == len(plain)
    for a, b in zip(plain, batches):
        assert b["image"].dtype == np.uint8 and b["image"].shape == a["image"].shape
        np.testing.assert_array_equal(b["label"], a["label"])
    changed = np.abs(np.concatenate([b["image"] for b in batches]).astype(int)
                     - np.concatenate([a["image"] for a in plain])).mean(axis=(1, 2, 3)) > 1
    assert changed.sum() >= 10


def test_unknown_augment_is_an_error():
    with pytest.raises(ValueError, match="augment='autoaugment' is not known"):
        kd.resolve_augment("autoaugment")


def test_show_augmented_draws_a_grid():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = kd.show_augmented(natural_batch(3), EAGER_RANDAUGMENT, num_variants=2)
    try:
        assert len(fig.axes) == 3 * 3
        shown = fig.axes[1].images[0].get_array()
        assert shown.shape == (SIZE, SIZE, 3)
    finally:
        plt.close(fig)


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_workers_started_from_a_script_do_not_rerun_it(tmp_path):
    """No `if __name__ == "__main__":` guard needed, and the script's own function reaches the workers."""
    import subprocess
    import sys

    script = tmp_path / "augment_script.py"
    marker = tmp_path / "runs.txt"
    script.write_text(f"""
import numpy as np
import kaggle_utils.data as kd

with open({str(marker)!r}, "a") as f:
    f.write("ran\\n")

def brighten(images):
    return np.minimum(images.astype(np.int16) + 10, 255).astype(np.uint8)

with kd.ProcessPoolAugmenter(brighten, num_workers=2) as pool:
    images = np.full((3, 4, 4, 3), 250, np.uint8)
    assert (pool(images) == 255).all() and (pool(images - 100) == 160).all()
print("ok")
""")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
    assert marker.read_text() == "ran\n"
