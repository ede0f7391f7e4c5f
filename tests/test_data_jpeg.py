"""Worker-side JPEG decoding gives exactly TensorFlow's pixels, and fails where TensorFlow fails."""
import io
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from kaggle_utils.data import jpeg


def photo(height=96, width=64, seed=0) -> np.ndarray:
    """Smooth gradients plus noise: JPEG keeps detail at every frequency, so DCT methods differ."""
    rng = np.random.default_rng(seed)
    ramp = np.add.outer(np.arange(height), 2 * np.arange(width))[..., None] * np.array([1, 2, 3])
    return ((ramp + rng.integers(0, 40, (height, width, 3))) % 256).astype(np.uint8)


def encode(image: np.ndarray, mode: str = "RGB", **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def tf_decode(data: bytes) -> np.ndarray:
    return tf.io.decode_jpeg(data, channels=3, dct_method=jpeg.DCT_METHOD).numpy()


FLAVOURS = {
    "4:2:0 q90": dict(quality=90),
    "4:4:4 q95": dict(quality=95, subsampling=0),
    "4:2:2 q50": dict(quality=50, subsampling=1),
    "progressive": dict(quality=85, progressive=True),
    "greyscale": dict(mode="L"),
    "cmyk": dict(mode="CMYK"),
}


@pytest.fixture(params=["simplejpeg", "opencv", "opencv-bgr", "pil"])
def decoder(request, monkeypatch):
    """Every decoder: simplejpeg (strict), and without it OpenCV, OpenCV before 4.10 (BGR only), and PIL alone."""
    if request.param == "simplejpeg":
        if jpeg.strict_decoder() is None:
            pytest.skip("simplejpeg is not installed (as on Kaggle's images); the other decoders are tested")
        return request.param
    monkeypatch.setattr(jpeg, "strict_decoder", lambda: None)
    opencv = jpeg._opencv()
    if opencv is None:
        pytest.fail("OpenCV (a dependency of imgaug) is not installed")
    if request.param == "pil":
        monkeypatch.setattr(jpeg, "_opencv", lambda: None)
    elif request.param == "opencv-bgr":
        names = {name: getattr(opencv, name) for name in dir(opencv) if name != "IMREAD_COLOR_RGB"}
        monkeypatch.setattr(jpeg, "_opencv", lambda: types.SimpleNamespace(**names))
    return request.param


@pytest.mark.parametrize("flavour", list(FLAVOURS))
def test_decode_matches_tensorflow_bit_for_bit(flavour, decoder):
    data = encode(photo(), **FLAVOURS[flavour])
    out = np.zeros((96, 64, 3), np.uint8)
    jpeg.decode_jpeg_into(data, out)
    np.testing.assert_array_equal(out, tf_decode(data))


def test_the_pipeline_dct_method_is_not_tensorflows_default():
    """Guards the reason DCT_METHOD is set: TF's default decode gives other pixels."""
    data = encode(photo(), quality=90)
    default = tf.io.decode_jpeg(data, channels=3).numpy()
    assert np.abs(default.astype(int) - tf_decode(data)).max() > 0


def test_corrupt_entropy_data_is_an_error_with_simplejpeg_else_decodes_as_tensorflow_decodes_it(decoder):
    data = bytearray(encode(photo(), quality=90))
    middle = len(data) // 2
    data[middle:middle + 40] = bytes(40)
    out = np.zeros((96, 64, 3), np.uint8)
    if decoder == "simplejpeg":
        with pytest.raises(jpeg.CorruptJpegError, match=r"corrupt JPEG data.*libjpeg: Corrupt JPEG data"):
            jpeg.decode_jpeg_into(bytes(data), out)
        return
    jpeg.decode_jpeg_into(bytes(data), out)
    np.testing.assert_array_equal(out, tf_decode(bytes(data)))


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[: len(d) // 2], "truncated"),
    (lambda d: b"\xff\xd8 not really a jpeg", "cannot identify"),
    (lambda d: encode(photo(48, 64)), "image is 48x64 .*expected 96x64"),
])
def test_what_tensorflow_rejects_is_a_value_error_saying_why(damage, message, decoder):
    data = damage(encode(photo(), quality=90))
    if "image is" not in message:
        with pytest.raises(tf.errors.InvalidArgumentError):
            tf_decode(data)
    with pytest.raises(ValueError, match=message):
        jpeg.decode_jpeg_into(data, np.zeros((96, 64, 3), np.uint8))


def test_importing_the_data_package_loads_no_decoder():
    """Only augmentation workers decode outside TF: the training process never pays for OpenCV or PIL."""
    code = ("import sys, kaggle_utils.data; "
            "loaded = [m for m in ('cv2', 'PIL', 'tensorflow') if m in sys.modules]; print(loaded); sys.exit(bool(loaded))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
