"""Cross-validation (issue 24): folds, record selection by (file, index), ``cross_validate`` and the ``cv`` job.

One 2-fold CV on the 16 px digits sample is shared by the module; its files are checked against
figures recomputed here from the fold folders and the sample, not taken from the code under test.
"""
import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from kaggle_utils import job, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.run.folds import assign_folds, read_folds

from job_helpers import TEST_MODEL

K = 2


def tiny_config(sample, **changes):
    return TrainConfig().replace(**{"data_dir": sample.root, "model": TEST_MODEL, "batch_size": 64, "steps": 4,
                                    "eval_every": 2, **changes})


def read_csv(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


# --------------------------------------------------------------------------- folds


@pytest.mark.parametrize("seed", [0, 3])
def test_stratified_folds_are_disjoint_cover_everything_and_keep_each_class_balanced(seed):
    labels = np.random.default_rng(seed).integers(0, 7, size=503)
    k = 5
    folds = assign_folds(labels, k, seed)
    assert folds.shape == labels.shape and set(folds) == set(range(k))  # every example in exactly one fold
    for label in np.unique(labels):
        counts = np.bincount(folds[labels == label], minlength=k)
        ideal = (labels == label).sum() / k
        assert np.all(np.abs(counts - ideal) <= 1), (label, counts)
    assert np.ptp(np.bincount(folds, minlength=k)) <= 1
    assert np.array_equal(folds, assign_folds(labels, k, seed))  # seeded
    assert not np.array_equal(folds, assign_folds(labels, k, seed + 1))


def test_group_folds_never_split_a_group():
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 40, size=400)
    folds = assign_folds(rng.integers(0, 3, 400), 4, 0, groups=groups)
    for g in np.unique(groups):
        assert len(set(folds[groups == g])) == 1
    assert set(folds) == set(range(4)) and np.ptp(np.bincount(folds)) < np.bincount(groups).max() + 1


def test_too_few_examples_or_folds_are_refused():
    with pytest.raises(ConfigError, match="--folds 1"):
        assign_folds([0, 1, 0], 1, 0)
    with pytest.raises(ConfigError, match="only 2 labelled"):
        assign_folds([0, 1], 3, 0)


# --------------------------------------------------------------------------- the data layer: select records


def test_load_dataset_reads_only_the_selected_records_and_counts_them(sample):
    from kaggle_utils.data import list_tfrecords, load_dataset
    from kaggle_utils.data.tfrecords import scan_records

    files = list_tfrecords(Path(sample.root) / "val")
    index = scan_records(files)
    chosen = np.arange(len(index)) % 3 == 0
    select = index.pairs(np.flatnonzero(chosen))
    dataset = load_dataset(files, labeled=True, image_size=16, batch_size=32, select=select, with_records=True)
    assert dataset.num_examples == chosen.sum()
    records, labels = [], []
    for batch in dataset:
        records += [r.decode() for r in batch["record"][batch["mask"]]]
        labels += list(batch["label"][batch["mask"]])
    assert records == [f"{f}#{i}" for f, i in select]  # in file order, each once
    assert labels == list(index.labels[chosen])
    with pytest.raises(ValueError, match="not among the files"):
        load_dataset(files, labeled=True, image_size=16, batch_size=32, select=[("elsewhere.tfrec", 0)])


# --------------------------------------------------------------------------- one CV on the sample


class StopAtSecondFold:
    """Kills the job at the start of the second fold's run: after fold 0 finished, before fold 1 saved anything."""

    def __init__(self):
        self.starts = 0

    def on_run_start(self, state, history):
        self.starts += 1
        if self.starts == 2:
            raise KeyboardInterrupt("killed between folds")


@pytest.fixture(scope="module")
def cv(sample, tmp_path_factory):
    """A 2-fold CV killed between its folds and resumed, and the same CV run straight through."""
    tmp = tmp_path_factory.mktemp("cv")
    config = tiny_config(sample)
    with pytest.raises(KeyboardInterrupt):
        run.cross_validate(config, tmp / "resumed", folds=K, progress=False, hooks=[StopAtSecondFold()])
    assert (tmp / "resumed" / "fold0" / "oof.csv").is_file() and not (tmp / "resumed" / "oof.csv").exists()
    resumed = run.cross_validate(config, tmp / "resumed", folds=K, progress=False, resume=True)
    straight = run.cross_validate(config, tmp / "straight", folds=K, progress=False)
    return tmp, resumed, straight


