"""JPEGs with corrupt data (libjpeg only warns; every decoder returns garbage) are found and named.

The oracle for "libjpeg warns" is libjpeg itself: OpenCV's decoder lets it print its warning to
stderr, which ``capfd`` reads. The decode routes of TFRecords (tf.data, augmentation workers) are
covered by the "garbled jpeg" case of ``test_data_tfrecords.py``; here: the check against that
oracle, clean files, the once-per-record memory, the notice without simplejpeg, sources and the
converter, the job's scan before training, and prediction (which keeps such an image).
"""
import functools
import io
import os
import sys
import warnings

import cv2
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from skimage import data as skdata

import kaggle_utils.data as kd
from kaggle_utils.data import convert, jpeg, tfhost

from test_data_tfrecords import (SIZE, collect, example, garbled_jpeg, grey_jpeg, level_of, load, needs_simplejpeg,
                                 write_kaggle_split)

PHOTO = np.asarray(Image.fromarray(skdata.astronaut()).resize((64, 64), Image.BILINEAR))


def pil_jpeg(image: np.ndarray, mode: str = "RGB", **options) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).convert(mode).save(buffer, "JPEG", **options)
    return buffer.getvalue()


def libjpeg_warns(data: bytes, capfd) -> bool:
    capfd.readouterr()
    cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    return "Corrupt JPEG data" in capfd.readouterr().err


def scan_start(data: bytes) -> int:
    scan = data.index(b"\xff\xda")
    return scan + 2 + int.from_bytes(data[scan + 2:scan + 4], "big")


@needs_simplejpeg
def test_the_check_flags_exactly_the_garbles_libjpeg_warns_on(capfd):
    clean = pil_jpeg(PHOTO, quality=90)
    rng = np.random.default_rng(0)
    flagged, warned = [], []
    for k in range(24):
        data = bytearray(clean)
        start = int(rng.integers(scan_start(clean), len(clean) - 42))
        data[start:start + 40] = rng.integers(0, 256, 40, np.uint8).tobytes() if k % 2 else bytes(40)
        flagged.append(bool(jpeg.jpeg_problem(bytes(data))))
        warned.append(libjpeg_warns(bytes(data), capfd))
    assert flagged == warned
    assert 0 < sum(flagged) < len(flagged)  # some garbles leave a valid stream: nothing can find those


@needs_simplejpeg
def test_no_clean_jpeg_is_flagged(capfd):
    encoded = {
        "4:2:0": pil_jpeg(PHOTO, quality=75), "4:4:4": pil_jpeg(PHOTO, quality=95, subsampling=0),
        "4:2:2 progressive": pil_jpeg(PHOTO, subsampling=1, progressive=True),
        "restart markers": pil_jpeg(PHOTO, restart_marker_blocks=2), "greyscale": pil_jpeg(PHOTO, "L"),
        "cmyk": pil_jpeg(PHOTO, "CMYK"), "tf": tf.io.encode_jpeg(PHOTO).numpy(),
        "tf progressive 4:4:4": tf.io.encode_jpeg(PHOTO, progressive=True, chroma_downsampling=False).numpy(),
        "flat grey": grey_jpeg(128),
    }
    assert b"\xff\xd0" in encoded["restart markers"]
    for name, data in encoded.items():
        assert jpeg.jpeg_problem(data) == "", name
        assert not libjpeg_warns(data, capfd), name


