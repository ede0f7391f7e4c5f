"""make_sample_dataset: the competition's layout and features, from installed data."""
import csv
import os
import re

import numpy as np
import pytest
import tensorflow as tf
from sklearn.datasets import load_digits

import kaggle_utils.data as kd

SIZE = 24


def raw_examples(folder):
    for path in sorted(os.listdir(folder)):
        for record in tf.data.TFRecordDataset(os.path.join(folder, path)):
            yield tf.train.Example.FromString(record.numpy()).features.feature


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    return kd.make_sample_dataset(tmp_path_factory.mktemp("digits"), image_size=SIZE)


def test_digits_sample_has_the_competition_layout_and_features(digits):
    assert sum(digits.counts.values()) == 1797 and digits.num_classes == 10
    assert abs(digits.counts["train"] / 1797 - 0.70) < 0.01 and abs(digits.counts["val"] / 1797 - 0.15) < 0.01
    for split, folder in digits.split_dirs.items():
        assert folder == os.path.join(digits.root, split)
        names = sorted(os.listdir(folder))
        assert all(re.fullmatch(rf"\d\d-{SIZE}x{SIZE}-\d+\.tfrec", n) for n in names), names
        files = [os.path.join(folder, n) for n in names]
        assert [kd.count_from_name(f) for f in files] == [kd.count_records(f) for f in files]
        assert kd.count_data_items(files) == digits.counts[split]
        features = next(raw_examples(folder))
        assert set(features) == ({"image", "id"} if split == "test" else {"image", "class"})
        image = tf.io.decode_jpeg(features["image"].bytes_list.value[0]).numpy()
        assert image.shape == (SIZE, SIZE, 3)


def test_digits_labels_ids_and_images_are_the_real_digits(digits):
    labels = [f["class"].int64_list.value[0] for f in raw_examples(digits.split_dirs["train"])]
    assert set(labels) == set(range(10))
    ids = [f["id"].bytes_list.value[0].decode() for f in raw_examples(digits.split_dirs["test"])]
    assert len(set(ids)) == len(ids) == digits.counts["test"]
    with open(os.path.join(digits.root, "test_labels.csv")) as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "label"] and {r[0] for r in rows[1:]} == set(ids)
    assert digits.test_labels == {r[0]: int(r[1]) for r in rows[1:]}
    # each decoded image, shrunk back to 8x8, matches one of sklearn's digits of its label
    reference = load_digits()
    batch = next(iter(kd.load_dataset(digits.split_dirs["val"], labeled=True, image_size=SIZE, batch_size=16)))
    shrunk = batch["image"][..., 0].reshape(16, 8, SIZE // 8, 8, SIZE // 8).mean(axis=(2, 4)) * 16 / 255
    for image, label in zip(shrunk, batch["label"]):
        candidates = reference.images[reference.target == label]
        correlations = [np.corrcoef(image.ravel(), c.ravel())[0, 1] for c in candidates]
        assert max(correlations) > 0.95


def test_synthetic_sample_has_104_classes_in_the_flower_format(tmp_path):
    sample = kd.make_sample_dataset(tmp_path, "synthetic", image_size=SIZE, num_examples=208, num_files=(3, 1, 1))
    assert sample.num_classes == 104 and sum(sample.counts.values()) == 208
    assert len(os.listdir(sample.split_dirs["train"])) == 3
    dataset = kd.load_dataset(sample.split_dirs["train"], labeled=True, image_size=SIZE, batch_size=32)
    labels = np.concatenate([b["label"][b["mask"]] for b in dataset])
    assert len(labels) == sample.counts["train"] and labels.min() >= 0 and labels.max() < 104
    assert len(set(labels.tolist())) > 80


def test_same_arguments_reuse_the_files_and_other_arguments_need_overwrite(tmp_path):
    first = kd.make_sample_dataset(tmp_path, "synthetic", image_size=SIZE, num_examples=40, num_files=(2, 1, 1))
    train_file = kd.list_tfrecords(first.split_dirs["train"])[0]
    written = os.path.getmtime(train_file)
    again = kd.make_sample_dataset(tmp_path, "synthetic", image_size=SIZE, num_examples=40, num_files=(2, 1, 1))
    assert again == first and os.path.getmtime(train_file) == written
    with pytest.raises(FileExistsError, match="overwrite=True"):
        kd.make_sample_dataset(tmp_path, "synthetic", image_size=SIZE, num_examples=60, num_files=(2, 1, 1))
    replaced = kd.make_sample_dataset(tmp_path, "synthetic", image_size=SIZE, num_examples=60, num_files=(2, 1, 1),
                                      overwrite=True)
    assert sum(replaced.counts.values()) == 60
    assert kd.count_data_items(kd.list_tfrecords(replaced.split_dirs["train"])) == replaced.counts["train"]


def test_bad_arguments_are_errors(tmp_path):
    with pytest.raises(ValueError, match="source must be"):
        kd.make_sample_dataset(tmp_path, "flowers")
    with pytest.raises(ValueError, match="num_examples"):
        kd.make_sample_dataset(tmp_path, "digits", num_examples=5000)


def test_flower_class_names_are_the_competition_list():
    from pathlib import Path
    import json

    from kaggle_utils.data import FLOWER_NUM_CLASSES, flower_class_names

    raw = flower_class_names(strip=False)
    names = flower_class_names()
    assert len(names) == FLOWER_NUM_CLASSES == 104 and len(set(names)) == 104
    assert [i for i, n in enumerate(raw) if n != n.strip()] == [87, 90]  # kept verbatim, stripped for display
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / "flower_classes.json"
    if shared.is_file():  # the project's reference list, beside the repository in CI
        assert raw == json.loads(shared.read_text())
