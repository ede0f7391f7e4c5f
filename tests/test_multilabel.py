"""Multi-label data end to end (issues 26, 49): multi-hot TFRecords, the job's train / predict / cv, its refusals, and
its decisions: per-class thresholds learnt on the validation split only, kept in ``thresholds.json``, used by
``predict``, replaced by ``--threshold``; ``--min-labels``.

The images say their own labels: class c's colour channel is bright where the image has class c,
dark where not. So a record read back can be checked against its own pixels, whatever order the
conversion wrote it in, and no expected figure is taken from the code under test.
"""
import csv
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import kaggle_utils.data as kd
from kaggle_utils import job, run
from kaggle_utils.config import TrainConfig
from kaggle_utils.data import convert
from kaggle_utils.data.tfrecords import scan_records
from kaggle_utils.run.folds import assign_folds, read_folds

from job_helpers import TEST_MODEL
from train_helpers import masked_rows

CLASSES = ["cloud", "haze", "road"]  # sorted: the class list csv_source makes of the names found
N, SIZE = 48, 16


def _image(present) -> np.ndarray:
    """Channel c bright for a class present, dark otherwise (JPEG keeps that far apart)."""
    return np.stack([np.full((SIZE, SIZE), 220 if c in present else 30, np.uint8) for c in range(3)], -1)


def _tags(path) -> dict[str, set[str]]:
    with open(path) as f:
        rows = list(csv.reader(f))
    return {r[0]: set(r[1].split()) for r in rows[1:]}


@pytest.fixture(scope="module")
def tagged(tmp_path_factory):
    """``labels.csv`` (image_name, tags: 1-3 space-separated classes), ``single.csv`` (one tag each), ``test/``."""
    root = tmp_path_factory.mktemp("tagged")
    rng = np.random.default_rng(0)
    (root / "images").mkdir()
    (root / "test").mkdir()
    multi, single = [], []
    for i in range(N):
        present = [c for c in range(3) if rng.random() < 0.45] or [i % 3]
        Image.fromarray(_image(present)).save(root / "images" / f"train_{i}.png")
        multi.append(f"train_{i},{' '.join(CLASSES[c] for c in present)}")
        single.append(f"train_{i},{CLASSES[present[0]]}")
    for i in range(6):
        Image.fromarray(_image([i % 3])).save(root / "test" / f"test_{i}.png")
    (root / "labels.csv").write_text("image_name,tags\n" + "\n".join(multi) + "\n")
    (root / "single.csv").write_text("image_name,tags\n" + "\n".join(single) + "\n")
    return root


def _source(tagged, name="labels.csv"):
    return kd.csv_source(tagged / name, tagged / "images", id_column="image_name", label_column="tags")


def _read(files, **kwargs):
    return masked_rows(kd.load_dataset(files, labeled=True, image_size=SIZE, batch_size=16, seed=0, **kwargs),
                       "image", "label")


# --------------------------------------------------------------------------- records


@pytest.fixture(scope="module")
def records(tagged, tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    return out, convert.convert_source(_source(tagged), out, image_size=SIZE, val_fraction=0.25, shards=2)


def test_multi_label_records_round_trip_each_with_its_own_labels(tagged, records):
    out, info = records
    assert info["multi_label"] is True and json.loads((out / "class_names.json").read_text())["multi_label"] is True
    assert info["class_names"] == CLASSES and info["counts"]["train"] + info["counts"]["val"] == N
    found = []
    for split in ("train", "val"):
        images, labels = _read(kd.list_tfrecords(out / split), multi_label_classes=3)
        assert labels.dtype == np.float32 and labels.shape == (info["counts"][split], 3)
        np.testing.assert_array_equal(labels, images.mean((1, 2)) > 128)  # every record carries its image's classes
        found += [" ".join(CLASSES[c] for c in np.flatnonzero(row)) for row in labels]
    assert sorted(found) == sorted(" ".join(sorted(t)) for t in _tags(tagged / "labels.csv").values())
    assert scan_records(kd.list_tfrecords(out / "train")).multi_label


def test_multi_label_records_read_as_the_wrong_kind_name_the_feature(records):
    files = kd.list_tfrecords(records[0] / "val")
    with pytest.raises(kd.DataError, match="missing feature 'class'"):
        _read(files)  # a single-label reader
    with pytest.raises(kd.DataError, match=r"feature 'labels' holds class 2, outside the 2 classes \[0, 2\)"):
        _read(files, multi_label_classes=2)


@pytest.mark.parametrize("augment, workers", [("randaugment", None), (lambda images: 255 - images, 0), ("imgaug", 1)],
                         ids=["tf-per-image", "numpy-in-thread", "imgaug-workers-decoding"])
def test_every_host_augmentation_route_carries_the_multi_hot_labels(records, augment, workers):
    files = kd.list_tfrecords(records[0] / "train")
    _, plain = _read(files, multi_label_classes=3)
    images, labels = _read(files, multi_label_classes=3, augment=augment, augment_workers=workers)
    np.testing.assert_array_equal(labels, plain)
    assert images.shape == (len(plain), SIZE, SIZE, 3)


def test_the_validation_split_keeps_each_class_share():
    rng = np.random.default_rng(1)
    labels = (rng.random((400, 6)) < rng.uniform(0.05, 0.5, 6)).astype(np.float32)
    train, val = convert.stratified_split(labels, 0.2, seed=0)
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(400))
    assert np.all(np.abs(labels[val].sum(0) - 0.2 * labels.sum(0)) <= 1), (labels[val].sum(0), labels.sum(0))


