"""The job on other competitions' data: class folders, a CSV, another image size (``job.main`` with a user's flags)."""
import csv
import json

import numpy as np
import pytest

from job_helpers import TEST_MODEL, job_in_process


def _digit_images(n_per_class, offset=0):
    from sklearn.datasets import load_digits

    d = load_digits()
    for digit in range(10):
        for i, image in enumerate(d.images[d.target == digit][offset:offset + n_per_class]):
            big = np.kron((image * 255 / 16).astype(np.uint8), np.ones((4, 4), np.uint8))  # 8 -> 32 px
            yield digit, i, np.repeat(big[..., None], 3, -1)


def _save_png(path, image):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)


pytestmark = pytest.mark.slow  # each test trains a run (tests/tiers.py)

SOURCE_ARGS = ["--model", TEST_MODEL, "--image-size", "32", "--steps", "2", "--batch-size", "64",
               "--no-progress"]


def test_the_job_trains_from_class_folders_and_submits_the_folder_ids(tmp_path, capfd):
    for digit, i, image in _digit_images(20):
        _save_png(tmp_path / "folders" / str(digit) / f"{digit}_{i}.png", image)
    for digit, i, image in _digit_images(3, offset=20):
        _save_png(tmp_path / "test" / f"t{digit}{i}.png", image)
    args = ["train", "--source", str(tmp_path / "folders"), "--test-source", str(tmp_path / "test"), *SOURCE_ARGS]
    log = job_in_process(args, tmp_path / "run", capfd)
    assert "converting 200 images to 32px TFRecords" in log
    with open(tmp_path / "run" / "submission.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "label"]
    assert sorted(r[0] for r in rows[1:]) == sorted(p.stem for p in (tmp_path / "test").iterdir())
    assert {r[1] for r in rows[1:]} <= {str(d) for d in range(10)}
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["data"]["class_names"] == [str(d) for d in range(10)]


def test_a_test_image_added_after_a_run_is_in_the_next_runs_submission(tmp_path, capfd):
    """The run's OUT/data holds the first conversion; --overwrite must not predict the old test split."""
    for digit, i, image in _digit_images(8):  # 70 to train on, above the batch of 64
        _save_png(tmp_path / "folders" / str(digit) / f"{digit}_{i}.png", image)
    for digit, i, image in _digit_images(1, offset=8):
        _save_png(tmp_path / "test" / f"t{digit}{i}.png", image)
    args = ["train", "--source", str(tmp_path / "folders"), "--test-source", str(tmp_path / "test"), *SOURCE_ARGS]
    job_in_process(args, tmp_path / "run", capfd)
    _save_png(tmp_path / "test" / "late.png", next(_digit_images(1, offset=9))[2])
    log = job_in_process([*args, "--overwrite"], tmp_path / "run", capfd)
    with open(tmp_path / "run" / "submission.csv") as f:
        ids = [row[0] for row in csv.reader(f)][1:]
    assert sorted(ids) == sorted(p.stem for p in (tmp_path / "test").iterdir())  # late included, once
    assert "the test source's files changed: 10 -> 11 images" in log


def test_the_job_trains_from_a_csv_and_submits_in_its_columns_with_its_label_names(tmp_path, capfd):
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    train_rows, test_ids = [], []
    for digit, i, image in _digit_images(20):
        _save_png(tmp_path / "images" / f"a{digit}_{i}.png", image)
        train_rows.append(f"a{digit}_{i},{names[digit]}")
    for digit, i, image in _digit_images(2, offset=20):
        _save_png(tmp_path / "images" / f"b{digit}_{i}.png", image)
        test_ids.append(f"b{digit}_{i}")
    (tmp_path / "train.csv").write_text("image_id,digit\n" + "\n".join(train_rows) + "\n")
    (tmp_path / "test.csv").write_text("image_id\n" + "\n".join(test_ids) + "\n")
    args = ["train", "--source", str(tmp_path / "train.csv"), "--test-source", str(tmp_path / "test.csv"),
            "--image-dir", str(tmp_path / "images"), "--id-column", "image_id", "--label-column", "digit",
            *SOURCE_ARGS]
    job_in_process(args, tmp_path / "run", capfd)
    with open(tmp_path / "run" / "submission.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["image_id", "digit"]
    assert [r[0] for r in rows[1:]] == test_ids  # the test CSV's order
    assert {r[1] for r in rows[1:]} <= set(names)


def test_the_job_trains_at_another_size_with_random_crops_and_evaluates_a_center_crop(tmp_path, capfd):
    """Stored at 32 px: train on random-resized 24 px crops, evaluate and predict 32 px center crops (FixRes)."""
    args = ["train", "--model", TEST_MODEL, "--image-size", "24", "--train-crop", "random-resized",
            "--eval-image-size", "32",
            "--crop-pct", "0.875", "--steps", "3", "--batch-size", "64", "--no-progress"]
    log = job_in_process(args, tmp_path / "run", capfd)
    assert "at 24px" in log
    rows = (tmp_path / "run" / "submission.csv").read_text().splitlines()
    assert len(rows) - 1 == 269  # the sample's test split, every id once
    config = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert config["model"]["image_size"] == 24 and config["data"]["crop_pct"] == 0.875