def pool_labels(sample):
    """{name: label} of every train + val record, read here (names as the CV names records without ids)."""
    from kaggle_utils.data import list_tfrecords
    from kaggle_utils.data.tfrecords import scan_records

    names = {}
    for split in ("train", "val"):
        index = scan_records(list_tfrecords(Path(sample.root) / split))
        for f, i, label in zip(index.files, index.indices, index.labels):
            names[f"{split}/{f.rsplit('/', 1)[-1]}#{i}"] = int(label)
    return names


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_oof_holds_every_record_once_predicted_by_the_fold_that_did_not_train_on_it(cv, sample):
    tmp, _, straight = cv
    out = straight.out
    header, rows = read_csv(out / "oof.csv")
    assert header[:3] == ["id", "label", "fold"] and len(header) == 3 + 10
    labels = pool_labels(sample)
    assert sorted(r[0] for r in rows) == sorted(labels)  # every train + val record exactly once
    assert all(int(r[1]) == labels[r[0]] for r in rows)
    assert read_folds(out) == ({r[0]: int(r[2]) for r in rows}, None)
    for k in range(K):  # fold k's run validated on exactly its fold and trained on the rest
        config = json.loads((out / f"fold{k}" / "config.json").read_text())
        assert config["config"]["model"]["name"] == TEST_MODEL
        held_out = [r for r in rows if int(r[2]) == k]
        _, fold_rows = read_csv(out / f"fold{k}" / "oof.csv")
        assert sorted(map(tuple, fold_rows)) == sorted(map(tuple, held_out))
        best = json.loads((out / f"fold{k}" / "metrics.json").read_text())["best"]
        assert abs(best["val_acc"] - np.mean([np.argmax(list(map(float, r[3:]))) == int(r[1])
                                                   for r in held_out])) < 1e-6
    probs = np.array([[float(v) for v in r[3:]] for r in rows])
    assert np.allclose(np.load(out / "oof.npy"), probs) and np.allclose(probs.sum(1), 1, atol=1e-4)
    per_fold = np.bincount([int(r[2]) for r in rows])
    assert np.ptp(per_fold) <= 1
    for label in range(10):  # each class split evenly over the folds
        counts = np.bincount([int(r[2]) for r in rows if int(r[1]) == label], minlength=K)
        assert np.all(np.abs(counts - counts.sum() / K) <= 1), (label, counts)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_cv_json_matches_scores_recomputed_from_oof_csv(cv):
    out = cv[2].out
    _, rows = read_csv(out / "oof.csv")
    labels = np.array([int(r[1]) for r in rows])
    folds = np.array([int(r[2]) for r in rows])
    probs = np.array([[float(v) for v in r[3:]] for r in rows])
    preds = probs.argmax(1)

    def macro_f1(y, p):
        f1 = [2 * ((y == c) & (p == c)).sum() / ((y == c).sum() + (p == c).sum())
              for c in np.union1d(y, p)]
        return float(np.mean(f1))

    scores = json.loads((out / "cv.json").read_text())
    assert scores == cv[2].scores
    assert scores["oof"]["acc"] == pytest.approx(np.mean(labels == preds))  # the task's metrics, by its names
    assert scores["oof"]["f1"] == pytest.approx(macro_f1(labels, preds))
    assert scores["oof"]["loss"] == pytest.approx(-np.mean(np.log(probs[np.arange(len(labels)), labels])), rel=1e-4)
    fold_acc = [np.mean(labels[folds == k] == preds[folds == k]) for k in range(K)]
    assert [f["acc"] for f in scores["folds"]] == pytest.approx(fold_acc)
    assert scores["fold_mean_std"]["acc"]["mean"] == pytest.approx(np.mean(fold_acc))
    assert scores["fold_mean_std"]["acc"]["std"] == pytest.approx(np.std(fold_acc, ddof=1))
    for k in range(K):
        metrics = json.loads((out / f"fold{k}" / "metrics.json").read_text())
        assert scores["folds"][k]["best"] == metrics["best"]


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_submission_is_the_mean_of_the_fold_models_test_probabilities(cv, sample):
    out = cv[2].out
    header, rows = read_csv(out / "test_probabilities.csv")
    mean = np.array([[float(v) for v in r[1:]] for r in rows])
    folds = []
    for k in range(K):  # each fold's own run predicted the test split with its best checkpoint
        fold_header, fold_rows = read_csv(out / f"fold{k}" / "probabilities.csv")
        assert fold_header == header and [r[0] for r in fold_rows] == [r[0] for r in rows]
        folds.append(np.array([[float(v) for v in r[1:]] for r in fold_rows]))
    assert np.allclose(mean, np.mean(folds, 0), atol=1e-6)
    _, submission = read_csv(out / "submission.csv")
    assert [r[0] for r in submission] == [r[0] for r in rows]
    assert [int(r[1]) for r in submission] == list(mean.argmax(1))
    assert sorted(r[0] for r in rows) == sorted(sample.test_labels)


def without_timing(scores):
    """cv.json's figures less the speed ones (img/s, seconds): all a resumed run may differ in."""
    folds = [{**f, "best": {k: v for k, v in f["best"].items() if k not in ("img_per_s", "seconds")}}
             for f in scores["folds"]]
    return {**scores, "folds": folds}


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_cv_killed_between_folds_and_resumed_equals_one_run_straight_through(cv):
    tmp, resumed, straight = cv
    assert sorted(resumed.trained) == [1]  # fold 0 was finished before the kill: skipped
    for name in ("folds.csv", "oof.csv"):
        assert (resumed.out / name).read_text() == (straight.out / name).read_text()
    assert without_timing(resumed.scores) == without_timing(straight.scores)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_changed_fold_assignment_is_refused_naming_what_differs(cv, sample):
    out = cv[2].out
    before = (out / "folds.csv").read_text()
    with pytest.raises(ConfigError, match=r"folds\.csv.*--seed 5.*in another fold"):
        run.cross_validate(tiny_config(sample, seed=5), out, folds=K, resume=True, progress=False)
    with pytest.raises(ConfigError, match=r"2 folds then, 3 now"):
        run.cross_validate(tiny_config(sample), out, folds=3, resume=True, progress=False)
    assert (out / "folds.csv").read_text() == before


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_finished_folds_are_skipped_by_resume(cv, sample, capsys):
    out = cv[2].out
    result = run.cross_validate(tiny_config(sample), out, folds=K, resume=True, progress=False)
    assert result.trained == {} and without_timing(result.scores) == without_timing(cv[2].scores)
    assert "fold 0: finished earlier" in capsys.readouterr().out