# --------------------------------------------------------------------------- folds


@pytest.mark.parametrize("seed", [0, 3])
def test_multi_label_folds_are_disjoint_cover_everything_and_keep_each_class_balanced(seed):
    rng = np.random.default_rng(seed)
    labels = (rng.random((503, 9)) < rng.uniform(0.03, 0.4, 9)).astype(np.float32)
    k = 5
    folds = assign_folds(labels, k, seed)
    assert folds.shape == (503,) and set(folds) == set(range(k))  # every example in exactly one fold

    def worst(assignment):
        per_fold = np.stack([labels[assignment == j].sum(0) for j in range(k)])
        return np.abs(per_fold - labels.sum(0) / k).max()

    assert worst(folds) <= 1 < worst(rng.integers(0, k, len(labels)))  # a random deal is several times worse
    assert np.abs(np.bincount(folds) - len(labels) / k).max() <= 0.05 * len(labels) / k
    assert np.array_equal(folds, assign_folds(labels, k, seed))
    assert not np.array_equal(folds, assign_folds(labels, k, seed + 1))


# --------------------------------------------------------------------------- the job: refusals


def _no_work(*args, **kwargs):
    raise AssertionError("the run started its work before refusing")


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_a_single_label_source_trained_multi_label_is_stored_as_one_tag_per_image(tagged, tmp_path):
    from kaggle_utils.run.data import converted_source

    config = TrainConfig().replace(source=str(tagged / "single.csv"), image_dir=str(tagged / "images"),
                                   id_column="image_name", label_column="tags", task="multilabel", image_size=SIZE)
    folder = converted_source(config, tmp_path)
    want = _tags(tagged / "single.csv")
    index = scan_records(kd.list_tfrecords(folder / "train") + kd.list_tfrecords(folder / "val"))
    assert index.multi_label and sorted(index.ids) == sorted(want)
    assert all([CLASSES[c] for c in labels] == list(want[i]) for i, labels in zip(index.ids, index.label_sets))


