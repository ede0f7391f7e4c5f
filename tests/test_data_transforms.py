"""Decoding any image file, and the resolution transforms (resize, train crop, eval crop).

References come from PIL (timm's own loader and eval transform), not from the code under test.
Photos are scikit-image's, shrunk to keep the tests fast.
"""
import io
import math

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from skimage import data as skdata

import kaggle_utils.data as kd
from kaggle_utils.data import transforms

CAT = np.asarray(Image.fromarray(skdata.chelsea()).resize((120, 80), Image.BILINEAR))  # 80x120, landscape


def encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def decode(data: bytes) -> np.ndarray:
    return transforms.decode_image(tf.constant(data)).numpy()


def pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize("mode,fmt", [("L", "PNG"), ("LA", "PNG"), ("RGBA", "PNG"), ("P", "PNG"), ("RGB", "PNG"),
                                      ("RGB", "BMP"), ("L", "JPEG"), ("RGB", "JPEG"), ("CMYK", "JPEG")])
def test_every_mode_decodes_to_rgb_uint8_as_pil_converts_it(mode, fmt):
    data = encoded(Image.fromarray(CAT).convert(mode), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    image = decode(data)
    assert image.dtype == np.uint8 and image.shape == CAT.shape
    np.testing.assert_array_equal(image, pil_rgb(data))  # PIL: accurate-DCT JPEGs, alpha dropped, palette expanded


def test_sixteen_bit_png_keeps_its_range_rounded_to_eight_bits():
    wide = np.random.default_rng(0).integers(0, 65536, (6, 9), dtype=np.uint16)
    wide[0, :3] = [0, 65535, 257 * 100 + 128]  # the ends, and a value just past the half-way point
    image = decode(encoded(Image.fromarray(wide), "PNG"))
    expected = np.floor(wide / 257 + 0.5).astype(np.uint8)  # PIL clips I;16 to 255 instead: no reference there
    np.testing.assert_array_equal(image, np.repeat(expected[..., None], 3, -1))
    assert image[0, :3, 0].tolist() == [0, 255, 100]


def test_exif_orientation_is_ignored_pixels_come_as_stored():
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    data = encoded(Image.fromarray(CAT), "JPEG", quality=95, exif=exif.tobytes())
    assert Image.open(io.BytesIO(data)).getexif()[0x0112] == 6
    image = decode(data)
    assert image.shape == CAT.shape  # a transposing decoder would give 120x80
    np.testing.assert_array_equal(image, pil_rgb(data))


def test_bytes_that_are_no_image_raise():
    with pytest.raises(tf.errors.InvalidArgumentError):
        decode(b"this is not an image")


def pil_center_crop(image: np.ndarray, size: int, crop_pct: float, resample) -> np.ndarray:
    """timm's eval transform written out with PIL: Resize(floor(size / crop_pct)) + CenterCrop(size)."""
    scaled = math.floor(size / crop_pct)
    height, width = image.shape[:2]
    if height <= width:
        new_h, new_w = scaled, int(scaled * width / height)
    else:
        new_h, new_w = int(scaled * height / width), scaled
    resized = np.asarray(Image.fromarray(image).resize((new_w, new_h), resample))
    top, left = int(round((new_h - size) / 2)), int(round((new_w - size) / 2))
    return resized[top:top + size, left:left + size]


@pytest.mark.parametrize("size,crop_pct,interpolation,resample", [
    (48, 0.875, "bilinear", Image.BILINEAR), (64, 1.0, "bilinear", Image.BILINEAR),
    (40, 0.95, "bicubic", Image.BICUBIC)])
@pytest.mark.parametrize("portrait", [False, True])
def test_center_crop_matches_timms_pil_transform_within_one_level(size, crop_pct, interpolation, resample, portrait):
    image = np.ascontiguousarray(CAT.transpose(1, 0, 2)) if portrait else CAT
    out = kd.CenterCrop(size, crop_pct, interpolation)(tf.constant(image)).numpy()
    reference = pil_center_crop(image, size, crop_pct, resample)
    assert out.shape == (size, size, 3) and out.dtype == np.uint8
    # both antialias the same kernels; PIL works in fixed point, TF in float, so roundings differ by one level
    assert np.abs(out.astype(int) - reference).max() <= 1


def crops(transform, seeds, image=CAT):
    return [transform(tf.constant(image), tf.constant([s, 7], tf.int64)).numpy() for s in seeds]


def test_random_resized_crop_shapes_ranges_and_seeds():
    transform = kd.RandomResizedCrop(32)
    first, second, again = crops(transform, [1, 2, 1])
    assert first.shape == (32, 32, 3) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, again)  # stateless: the seed decides
    assert np.abs(first.astype(int) - second).mean() > 5  # another seed, another crop
    assert len({c.tobytes() for c in crops(transform, range(8))}) == 8