# --------------------------------------------------------------------------- the job


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_cv_job_with_only_folds_trains_those_and_waits_for_the_rest(cv, sample, tmp_path, capsys):
    out = tmp_path / "cv"
    shutil.copytree(cv[2].out, out)  # the module's CV with fold 0 never trained
    for name in ("fold0", "oof.csv", "oof.npy", "cv.json", "submission.csv", "test_probabilities.csv"):
        shutil.rmtree(out / name) if (out / name).is_dir() else (out / name).unlink()
    base = ["cv", "--data-dir", str(sample.root), "--model", TEST_MODEL, "--batch-size", "64", "--steps", "4",
            "--eval-every", "2", "--folds", "2", "--out", str(out), "--no-progress", "--resume"]
    assert job.main(base + ["--only-folds", "1"]) == 0
    said = capsys.readouterr().out
    assert "fold 1: finished earlier" in said and "fold(s) 0 not finished" in said
    assert not (out / "fold0").exists() and not (out / "cv.json").exists()
    assert job.main(base) == 0
    said = capsys.readouterr().out
    assert "out-of-fold: acc " in said and str(out / "submission.csv") in said
    assert (out / "oof.csv").read_text() == (cv[2].out / "oof.csv").read_text()


def test_cv_job_refuses_bad_fold_flags_in_one_line(sample, tmp_path, capsys):
    base = ["cv", "--data-dir", str(sample.root), "--model", TEST_MODEL, "--out", str(tmp_path)]
    for extra, words in ((["--folds", "1"], "--folds 1"), (["--folds", "2", "--only-folds", "2"], "fold 2 is not"),
                         (["--folds", "2", "--fold-group", "patient"], "--fold-group patient"),
                         (["--folds", "2", "--lr", "auto", "--lr-find-steps", "3"], "--lr-find-steps 3"),
                         # needs the data's image size (16): refused after the pool is read, before folds.csv
                         (["--folds", "2", "--epochs", "2", "--progressive-stages", "2", "--progressive-min-size",
                           "64"], "--progressive-min-size 64")):
        with pytest.raises(SystemExit) as exit_info:
            job.main(base + extra)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_source_is_converted_once_into_out_data_and_the_folds_read_it(tmp_path):
    from test_job_data import _digit_images, _save_png

    for digit, i, image in _digit_images(14):
        _save_png(tmp_path / "folders" / str(digit) / f"{digit}_{i}.png", image)
    out = tmp_path / "cv"
    config = TrainConfig().replace(source=str(tmp_path / "folders"), image_size=16, model=TEST_MODEL, batch_size=64,
                                   steps=2, eval_every=2)
    result = run.cross_validate(config, out, folds=2, only_folds=[1], progress=False)
    assert result.remaining == (0,) and result.scores is None and sorted(result.trained) == [1]
    fold_config = json.loads((out / "fold1" / "config.json").read_text())["config"]["data"]
    assert fold_config["source"] is None and fold_config["data_dir"] == str((out / "data").resolve())
    assert not (out / "fold1" / "data").exists()  # one conversion for every fold
    folds, _ = read_folds(out)
    # every image, train and val records, named by its id in the source (its path in the class folders)
    assert sorted(folds) == sorted(f"{digit}/{digit}_{i}" for digit, i, _ in _digit_images(14))
    _, rows = read_csv(out / "fold1" / "oof.csv")
    assert sorted(r[0] for r in rows) == sorted(i for i, k in folds.items() if k == 1)
    with pytest.raises(ConfigError, match="already holds a CV.*--resume"):
        run.cross_validate(config, out, folds=2, progress=False)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_overwrite_makes_every_fold_unfinished_again(cv, sample, tmp_path):
    out = tmp_path / "cv"
    shutil.copytree(cv[2].out, out)
    result = run.cross_validate(tiny_config(sample), out, folds=K, only_folds=[0], overwrite=True, progress=False)
    assert sorted(result.trained) == [0] and result.remaining == (1,) and result.scores is None
    assert (out / "fold0" / "oof.csv").is_file() and not (out / "fold1" / "oof.csv").exists()
    assert not any((out / name).exists() for name in ("oof.csv", "oof.npy", "cv.json", "submission.csv"))
    assert (out / "folds.csv").read_text() == (cv[2].out / "folds.csv").read_text()
