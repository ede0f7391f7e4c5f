"""Sources other than TFRecords (class folders, CSV + images, image folders, tfds), load_source, the converter.

Images are real ones shipped by installed packages: scikit-learn's digits (8x8 greyscale, saved
as PNGs) and scikit-image's photos (shrunk, saved as JPEG / RGBA PNG), mixed in one source so
every read goes through several formats and modes. Each test checks what it reads against
what was written: every example once, with its own label and id.
"""
import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from skimage import data as skdata
from sklearn.datasets import load_digits

import kaggle_utils.data as kd
from kaggle_utils.data import convert, transforms

SIZE = 16
DIGITS = load_digits()
PHOTOS = {name: np.asarray(Image.fromarray(getattr(skdata, name)()).resize((30, 20), Image.BILINEAR))
          for name in ("astronaut", "coffee", "chelsea")}


def digit(i: int) -> Image.Image:
    return Image.fromarray(np.round(DIGITS.images[i] * 255 / 16).astype(np.uint8))  # mode L


def save(image: Image.Image, path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image.save(path, quality=95) if path.endswith(".jpg") else image.save(path)
    return path


def expected_pixels(path: str, size: int = SIZE) -> np.ndarray:
    """The reference read: PIL's RGB conversion (what decode_image gives, see test_data_transforms) + Resize."""
    rgb = np.asarray(Image.open(path).convert("RGB"))
    return transforms.Resize(size)(tf.constant(rgb)).numpy()


def read_all(source, **kwargs):
    defaults = dict(batch_size=4, image_size=SIZE)
    dataset = kd.load_source(source, **{**defaults, **kwargs})
    batches = list(dataset)
    out = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    return {k: v[out["mask"]] for k, v in out.items()}, dataset


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """train/<class>/... (digits as PNG, photos as JPEG and RGBA PNG) and a flat test/ folder."""
    root = str(tmp_path_factory.mktemp("folders"))
    truth = {}  # relative id -> class name
    for i in range(12):
        name = f"digit{DIGITS.target[i] % 3}"
        truth[save(digit(i), f"{root}/train/{name}/d{i:02d}.png")] = name
    for j, (photo, pixels) in enumerate(PHOTOS.items()):
        truth[save(Image.fromarray(pixels), f"{root}/train/photo/{photo}.jpg")] = "photo"
        truth[save(Image.fromarray(pixels).convert("RGBA"), f"{root}/train/photo/{photo}_alpha.png")] = "photo"
    for i in range(12, 17):
        save(digit(i), f"{root}/test/t{i}.png")
    return root, truth


def test_class_folders_read_every_example_once_with_its_label(folders):
    root, truth = folders
    source = kd.class_folders(f"{root}/train")
    assert source.class_names == sorted(set(truth.values())) and source.num_examples == len(truth)
    batch, _ = read_all(source, with_ids=True)
    ids = [i.decode() for i in batch["id"]]
    assert len(set(ids)) == len(ids) == len(truth)
    for id_, label, image in zip(ids, batch["label"], batch["image"]):
        path = next(p for p in truth if os.path.splitext(os.path.relpath(p, f"{root}/train"))[0] == id_)
        assert source.class_names[label] == truth[path]
        np.testing.assert_array_equal(image, expected_pixels(path))


def test_unlabeled_folder_gives_ids_in_order_and_a_padded_masked_last_batch(folders):
    root, _ = folders
    source = kd.image_folder(f"{root}/test")
    dataset = kd.load_source(source, batch_size=4, image_size=SIZE)
    batches = list(dataset)
    assert [len(b["id"]) for b in batches] == [4, 4] and batches[-1]["mask"].tolist() == [True] + [False] * 3
    ids = [i.decode() for b in batches for i, m in zip(b["id"], b["mask"]) if m]
    assert ids == [f"t{i}" for i in range(12, 17)] and "label" not in batches[0]


def test_training_processes_read_disjoint_shares_that_cover_the_source(folders, monkeypatch):
    import jax

    root, _ = folders
    source = kd.class_folders(f"{root}/train")
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    shares = []
    for k in range(3):
        monkeypatch.setattr(jax, "process_index", lambda: k)
        dataset = kd.load_source(source, batch_size=1, image_size=SIZE, training=True, seed=0, with_ids=True)
        iterator = iter(dataset)
        shares.append([next(iterator)["id"][0] for _ in range(dataset.num_examples)])
    assert [len(s) for s in shares] == [6, 6, 6] and len(set(sum(shares, []))) == 18
    assert sorted(sum(shares, [])) == sorted(i.encode() for i in source.ids)


def test_a_training_read_with_a_train_crop(folders):
    root, _ = folders
    source = kd.class_folders(f"{root}/train")
    dataset = kd.load_source(source, batch_size=6, crop=kd.RandomResizedCrop(12), training=True, seed=0,
                             with_ids=True)
    batches = [b for b, _ in zip(dataset, range(9))]  # three epochs of 18
    assert all(b["image"].shape == (6, 12, 12, 3) and b["mask"].all() for b in batches)
    ids = [i.decode() for b in batches for i in b["id"]]
    epochs = [ids[e * 18:(e + 1) * 18] for e in range(3)]
    assert all(sorted(epoch) == sorted(source.ids) for epoch in epochs)  # every one read once per epoch
    assert epochs[0] != source.ids and epochs[0] != epochs[1] != epochs[2]  # reshuffled each epoch
    labels = np.concatenate([b["label"] for b in batches])
    assert [source.class_names[l] for l in labels] == [i.split("/")[0] for i in ids]  # labels travel with ids


# --------------------------------------------------------------------------------------
# CSV + images
# --------------------------------------------------------------------------------------
def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


@pytest.fixture(scope="module")
def csv_images(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("csv"))
    for i in range(10):
        save(digit(i), f"{root}/images/img{i}.png")
    for name, pixels in PHOTOS.items():
        save(Image.fromarray(pixels), f"{root}/images/{name}.jpg")
    return root


def test_csv_with_integer_labels_and_ids_without_extension(csv_images):
    path = write_csv(f"{csv_images}/train.csv", ["image_id", "digit"],
                     [[f"img{i}", int(DIGITS.target[i])] for i in range(10)])
    source = kd.csv_source(path, f"{csv_images}/images", id_column="image_id", label_column="digit")
    assert (source.id_column, source.label_column, source.multi_label) == ("image_id", "digit", False)
    assert source.class_names == [str(c) for c in range(10)]
    batch, _ = read_all(source, with_ids=True)
    assert [i.decode() for i in batch["id"]] == [f"img{i}" for i in range(10)]
    np.testing.assert_array_equal(batch["label"], DIGITS.target[:10])
    for i in range(10):
        np.testing.assert_array_equal(batch["image"][i], expected_pixels(f"{csv_images}/images/img{i}.png"))


def test_csv_multi_label_gives_multi_hot_targets(csv_images):
    tags = {"astronaut": "person space", "coffee": "cup", "chelsea": "animal", "img0": "cup animal person"}
    path = write_csv(f"{csv_images}/multi.csv", ["image_name", "tags"],
                     [[name + (".jpg" if name in PHOTOS else ".png"), t] for name, t in tags.items()])
    source = kd.csv_source(path, f"{csv_images}/images", id_column="image_name", label_column="tags")
    assert source.multi_label and source.class_names == ["animal", "cup", "person", "space"]
    batch, _ = read_all(source, batch_size=3)
    assert batch["label"].dtype == np.float32 and batch["label"].shape == (4, 4)
    for row, t in zip(batch["label"], tags.values()):
        assert sorted(np.flatnonzero(row).tolist()) == sorted(source.class_names.index(x) for x in t.split())


def test_test_csv_keeps_the_competitions_column_names_and_ids(csv_images):
    path = write_csv(f"{csv_images}/test.csv", ["id"], [["coffee.jpg"], ["img3"], ["chelsea"]])
    source = kd.csv_source(path, f"{csv_images}/images", id_column="id", class_names=["a", "b"])
    assert not source.labeled and source.id_column == "id" and source.class_names == ["a", "b"]
    batch, _ = read_all(source)
    assert batch["id"].tolist() == [b"coffee.jpg", b"img3", b"chelsea"]


# --------------------------------------------------------------------------------------
# Bad input: a DataError naming file, line and column, before anything is read
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("header,rows,kwargs,names", [
    (["image_id", "label"], [["img1", "1"], ["img_missing", "2"]], {}, ["line 3", "'image_id'", "img_missing"]),
    (["image_id", "label"], [["img1", "1"], ["img1", "2"]], {}, ["duplicate id 'img1'", "line 2", "line 3"]),
    (["image_id", "label"], [["img1", "cat"], ["img2", "3"]], {}, ["mixed label kinds", "'label'", "line 3"]),
    (["image_id", "label"], [["img1", "cat"], ["img2", "owl"]], {"class_names": ["cat", "dog"]},
     ["line 3", "'owl'", "not in the 2 classes"]),
    (["image_id", "label"], [["img1", "7"]], {"class_names": ["cat", "dog"]}, ["line 2", "'7'"]),
    (["image_id", "label"], [["img1", ""]], {}, ["line 2", "empty label"]),
    (["image_id", "label"], [["img1", "a b"]], {"multi_label": False}, ["line 2", "several labels"]),
    (["name", "label"], [["img1", "1"]], {}, ["no column 'image_id'", "columns: name, label"]),
])
def test_bad_csv_rows_raise_naming_where(csv_images, header, rows, kwargs, names):
    path = write_csv(f"{csv_images}/bad.csv", header, rows)
    with pytest.raises(kd.DataError) as error:
        kd.csv_source(path, f"{csv_images}/images", id_column="image_id", label_column="label", **kwargs)
    assert "bad.csv" in str(error.value) and all(n in str(error.value) for n in names), str(error.value)


def test_empty_class_folder_and_duplicate_test_ids_raise(tmp_path):
    save(digit(0), f"{tmp_path}/train/zero/a.png")
    os.makedirs(f"{tmp_path}/train/one")
    with pytest.raises(kd.DataError, match=r"class folder .*one.* holds no images"):
        kd.class_folders(f"{tmp_path}/train")
    save(digit(0), f"{tmp_path}/test/a.png")
    save(digit(1), f"{tmp_path}/test/a.jpg")
    with pytest.raises(kd.DataError, match=r"duplicate id 'a'.*a\.jpg.*a\.png"):
        kd.image_folder(f"{tmp_path}/test")


@pytest.fixture
def with_a_broken_file(tmp_path):
    for i in range(5):
        save(digit(i), f"{tmp_path}/c/{'even' if i % 2 == 0 else 'odd'}/d{i}.png")
    with open(f"{tmp_path}/c/odd/broken.jpg", "wb") as f:
        f.write(b"not an image at all")
    return kd.class_folders(f"{tmp_path}/c"), f"{tmp_path}/c/odd/broken.jpg"


def test_an_undecodable_file_is_named(with_a_broken_file):
    source, broken = with_a_broken_file
    with pytest.raises(kd.DataError, match=f"{broken}.*image does not decode.*skip_errors"):
        read_all(source)


def test_skip_errors_leaves_it_out_and_counts_it(with_a_broken_file):
    source, broken = with_a_broken_file
    with pytest.warns(RuntimeWarning, match="broken.jpg"):
        batch, dataset = read_all(source, skip_errors=True, with_ids=True)
    assert dataset.num_skipped == 1 and dataset.skipped_records[0].filename == broken
    assert sorted(batch["id"].tolist()) == sorted(i.encode() for i in source.ids if "broken" not in i)


# --------------------------------------------------------------------------------------
# tensorflow-datasets, prepared here (no download)
# --------------------------------------------------------------------------------------
def test_tfds_source_reads_every_example_once_with_its_label(tiny_tfds):
    source = kd.tfds_source("tiny_digits", "train", data_dir=tiny_tfds)
    assert source.class_names == [f"d{i}" for i in range(10)] and source.num_examples == 30
    batch, _ = read_all(source, image_size=8, batch_size=7, with_ids=True)
    assert sorted(batch["id"].tolist()) == sorted(f"train-{i}".encode() for i in range(30))
    expected = sorted((np.asarray(digit(i).convert("RGB")).tobytes(), int(DIGITS.target[i])) for i in range(30))
    assert sorted(zip((im.tobytes() for im in batch["image"]), batch["label"].tolist())) == expected


def test_tfds_not_prepared_is_a_clear_error(tmp_path, tiny_tfds):
    with pytest.raises(kd.DataError, match="not prepared"):
        kd.tfds_source("tiny_digits", "train", data_dir=str(tmp_path))


# --------------------------------------------------------------------------------------
# The converter
# --------------------------------------------------------------------------------------
def decoded_records(folder, labeled):
    key = "class" if labeled else "id"
    dtype = tf.int64 if labeled else tf.string
    out = []
    for path in kd.list_tfrecords(folder):
        for record in tf.data.TFRecordDataset(path):
            parsed = tf.io.parse_single_example(record, {"image": tf.io.FixedLenFeature([], tf.string),
                                                         key: tf.io.FixedLenFeature([], dtype)})
            image = tf.io.decode_jpeg(parsed["image"], dct_method="INTEGER_ACCURATE").numpy()
            out.append((image.tobytes(), parsed[key].numpy()))
    return out


def jpeg_round_trip(image):
    return tf.io.decode_jpeg(kd.encode_jpeg(image, 95), dct_method="INTEGER_ACCURATE").numpy()


def test_convert_round_trip_equals_the_source(folders, tmp_path):
    root, _ = folders
    train, test = kd.class_folders(f"{root}/train"), kd.image_folder(f"{root}/test")
    info = convert.convert_source(train, tmp_path, image_size=SIZE, val_fraction=0.25, shards=2, test=test)
    assert info["class_names"] == train.class_names and info == convert.read_conversion_info(tmp_path)
    per_class_val = [int(round(0.25 * n)) for n in np.bincount(train.labels)]  # stratified
    n_val = sum(per_class_val)
    assert info["counts"] == {"train": 18 - n_val, "val": n_val, "test": 5}
    first = (18 - n_val + 1) // 2
    assert sorted(os.listdir(tmp_path / "train")) == [f"00-{SIZE}x{SIZE}-{first}.tfrec",
                                                     f"01-{SIZE}x{SIZE}-{18 - n_val - first}.tfrec"]
    # same pixels as the source decoded, its shorter side resized, the centre square (the aspect ratio kept), JPEG
    # round-tripped with the same encoder (exact)
    square = dict(image_size=None, crop=kd.CenterCrop(SIZE, crop_pct=1.0))
    source, _ = read_all(train, **square)
    expected = sorted((jpeg_round_trip(im).tobytes(), label) for im, label in zip(source["image"], source["label"]))
    written = sorted(decoded_records(tmp_path / "train", True) + decoded_records(tmp_path / "val", True))
    assert written == expected
    val_labels = [label for _, label in decoded_records(tmp_path / "val", True)]
    assert np.bincount(val_labels, minlength=4).tolist() == per_class_val
    test_source, _ = read_all(test, **square)
    assert sorted(decoded_records(tmp_path / "test", False)) == sorted(
        (jpeg_round_trip(im).tobytes(), id_) for im, id_ in zip(test_source["image"], test_source["id"]))
    # the records run through the TFRecord pipeline like the competition's
    batches = list(kd.load_dataset(tmp_path / "val", labeled=True, image_size=SIZE, batch_size=4))
    assert sum(int(b["mask"].sum()) for b in batches) == n_val


def test_convert_refuses_to_mix_runs_and_overwrite_replaces_every_split(folders, tmp_path):
    root, _ = folders
    train = kd.class_folders(f"{root}/train")
    convert.convert_source(train, tmp_path, image_size=SIZE, val_fraction=0.25, shards=3,
                           test=kd.image_folder(f"{root}/test"))
    with pytest.raises(FileExistsError, match="overwrite"):
        convert.convert_source(train, tmp_path, image_size=8, shards=1)
    info = convert.convert_source(train, tmp_path, image_size=8, val_fraction=0.0, shards=1, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["class_names.json", "train"]  # old val/ and test/ went with the run
    assert os.listdir(tmp_path / "train") == ["00-8x8-18.tfrec"] and info["counts"] == {"train": 18}


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_convert_command_line_with_a_csv_and_a_tfds_source(csv_images, tiny_tfds, tmp_path, capsys):
    from kaggle_utils.data.__main__ import main

    path = write_csv(f"{csv_images}/cli.csv", ["image_id", "label"], [[f"img{i}", "even" if i % 2 == 0 else "odd"]
                                                                       for i in range(10)])
    common = [path, "--image-dir", f"{csv_images}/images", "--image-size", "8"]
    assert main(["convert", *common, "--out", str(tmp_path / "csv"), "--id-column", "image_id", "--val-fraction",
                 "0.2", "--shards", "2"]) == 0
    info = json.loads((tmp_path / "csv" / "class_names.json").read_text())
    assert info["class_names"] == ["even", "odd"] and info["counts"] == {"train": 8, "val": 2}
    assert info["id_column"] == "image_id" and info["label_column"] == "label"
    assert main(["convert", *common, "--out", str(tmp_path / "bad"), "--label-column", "tag"]) == 2
    assert "cli.csv: no column 'id', 'tag'" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    # python -m, and a prepared tfds folder read offline by a process that does not have the builder's code
    run = subprocess.run([sys.executable, "-m", "kaggle_utils.data", "convert", "tfds:tiny_digits:train", "--out",
                          str(tmp_path / "tfds"), "--tfds-data-dir", tiny_tfds, "--image-size", "8", "--shards", "1"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert run.returncode == 0, run.stderr
    assert sum(convert.read_conversion_info(tmp_path / "tfds")["counts"].values()) == 30
    # the dataset's files, fingerprinted in that process, are this process's: the conversion would be reused
    tfds_train = kd.tfds_source("tiny_digits", "train", data_dir=tiny_tfds)
    assert convert.conversion_changes(tmp_path / "tfds", tfds_train, image_size=8, shards=1) == []
    assert convert.conversion_changes(tmp_path / "tfds", tfds_train, image_size=8) == ["--shards changed 1 -> 16"]


def test_numpy_augmentation_runs_on_source_batches(folders):
    root, _ = folders
    source = kd.class_folders(f"{root}/train")
    plain, _ = read_all(source)
    inverted, _ = read_all(source, augment=lambda images: 255 - images, augment_workers=0)
    np.testing.assert_array_equal(inverted["image"], 255 - plain["image"])
    np.testing.assert_array_equal(inverted["label"], plain["label"])


def test_stratified_split_partitions_each_class_and_keeps_one_in_train():
    labels = np.array([0] * 10 + [1] * 4 + [2])
    train, val = convert.stratified_split(labels, 0.6, seed=3)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(len(labels)))
    assert np.bincount(labels[val], minlength=3).tolist() == [6, 2, 0]  # round(0.6 * n), class 2 stays in train
    assert np.bincount(labels[train], minlength=3).tolist() == [4, 2, 1]
    again, _ = convert.stratified_split(labels, 0.6, seed=3)
    np.testing.assert_array_equal(again, train)


def test_unseeded_reads_work_once_tensorflow_op_determinism_is_on(folders, tmp_path):
    """A notebook may turn op determinism on for its own TensorFlow code; the kit's unseeded reads still run."""
    script = f"""
import kaggle_utils.data as kd
kd.tensorflow_on_host().config.experimental.enable_op_determinism()
source = kd.class_folders({folders[0] + "/train"!r})
batches = list(kd.load_source(source, batch_size=4, crop=kd.CenterCrop(16, crop_pct=0.875)))
assert sum(int(b["mask"].sum()) for b in batches) == source.num_examples
sample = kd.make_sample_dataset({str(tmp_path / "sample")!r}, image_size=16)
train = iter(kd.load_dataset(sample.split_dirs["train"], labeled=True, image_size=16, batch_size=8,
                             crop=kd.RandomResizedCrop(12), augment="randaugment", training=True))
assert next(train)["image"].shape == (8, 12, 12, 3)
print("ok")
"""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-2000:]
