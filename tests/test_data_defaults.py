"""Photos kept good enough to crop, and the defaults chosen from them (issue 49).

* A converted source stores each image at the storage rule's side, shorter side resized, then the centre square
  (the aspect ratio kept), train / val / test alike, and its fingerprint says so; the job picks the side from the
  photos' own and the training size.
* ``resolve`` settles every ``auto`` crop and multi-label field from the data and says each choice and its reason in
  the plan line; a value given is kept.

Images are made here with known bands of colour, so what a record holds is checked against a PIL reference of the
same crop, never against the code under test. No model is compiled: ``resolve`` only computes numbers.
"""
import json

import numpy as np
import pytest
from PIL import Image

import kaggle_utils.data as kd
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.data import convert
from kaggle_utils.run import resolve
from kaggle_utils.run.build import eval_crop, train_crop
from kaggle_utils.run.data import SAMPLE, RunData, converted_source

from job_helpers import TEST_MODEL
from train_helpers import masked_rows

WIDE = (24, 40)  # height, width of the training photos: 5:3, so a squash and a centre square differ


def _photo(height: int, width: int, shade: int) -> np.ndarray:
    """Red ramps left to right and blue top to bottom (where the image was cut shows), green the class shade."""
    image = np.zeros((height, width, 3), np.uint8)
    image[..., 0] = np.linspace(0, 255, width).round().astype(np.uint8)[None, :]
    image[..., 1] = shade
    image[..., 2] = np.linspace(0, 255, height).round().astype(np.uint8)[:, None]
    return image


def _reference(image: np.ndarray, side: int) -> np.ndarray:
    """Shorter side to ``side``, the longer floored (PIL, bilinear with antialias), then the centre ``side`` x
    ``side``: torchvision's Resize(side) + CenterCrop(side)."""
    height, width = image.shape[:2]
    size = (side, side * height // width) if width < height else (side * width // height, side)
    resized = np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))
    top, left = (int(round((resized.shape[i] - side) / 2)) for i in (0, 1))
    return resized[top:top + side, left:left + side]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """``train/{a,b}/`` of 6 wide PNGs each, ``test/`` of 3 tall ones (40 x 24)."""
    root = tmp_path_factory.mktemp("photos")
    for c, name in enumerate("ab"):
        (root / "train" / name).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(_photo(*WIDE, 60 + 120 * c + i)).save(root / "train" / name / f"{name}{i}.png")
    (root / "test").mkdir()
    for i in range(3):
        Image.fromarray(_photo(WIDE[1], WIDE[0], 10 + i)).save(root / "test" / f"t{i}.png")
    return root


def _records(folder, size: int) -> tuple[np.ndarray, np.ndarray]:
    return masked_rows(kd.load_dataset(kd.list_tfrecords(folder), image_size=size, batch_size=8, labeled=False),
                       "image", "id")


def test_the_storage_side_is_the_photos_own_between_the_training_size_and_twice_it():
    assert convert.storage_size(112, 150) == 150  # intel-scenes-mini trained at 112: the photo as it is
    assert convert.storage_size(96, 32) == 96  # CIFAR's 32 px enlarged once to the training size
    assert convert.storage_size(64, 150) == 128  # a large photo capped at twice the training size
    assert convert.storage_size(128, 128) == 128


def test_a_sources_own_side_is_the_median_of_its_shorter_sides(tmp_path):
    for i, (h, w) in enumerate([(20, 50), (30, 30), (80, 40), (10, 90), (44, 60)]):
        (tmp_path / "c").mkdir(exist_ok=True)
        Image.fromarray(_photo(h, w, i)).save(tmp_path / "c" / f"{i}.jpg" if i % 2 else tmp_path / "c" / f"{i}.png")
    assert sorted(convert.source_sides(kd.class_folders(tmp_path)).tolist()) == [10, 20, 30, 40, 44]
    assert convert.source_side(kd.class_folders(tmp_path)) == 30