def test_a_record_is_checked_once_until_its_file_changes(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(jpeg, "jpeg_problem", lambda data: calls.append(data) or ("bad" if data == b"x" else ""))
    path = tmp_path / "f.tfrec"
    path.write_bytes(b"one")
    monkeypatch.setattr(tfhost, "_memo", tfhost.RecordMemo())  # the process's memo, empty

    def problems(index, data, times):
        check = jpeg.tf_check([str(path)])  # as a new pipeline over the file makes it
        return [check(tf.constant(str(path)), tf.constant(index, tf.int64), tf.constant(data)).numpy()
                for _ in range(times)]

    assert problems(5, b"ok", 3) == [b""] * 3
    assert problems(6, b"x", 2) == [b"bad"] * 2  # a bad one: checked, and reported, each time
    assert len(calls) == 3
    assert problems(5, b"ok", 1) == [b""] and len(calls) == 3
    path.write_bytes(b"rewritten")
    assert problems(5, b"ok", 1) == [b""] and len(calls) == 4


@pytest.fixture
def split_with_a_garbled_record(tmp_path):
    folder = write_kaggle_split(tmp_path / "split", [3])
    bad = os.path.join(folder, f"01-{SIZE}x{SIZE}-3.tfrec")
    with tf.io.TFRecordWriter(bad) as writer:
        for k in range(3):
            image = garbled_jpeg() if k == 1 else grey_jpeg(level_of(3 + k))
            writer.write(example({"image": image, "class": 3 + k}))
    return folder, bad


def test_tensorflow_decodes_the_garbled_test_image_with_only_libjpegs_anonymous_warning(capfd):
    """Why the check exists: the record the tests use passes TensorFlow's decoder, as garbage."""
    capfd.readouterr()
    image = tf.io.decode_jpeg(garbled_jpeg(), channels=3).numpy()
    assert image.shape == (SIZE, SIZE, 3)
    assert capfd.readouterr().err.strip().endswith("Corrupt JPEG data: premature end of data segment")


def test_without_simplejpeg_one_notice_and_decoding_works(split_with_a_garbled_record, monkeypatch):
    folder, _ = split_with_a_garbled_record
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import simplejpeg -> ImportError
    monkeypatch.setattr(jpeg, "strict_decoder", functools.cache(jpeg.strict_decoder.__wrapped__))  # probed again
    monkeypatch.setattr(jpeg, "_notice_not_checked", functools.cache(jpeg._notice_not_checked.__wrapped__))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, first = collect(load(folder))
        _, again = collect(load(folder))
    notices = [w for w in caught if "simplejpeg is not installed" in str(w.message)]
    assert len(notices) == 1 and "pip install -U simplejpeg" in str(notices[0].message)
    assert first["label"][first["mask"]].tolist() == [0, 1, 2, 3, 4, 5]  # the garbled one is not detected
    assert np.array_equal(first["image"][0], tf.io.decode_jpeg(grey_jpeg(level_of(0)), channels=3).numpy())
    assert np.array_equal(first["image"], again["image"])


@needs_simplejpeg
def test_the_jobs_label_scan_decodes_nothing_and_the_first_epoch_names_it_or_skips_it(split_with_a_garbled_record,
                                                                                        tmp_path):
    """No work twice: the scan before training parses labels (and checks what needs no decode); the first epoch,
    which decodes every image anyway, finds the corrupt data."""
    from kaggle_utils import run
    from kaggle_utils.config import TrainConfig

    folder, bad = split_with_a_garbled_record
    root = tmp_path / "data"
    os.makedirs(root)
    for split in ("train", "val"):
        os.symlink(folder, root / split)
    config = TrainConfig().replace(data_dir=str(root))
    assert run.open_data(config, root).max_label == 5
    bad = str(root / "train" / os.path.basename(bad))
    with pytest.raises(kd.DataError, match=f"{bad}, record 1: corrupt JPEG data.*skip_errors"):
        list(kd.load_dataset(root / "train", image_size=SIZE, batch_size=4, training=True, seed=0))
    dataset = kd.load_dataset(root / "train", image_size=SIZE, batch_size=5, training=True, seed=0, skip_errors=True)
    with pytest.warns(RuntimeWarning, match=f"skipping bad record {bad}, record 1: corrupt JPEG data"):
        labels = sorted(next(iter(dataset))["label"].tolist())
    assert labels == [0, 1, 2, 3, 5]


@needs_simplejpeg
def test_prediction_keeps_a_corrupt_test_image_and_names_it(tmp_path):
    folder = write_kaggle_split(tmp_path / "test", [2], labeled=False)
    bad = os.path.join(folder, f"01-{SIZE}x{SIZE}-1.tfrec")
    with tf.io.TFRecordWriter(bad) as writer:
        writer.write(example({"image": garbled_jpeg(), "id": b"garbled"}))
    with pytest.warns(RuntimeWarning, match=f"{bad}, record 0: corrupt JPEG data.*kept as decoded"):
        _, data = collect(load(folder, labeled=False))
    assert data["id"][data["mask"]].tolist() == [b"id-0", b"id-1", b"garbled"]


@needs_simplejpeg
def test_check_tfrecords_lists_it(split_with_a_garbled_record):
    folder, bad = split_with_a_garbled_record
    (problem,) = kd.check_tfrecords(kd.list_tfrecords(folder), labeled=True, image_size=SIZE)
    assert (problem.filename, problem.index) == (bad, 1) and "corrupt JPEG data" in problem.problem


@pytest.fixture
def folder_with_a_garbled_jpeg(tmp_path):
    os.makedirs(tmp_path / "cat")
    for k in range(3):
        Image.fromarray(np.roll(PHOTO, 9 * k, axis=1)).save(tmp_path / "cat" / f"{k}.jpg")
    clean = pil_jpeg(PHOTO, quality=90)
    garbled = tmp_path / "cat" / "garbled.jpg"
    garbled.write_bytes(clean[:scan_start(clean) + (len(clean) - scan_start(clean)) // 2] + clean[-2:])
    return kd.class_folders(str(tmp_path)), str(garbled)


@needs_simplejpeg
def test_a_source_image_is_named_or_skipped_and_the_converter_leaves_it_out(folder_with_a_garbled_jpeg, tmp_path):
    source, garbled = folder_with_a_garbled_jpeg
    read = dict(batch_size=4, image_size=SIZE)
    with pytest.raises(kd.DataError, match=f"{garbled}.*corrupt JPEG data"):
        list(kd.load_source(source, **read))
    dataset = kd.load_source(source, skip_errors=True, with_ids=True, **read)
    with pytest.warns(RuntimeWarning, match="garbled.jpg"):
        _, batch = collect(dataset)
    assert dataset.num_skipped == 1 and dataset.skipped_records[0].filename == garbled
    assert sorted(batch["id"][batch["mask"]].tolist()) == [b"cat/0", b"cat/1", b"cat/2"]
    with pytest.raises(kd.DataError, match="garbled.jpg.*corrupt JPEG data"):
        convert.convert_source(source, tmp_path / "out", image_size=SIZE, val_fraction=0.0)
    with pytest.warns(RuntimeWarning, match="garbled.jpg"):
        info = convert.convert_source(source, tmp_path / "out", image_size=SIZE, val_fraction=0.0, skip_errors=True)
    assert info["counts"] == {"train": 3}


@needs_simplejpeg
def test_a_corrupt_test_image_of_a_source_is_converted_with_a_warning_for_its_row(folder_with_a_garbled_jpeg, tmp_path):
    """A --test-source image keeps its submission row, as the competition's test records do."""
    source, garbled = folder_with_a_garbled_jpeg
    test = kd.image_folder(os.path.dirname(garbled))
    with pytest.warns(RuntimeWarning, match="garbled.jpg.*corrupt JPEG data"):
        info = convert.convert_source(kd.class_folders(str(tmp_path)), tmp_path / "out", image_size=SIZE,
                                      val_fraction=0.0, skip_errors=True, test=test)
    assert info["counts"]["test"] == 4 == test.num_examples  # the training split left it out (skip_errors)
    assert info["counts"]["train"] == 3