@pytest.mark.parametrize("data, task, words", [
    ("single", "multilabel", "--task multilabel needs multi-label records, but --data-dir {} holds one class per "
                             "image: use --task softmax (or focal), or give the images as --source"),
    ("labels.csv", "softmax", "--source {} is multi-label (several classes per image), which --task softmax cannot "
                              "train: use --task multilabel"),
    ("labels.csv", "focal", "which --task focal cannot train: use --task multilabel"),
    ("records", "softmax", "--data-dir {} is multi-label (several classes per image), which --task softmax"),
])
def test_a_task_that_does_not_fit_the_labels_is_refused_leaving_out_untouched(tagged, records, tmp_path, capsys,
                                                                              monkeypatch, data, task, words):
    from kaggle_utils.run import trainer

    monkeypatch.setattr(trainer, "build_training", _no_work)
    if data == "single":  # single-label records: read as they are, not as a --source
        where = str(tmp_path / "single")
        convert.convert_source(_source(tagged, "single.csv"), where, image_size=SIZE, val_fraction=0.25, shards=1)
    else:
        where = str(records[0].resolve()) if data == "records" else str(tagged / data)
    given = (["--data-dir", where] if data in ("records", "single") else
             ["--source", where, "--image-dir", str(tagged / "images")])
    argv = ["train", *given, "--label-column", "tags", "--id-column", "image_name", "--image-size", str(SIZE),
            "--task", task, "--model", TEST_MODEL]
    with pytest.raises(SystemExit) as exit_info:  # no folder yet: none is made
        job.main([*argv, "--out", str(tmp_path / "new")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and words.format(where) in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "new").exists()

    previous = tmp_path / "previous"  # a finished run's folder: not a byte or a time changes, --overwrite or not
    for name, text in (("config.json", "{}"), ("submission.csv", "id,label\n"), ("data/class_names.json", "{}")):
        (previous / name).parent.mkdir(parents=True, exist_ok=True)
        (previous / name).write_text(text)
    before = _snapshot(previous)
    with pytest.raises(SystemExit):
        job.main([*argv, "--out", str(previous), "--overwrite"])
    assert words.format(where) in capsys.readouterr().err
    assert _snapshot(previous) == before and sorted(p.name for p in previous.iterdir()) == sorted(
        ["config.json", "submission.csv", "data"])


# --------------------------------------------------------------------------- the job: train, predict, cv

THRESHOLD = 0.45
TRAIN_FLAGS = ["--image-dir", None, "--id-column", "image_name", "--label-column", "tags", "--task", "multilabel",
               "--model", TEST_MODEL, "--image-size", str(SIZE), "--batch-size", "16", "--steps", "4", "--eval-every",
               "2", "--no-progress"]


def _flags(tagged):
    return [str(tagged / "images") if f is None else f for f in TRAIN_FLAGS]


def _check_submission(folder: Path, probabilities: str, test_ids, thresholds=THRESHOLD, least: int = 1):
    """submission.csv: the CSV's columns, a row per test image, the classes whose probability exceeds their
    threshold, or, where fewer than ``least`` do, the ``least`` most probable."""
    with open(folder / "submission.csv") as f:
        rows = list(csv.reader(f))
    with open(folder / probabilities) as f:
        probs = list(csv.reader(f))
    assert rows[0] == ["image_name", "tags"] and probs[0] == ["image_name", *CLASSES]
    assert sorted(r[0] for r in rows[1:]) == sorted(test_ids) and [r[0] for r in rows] == [r[0] for r in probs]
    limits = np.broadcast_to(thresholds, (len(CLASSES),))
    for row, p in zip(rows[1:], probs[1:]):
        values = np.array([float(v) for v in p[1:]])
        passing = [name for name, v, t in zip(CLASSES, values, limits) if v > t]
        top = [CLASSES[c] for c in sorted(np.argsort(-values, kind="stable")[:least])]
        assert row[1].split() == (passing if len(passing) >= least else top), (row, p, limits)
        assert len(row[1].split()) >= least
    return rows


def _kept_thresholds(folder: Path) -> np.ndarray:
    kept = json.loads((folder / "thresholds.json").read_text())["thresholds"]
    assert list(kept) == CLASSES
    return np.array(list(kept.values()))


@pytest.fixture(scope="module")
def trained(tagged, tmp_path_factory):
    """The job's defaults (thresholds learnt, at least one class per row), every call of the threshold search kept."""
    from kaggle_utils.run import thresholds

    out = tmp_path_factory.mktemp("job") / "run"
    argv = ["train", "--source", str(tagged / "labels.csv"), "--test-source", str(tagged / "test"), *_flags(tagged),
            "--mixup-alpha", "0.4", "--cutmix-alpha", "0.4"]
    learn, calls = thresholds.learn_thresholds, []

    def recorded(probs, labels):
        calls.append((np.array(probs), np.array(labels), learn(probs, labels)))
        return calls[-1][2]

    thresholds.learn_thresholds = recorded
    try:
        assert job.main([*argv, "--out", str(out)]) == 0
    finally:
        thresholds.learn_thresholds = learn
    return out, calls


@pytest.mark.slow  # the trained fixture trains test_efficientnet (tests/tiers.py)
def test_the_job_trains_a_multi_label_csv_and_submits_the_classes_above_their_thresholds(tagged, trained):
    out, _ = trained
    rows = _check_submission(out, "probabilities.csv", [p.stem for p in (tagged / "test").iterdir()],
                             _kept_thresholds(out))
    assert len(rows) == 7
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["monitor"] == "val_f1"
    assert {"val_f1", "val_micro_f1", "val_samples_f1", "val_acc"} <= set(metrics["best"])
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["task"] == {**config["task"], "task": "multilabel", "threshold": "auto", "min_labels": 1}
    assert config["model"]["num_classes"] == 3 and config["data"]["class_names"] == CLASSES
    with open(out / "per_class.csv") as f:
        per_class = list(csv.DictReader(f))
    assert [r["name"] for r in per_class] == CLASSES and "most_confused_with" not in per_class[0]
    val = json.loads((out / "val_counts.json").read_text())
    assert [int(r["support"]) for r in per_class] == [t + n for t, n in zip(val["tp"], val["fn"])]
    assert (out / "history.csv").is_file() and (out / "curves.png").is_file()


@pytest.mark.slow  # the trained fixture trains test_efficientnet (tests/tiers.py)
def test_the_thresholds_are_learnt_on_the_validation_split_only(trained):
    out, calls = trained
    assert len(calls) == 1  # once, after training: never on the test split
    probs, labels, chosen = calls[0]
    val = kd.scan_labels(kd.list_tfrecords(out / "data" / "val"), image_size=SIZE, multi_label_classes=3)
    assert probs.shape == val.shape and np.array_equal(labels, val)  # the validation split's rows, in order
    assert np.array_equal(_kept_thresholds(out), chosen)
    kept = json.loads((out / "thresholds.json").read_text())
    assert kept["learnt_on"] == "the validation split, best checkpoint" and kept["min_labels"] == 1


@pytest.mark.slow  # the trained fixture trains test_efficientnet (tests/tiers.py)
def test_predict_on_a_multi_label_run_uses_its_thresholds_and_threshold_replaces_them(tagged, trained, tmp_path):
    out, _ = trained
    test_ids = [p.stem for p in (tagged / "test").iterdir()]
    assert job.main(["predict", "--checkpoint", str(out), "--test-source", str(tagged / "test"),
                     "--out", str(tmp_path / "own")]) == 0
    _check_submission(tmp_path / "own", "probabilities.csv", test_ids, _kept_thresholds(out))
    assert (tmp_path / "own" / "submission.csv").read_text() == (out / "submission.csv").read_text()

    assert job.main(["predict", "--checkpoint", str(out), "--test-source", str(tagged / "test"), "--threshold",
                     str(THRESHOLD), "--out", str(tmp_path / "given")]) == 0
    _check_submission(tmp_path / "given", "probabilities.csv", test_ids, THRESHOLD)
    assert job.main(["predict", "--checkpoint", str(out), "--test-source", str(tagged / "test"), "--threshold",
                     "0.999", "--min-labels", "0", "--out", str(tmp_path / "empty")]) == 0
    rows = _check_submission(tmp_path / "empty", "probabilities.csv", test_ids, 0.999, least=0)
    assert any(not r[1] for r in rows[1:])  # empty rows, as asked


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_cv_on_a_multi_label_csv_writes_oof_and_multilabel_scores(tagged, tmp_path):
    out = tmp_path / "cv"
    config = TrainConfig().replace(source=str(tagged / "labels.csv"), image_dir=str(tagged / "images"),
                                   test_source=str(tagged / "test"), id_column="image_name", label_column="tags",
                                   task="multilabel", threshold=THRESHOLD, model=TEST_MODEL, image_size=SIZE,
                                   batch_size=16, steps=2, eval_every=2)
    result = run.cross_validate(config, out, folds=2, progress=False)
    with open(out / "oof.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["id", "label", "fold", "0", "1", "2"] and len(rows) == N + 1
    folds = {r[0]: int(r[2]) for r in rows[1:]}
    assert read_folds(out) == (folds, None)  # every record once, in the fold folds.csv gives it
    labels = np.array([[name in r[1].split() for name in CLASSES] for r in rows[1:]])
    assert sorted(r[1] for r in rows[1:]) == sorted(" ".join(sorted(t)) for t in _tags(tagged / "labels.csv").values())
    in_fold = np.array([int(r[2]) for r in rows[1:]])
    assert np.all(np.abs(labels[in_fold == 0].sum(0) - labels.sum(0) / 2) <= 1)  # each class split evenly

    predicted = np.array([[float(v) for v in r[3:]] for r in rows[1:]]) > THRESHOLD
    tp, fp, fn = (labels & predicted).sum(0), (~labels & predicted).sum(0), (labels & ~predicted).sum(0)
    present = 2 * tp + fp + fn > 0
    scores = json.loads((out / "cv.json").read_text())
    assert scores == result.scores
    assert scores["oof"]["acc"] == pytest.approx(np.mean(np.all(labels == predicted, 1)))  # exact match
    assert scores["oof"]["f1"] == pytest.approx(np.mean((2 * tp / (2 * tp + fp + fn))[present]))
    assert scores["oof"]["micro_f1"] == pytest.approx(2 * tp.sum() / (2 * tp + fp + fn).sum())
    assert set(scores["fold_mean_std"]) == {"loss", "acc", "f1", "micro_f1", "samples_f1"}  # the task's metrics
    _check_submission(out, "test_probabilities.csv", [p.stem for p in (tagged / "test").iterdir()])
    assert json.loads((out / "thresholds.json").read_text())["learnt_on"] == f"given: --threshold {THRESHOLD}"


def test_an_ensemble_of_multi_label_and_single_label_runs_is_refused():
    from kaggle_utils.config import ConfigError
    from kaggle_utils.run.predict import Member, _check_same_classes

    def member(name, task):
        config = TrainConfig().replace(task=task, num_classes=3, class_names=tuple(CLASSES))
        return Member(Path(name), None, None, config, 0.5)

    _check_same_classes(member("a", "multilabel"), member("b", "multilabel"))
    with pytest.raises(ConfigError, match="--checkpoint a and b disagree .one is multi-label"):
        _check_same_classes(member("a", "multilabel"), member("b", "softmax"))