def test_conversion_keeps_the_aspect_ratio_train_val_and_test_alike(photos, tmp_path):
    side = 16
    info = convert.convert_source(kd.class_folders(photos / "train"), tmp_path, image_size=side, val_fraction=0.34,
                                  test=kd.image_folder(photos / "test"), shards=1)
    assert info["source_side"] == WIDE[0] and info["fit"] == "centre-square" and info["image_size"] == side
    assert info["fingerprint"]["settings"]["fit"] == "centre-square"
    originals = {f"{name}/{name}{i}": _photo(*WIDE, 60 + 120 * c + i) for c, name in enumerate("ab") for i in range(6)}
    originals.update({f"t{i}": _photo(WIDE[1], WIDE[0], 10 + i) for i in range(3)})
    seen = 0
    for split in ("train", "val", "test"):
        for image, id_ in zip(*_records(tmp_path / split, side)):
            original = originals[id_.decode()]
            error = np.abs(image.astype(int) - _reference(original, side))
            assert error.max() <= 12 and error.mean() < 2, (split, id_)  # JPEG's error (its colours, at the edges)
            squashed = np.asarray(Image.fromarray(original).resize((side, side), Image.BILINEAR))
            assert np.abs(image.astype(int) - squashed).max() > 30, (split, id_)  # what the kit stored before
            seen += 1
    assert seen == 15


def test_an_older_squashed_conversion_is_converted_again_saying_why(photos, tmp_path):
    train = kd.class_folders(photos / "train")
    convert.convert_source(train, tmp_path, image_size=16)
    assert convert.conversion_changes(tmp_path, train, image_size=16) == []
    info = json.loads((tmp_path / "class_names.json").read_text())
    del info["fingerprint"]["settings"]["fit"]  # as an older version recorded it
    (tmp_path / "class_names.json").write_text(json.dumps(info))
    assert convert.conversion_changes(tmp_path, train, image_size=16) == [
        "images stored as centre-square (shorter side, then the centre square), not squashed to a square (an older "
        "version)"]


@pytest.mark.parametrize("size, given, stored", [(16, "auto", 24), (8, "auto", 16), (32, "auto", 32), (16, 20, 20)])
def test_the_job_stores_a_source_by_the_rule_or_at_store_size(photos, tmp_path, size, given, stored):
    config = TrainConfig().replace(source=str(photos / "train"), test_source=str(photos / "test"), image_size=size,
                                   store_size=given, val_fraction=0.34)
    folder = converted_source(config, tmp_path)
    info = json.loads((folder / "class_names.json").read_text())
    assert info["image_size"] == stored and info["source_side"] == WIDE[0]
    assert all(f"-{stored}x{stored}-" in p.name for split in ("train", "val", "test")
               for p in (folder / split).iterdir())


# --------------------------------------------------------------------------- the defaults in the plan line


def _data(stored: int, *, side: int | None = None, description: str = "/records", multi_label: bool = False,
          unlabelled: int = 0) -> RunData:
    return RunData(root=None, splits={"train": [], "val": [], "test": []}, stored_size=stored, num_train=64,
                   max_label=2, description=description, multi_label=multi_label, source_side=side,
                   unlabelled=unlabelled)


def _resolved(data: RunData, **flags):
    config = TrainConfig().replace(model=TEST_MODEL, image_size=16, batch_size=8, epochs=2, **flags)
    resolved, plan = resolve(config, data)
    return resolved, plan, plan.describe(resolved)


def test_photos_stored_larger_get_random_resized_crops_and_the_pretrained_crop_pct():
    resolved, plan, line = _resolved(_data(24))
    assert resolved.data.train_crop == "random-resized" and resolved.data.crop_scale == 0.44  # (16 / 24)^2
    assert resolved.data.crop_pct == 0.95 and resolved.data.store_size == 24  # test_efficientnet's pretrained cfg
    assert ("chosen from the data: train crop: random-resized 0.44-1 + flip (images stored at 1.50x the training "
            "size, 24 px for 16: the smallest crop keeps 16 px of real detail)") in line
    assert "evaluation: centre crop 0.95 (the model's pretrained crop_pct, after random-resized crops)" in line
    crop = train_crop(resolved, 24)
    assert (crop.size, crop.scale, crop.hflip) == (16, (0.44, 1.0), 0.5)
    assert (eval_crop(resolved, 24).size, eval_crop(resolved, 24).crop_pct) == (16, 0.95)