def test_random_resized_crop_boxes_stay_inside_and_follow_scale_and_ratio():
    transform = kd.RandomResizedCrop(16, scale=(0.25, 0.5), ratio=(0.5, 2.0))
    height, width = 300, 451
    for s in range(40):
        top, left, h, w = (int(v) for v in transform.box(height, width, tf.constant([s, 0], tf.int64)))
        assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
        assert 0.25 * 0.9 <= h * w / (height * width) <= 0.5 * 1.1  # rounding of the sides
        assert 0.5 * 0.9 <= w / h <= 2.0 * 1.1


def test_random_resized_crop_falls_back_to_the_centre_when_no_box_fits():
    # a 1x40 strip: no box with aspect in [3/4, 4/3] fits, so the centre box with the ratio clamped
    transform = kd.RandomResizedCrop(8, hflip=0.0)
    top, left, h, w = (int(v) for v in transform.box(1, 40, tf.constant([3, 3], tf.int64)))
    assert (top, h) == (0, 1) and w == round(1 * 4 / 3) and left == (40 - w) // 2


def test_flip_probability_one_mirrors_the_crop():
    plain, flipped = kd.RandomResizedCrop(24, hflip=0.0), kd.RandomResizedCrop(24, hflip=1.0)
    seed = tf.constant([5, 5], tf.int64)
    # the box comes from the first half of the seed split, so both cut the same box
    np.testing.assert_array_equal(flipped(tf.constant(CAT), seed).numpy(), plain(tf.constant(CAT), seed).numpy()[:, ::-1])


def test_resize_squashes_the_whole_image():
    out = kd.Resize(20)(tf.constant(CAT)).numpy()
    reference = np.asarray(Image.fromarray(CAT).resize((20, 20), Image.BILINEAR))
    assert out.shape == (20, 20, 3) and np.abs(out.astype(int) - reference).max() <= 1


@pytest.mark.parametrize("bad", [dict(size=0), dict(size=8, interpolation="nearest"), dict(size=8, crop_pct=1.5)])
def test_bad_arguments_raise(bad):
    with pytest.raises(ValueError):
        kd.CenterCrop(**bad)


# --------------------------------------------------------------------------------------
# load_dataset(crop=...) on TFRecords
# --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    photos = [np.asarray(Image.fromarray(p).resize((48, 48), Image.BILINEAR))
              for p in (skdata.astronaut(), skdata.coffee(), skdata.chelsea(), skdata.rocket())]
    kd.write_split(folder, np.stack(photos * 3), labels=list(range(12)), num_files=2)
    return str(folder)


def read(folder, **kwargs):
    dataset = kd.load_dataset(folder, labeled=True, image_size=48, batch_size=5, **kwargs)
    return {k: np.concatenate([b[k] for b in dataset]) for k in ("image", "label", "mask")}


def test_load_dataset_default_is_unchanged_and_eval_crop_is_applied_per_image(records):
    stored = read(records)
    cropped = read(records, crop=kd.CenterCrop(32, crop_pct=0.8))
    assert stored["image"].shape[1:] == (48, 48, 3) and cropped["image"].shape[1:] == (32, 32, 3)
    np.testing.assert_array_equal(cropped["label"], stored["label"])
    for image, original in zip(cropped["image"][cropped["mask"]], stored["image"][stored["mask"]]):
        np.testing.assert_array_equal(image, kd.CenterCrop(32, crop_pct=0.8)(tf.constant(original)).numpy())


def test_load_dataset_train_crops_vary_with_the_seed_and_randaugment_runs_on_the_crops(records):
    first = read(records, crop=kd.RandomResizedCrop(24), seed=1)
    again = read(records, crop=kd.RandomResizedCrop(24), seed=1)
    other = read(records, crop=kd.RandomResizedCrop(24), seed=2)
    assert first["image"].shape[1:] == (24, 24, 3)
    np.testing.assert_array_equal(first["image"], again["image"])
    assert not np.array_equal(first["image"], other["image"])
    augmented = read(records, crop=kd.RandomResizedCrop(24), augment=kd.RandAugment(num_ops=1, jit_compile=False),
                     seed=1)
    assert augmented["image"].shape == first["image"].shape and augmented["image"].dtype == np.uint8
    np.testing.assert_array_equal(augmented["label"], first["label"])