@pytest.mark.parametrize("train_crop_flag", ["random-resized", "flip", "none"])
def test_interpolation_reaches_every_train_crop_and_the_eval_resize(train_crop_flag):
    """bilinear unless asked; --interpolation bicubic (timm's) in the training crop and the evaluation crop alike."""
    default, _, _ = _resolved(_data(24), train_crop=train_crop_flag)
    resolved, _, _ = _resolved(_data(24), train_crop=train_crop_flag, interpolation="bicubic")
    assert (train_crop(default, 24).interpolation, eval_crop(default, 24).interpolation) == ("bilinear",) * 2
    assert (train_crop(resolved, 24).interpolation, eval_crop(resolved, 24).interpolation) == ("bicubic",) * 2
    plain, _, _ = _resolved(_data(24), train_crop=train_crop_flag, interpolation="bicubic", crop_pct=None)
    assert type(eval_crop(plain, 24)).__name__ == "Resize" and eval_crop(plain, 24).interpolation == "bicubic"


def test_a_large_store_floors_the_crop_area_at_timms():
    resolved, _, line = _resolved(_data(80))
    assert resolved.data.crop_scale == 0.08 and "random-resized 0.08-1 + flip" in line


def test_photos_enlarged_to_the_training_size_are_flipped_whole_and_evaluated_whole():
    resolved, _, line = _resolved(_data(16, side=8))  # CIFAR-like: 8 px of detail stored at 16
    assert (resolved.data.train_crop, resolved.data.crop_pct, resolved.data.crop_scale) == ("flip", None, "auto")
    assert ("train crop: flip (8 px photos enlarged to 16 px: 0.50x the training size in detail: no more detail than "
            "the training size to crop); evaluation: the whole image (as trained)") in line
    assert train_crop(resolved, 16).scale == (1.0, 1.0) and eval_crop(resolved, 16) is None


def test_the_digits_sample_is_never_flipped():
    resolved, _, line = _resolved(_data(16, description=SAMPLE))
    assert resolved.data.train_crop == "none" and train_crop(resolved, 16) is None
    assert "train crop: none (the embedded digits sample: a mirrored digit is no digit)" in line


def test_given_values_are_kept_and_not_explained():
    resolved, _, line = _resolved(_data(24), train_crop="none", crop_pct=0.8)
    assert (resolved.data.train_crop, resolved.data.crop_pct) == ("none", 0.8)
    assert "chosen from the data" not in line
    resolved, _, line = _resolved(_data(24), train_crop="random-resized", crop_scale=0.3, crop_pct=None)
    assert (resolved.data.crop_scale, resolved.data.crop_pct) == (0.3, None) and "chosen from the data" not in line
    resolved, _, line = _resolved(_data(16, side=8), crop_scale=0.5)  # a scale asks for the crop it is read by
    assert resolved.data.train_crop == "random-resized" and "random-resized 0.5-1 + flip (" in line
    assert "--crop-scale 0.5 given" in line


def test_a_crop_scale_without_a_crop_that_reads_it_is_refused():
    with pytest.raises(ConfigError, match="--crop-scale 0.3 is read by --train-crop random-resized .or auto., not "
                                          "--train-crop flip"):
        TrainConfig().replace(train_crop="flip", crop_scale=0.3).check()
    with pytest.raises(ConfigError, match="--crop-pct 'wide': must be a number or auto"):
        TrainConfig().replace(crop_pct="wide").check()


@pytest.mark.parametrize("unlabelled, least", [(0, 1), (3, 0)])
def test_multi_label_runs_say_their_thresholds_and_least_classes_per_row(unlabelled, least):
    resolved, _, line = _resolved(_data(16, side=16, multi_label=True, unlabelled=unlabelled), task="multilabel")
    assert resolved.task.min_labels == least and resolved.task.threshold == "auto"
    assert ("thresholds: one per class, the F1-best on the validation split after training (0.5 while training)"
            in line)
    assert ("at least 1 class per row (every training image has one)" if least else
            "at least 0 class per row (3 training image(s) without a class)") in line
    given, _, line = _resolved(_data(16, side=16, multi_label=True), task="multilabel", threshold=0.4, min_labels=2)
    assert (given.task.threshold, given.task.min_labels) == (0.4, 2) and "thresholds:" not in line
