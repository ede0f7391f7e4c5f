"""Group-aware folds (``cv --fold-group COLUMN [--fold-group-file CSV]``) and a CV on a tfds source (issue 24).

The groups and labels are written here into CSVs; ``folds.csv`` is checked against them, read
back here. Most CVs here make their folds without training (``only_folds=[]``); one, on a tiny
tfds dataset built offline, trains its two folds through to the out-of-fold file and submission.
"""
import csv

import numpy as np
import pytest

from kaggle_utils import job, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.run.folds import assign_folds, read_folds

from job_helpers import TEST_MODEL
from test_job_data import _digit_images, _save_png


def read_csv(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


def imbalance(labels, folds, k):
    """Mean over classes of the largest distance of a fold's count from the class's even share, as a fraction."""
    return np.mean([np.abs(np.bincount(folds[labels == c], minlength=k) - (labels == c).sum() / k).max()
                    / (labels == c).sum() for c in np.unique(labels)])


def assert_groups_whole(groups, folds, k):
    for group in np.unique(groups):
        assert len(set(folds[groups == group])) == 1, group
    assert set(folds) == set(range(k))


# --------------------------------------------------------------------------- the assignment


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_group_folds_keep_groups_whole_and_balance_labels_as_well_as_sklearns_stratified_group_kfold(seed):
    from sklearn.model_selection import StratifiedGroupKFold

    rng = np.random.default_rng(seed)
    k, groups = 5, rng.integers(0, 250, size=2000)
    own = rng.integers(0, 6, size=250)  # a group's usual class (a patient's diagnosis), not always its images'
    labels = np.where(rng.random(2000) < 0.7, own[groups], rng.integers(0, 6, size=2000))
    folds = assign_folds(labels, k, seed, groups=groups)
    assert folds.shape == labels.shape
    assert_groups_whole(groups, folds, k)
    reference = np.zeros_like(folds)
    splits = StratifiedGroupKFold(k, shuffle=True, random_state=seed).split(labels, labels, groups)
    for fold, (_, held_out) in enumerate(splits):
        reference[held_out] = fold
    assert imbalance(labels, folds, k) <= 1.25 * imbalance(labels, reference, k)
    anyhow = rng.integers(0, k, size=250)[groups]  # whole groups dealt at random: what balancing must beat
    assert imbalance(labels, folds, k) < imbalance(labels, anyhow, k) / 2
    assert np.array_equal(folds, assign_folds(labels, k, seed, groups=groups))  # seeded
    assert not np.array_equal(folds, assign_folds(labels, k, seed + 1, groups=groups))


def test_groups_of_one_class_spread_each_class_within_its_largest_group():
    rng = np.random.default_rng(7)
    sizes, classes = rng.integers(1, 6, size=90), rng.integers(0, 6, size=90)
    groups = np.repeat(np.arange(90), sizes)
    labels, k = classes[groups], 4
    folds = assign_folds(labels, k, 7, groups=groups)
    assert_groups_whole(groups, folds, k)
    for c in range(6):
        counts = np.bincount(folds[labels == c], minlength=k)
        assert np.all(np.abs(counts - counts.sum() / k) <= sizes[classes == c].max()), (c, counts)


def test_multi_label_groups_stay_whole_and_spread_each_class_better_than_dealing_groups_at_random():
    rng = np.random.default_rng(3)
    k, groups = 4, rng.integers(0, 120, size=800)
    labels = (rng.random((800, 5)) < [0.5, 0.3, 0.2, 0.1, 0.05]).astype(np.float32)
    labels[labels.sum(1) == 0, 0] = 1.0  # every example has a class
    folds = assign_folds(labels, k, 3, groups=groups)
    assert_groups_whole(groups, folds, k)

    def spread(assignment):  # per class, the std over folds of its share, averaged
        counts = np.stack([labels[assignment == f].sum(0) for f in range(k)])
        return float((counts / labels.sum(0)).std(0).mean())

    anyhow = rng.integers(0, k, size=120)[groups]
    assert spread(folds) < spread(anyhow) / 2


def test_fewer_groups_than_folds_are_refused():
    with pytest.raises(ConfigError, match="only 2 groups"):
        assign_folds([0, 1, 0, 1], 3, 0, groups=["a", "a", "b", "b"])


# --------------------------------------------------------------------------- a CSV source and its records


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """80 digit images with a CSV of id, label, patient and site (4 sites)."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    rows = []
    for digit, i, image in _digit_images(8):
        _save_png(root / "images" / f"img{digit}_{i}.png", image)
        rows.append([f"img{digit}_{i}", f"d{digit}"])
    patient = rng.permutation(np.arange(len(rows)) // 3)  # 26 patients of 3 images and one of 2, classes mixed
    table = [[*row, f"p{patient[r]}", f"s{r % 4}"] for r, row in enumerate(rows)]
    csv_path = write_csv(root / "train.csv", ["id", "label", "patient", "site"], table)
    return root, csv_path, {row[0]: row for row in table}


def csv_config(photos, **changes):
    root, csv_path, _ = photos
    return TrainConfig().replace(**{"source": str(csv_path), "image_dir": str(root / "images"), "image_size": 16,
                                    "model": TEST_MODEL, "batch_size": 64, "steps": 2, "eval_every": 2,
                                    "val_fraction": 0.25, **changes})


def test_a_csv_source_keeps_each_patient_in_one_fold_and_folds_csv_records_the_patient(photos, tmp_path):
    _, csv_path, table = photos
    out = tmp_path / "cv"
    result = run.cross_validate(csv_config(photos), out, folds=3, only_folds=[], fold_group="patient",
                                progress=False)
    assert result.remaining == (0, 1, 2) and result.trained == {}
    header, rows = read_csv(out / "folds.csv")
    assert header == ["id", "fold", "patient"]
    assert sorted(r[0] for r in rows) == sorted(table)  # named by the CSV's ids, every image once
    assert all(r[2] == table[r[0]][2] for r in rows)
    assert_groups_whole(np.array([r[2] for r in rows]), np.array([int(r[1]) for r in rows]), 3)
    assert read_folds(out)[1] == ("patient", {r[0]: table[r[0]][2] for r in rows})

    before = (out / "folds.csv").read_text()
    for changes, words in (({"fold_group": "site"}, "grouped by patient then, by site now"),
                           ({}, "grouped by patient then, without --fold-group now")):
        with pytest.raises(ConfigError, match=words):
            run.cross_validate(csv_config(photos), out, folds=3, only_folds=[], resume=True, progress=False,
                               **changes)
    moved = next(iter(table))
    edited = [[i, "p_elsewhere" if i == moved else row[2]] for i, row in table.items()]
    with pytest.raises(ConfigError, match=rf"1 id\(s\) in another patient group, e.g. {moved}: "):
        run.cross_validate(csv_config(photos), out, folds=3, only_folds=[], resume=True, progress=False,
                           fold_group="patient", fold_group_file=write_csv(tmp_path / "g.csv", ["id", "patient"],
                                                                           edited))
    assert (out / "folds.csv").read_text() == before
    again = run.cross_validate(csv_config(photos), out, folds=3, only_folds=[], resume=True, progress=False,
                               fold_group="patient")  # the same grouping goes on
    assert again.remaining == (0, 1, 2) and (out / "folds.csv").read_text() == before


def test_a_csv_source_with_a_group_file_lacking_images_is_refused_before_converting(photos, tmp_path):
    _, _, table = photos
    partial = write_csv(tmp_path / "groups.csv", ["id", "patient"], [[i, row[2]] for i, row in table.items()][:-2])
    with pytest.raises(ConfigError, match=rf"--fold-group patient: 2 of the 80 images of --source .* have no row in "
                                          rf"{partial} \(matched by its 'id' column\), e\.g\. "):
        run.cross_validate(csv_config(photos), tmp_path / "cv", folds=3, fold_group="patient",
                           fold_group_file=partial, progress=False)
    assert not (tmp_path / "cv").exists()


@pytest.fixture(scope="module")
def records(photos, tmp_path_factory):
    """The CSV source converted to a records folder (``--data-dir``): its records carry the CSV's ids."""
    from kaggle_utils.data import csv_source
    from kaggle_utils.data.convert import convert_source

    root, csv_path, _ = photos
    folder = tmp_path_factory.mktemp("records")
    convert_source(csv_source(str(csv_path), str(root / "images"), id_column="id", label_column="label"), folder,
                   image_size=16, val_fraction=0.25, shards=2)
    return folder


def test_records_take_their_groups_from_a_group_file_by_id(photos, records, tmp_path):
    _, _, table = photos
    groups = write_csv(tmp_path / "groups.csv", ["patient", "id"], [[row[2], i] for i, row in table.items()])
    config = TrainConfig().replace(data_dir=str(records), model=TEST_MODEL)
    run.cross_validate(config, tmp_path / "cv", folds=4, only_folds=[], fold_group="patient", fold_group_file=groups,
                       progress=False)
    header, rows = read_csv(tmp_path / "cv" / "folds.csv")
    assert header == ["id", "fold", "patient"] and sorted(r[0] for r in rows) == sorted(table)
    assert all(r[2] == table[r[0]][2] for r in rows)
    assert_groups_whole(np.array([r[2] for r in rows]), np.array([int(r[1]) for r in rows]), 4)


def test_groups_that_cannot_be_found_are_refused_in_one_line_before_anything_is_written(photos, records, sample,
                                                                                         tmp_path, capsys):
    _, _, table = photos
    pairs = [[i, row[2]] for i, row in table.items()]
    files = {"partial": write_csv(tmp_path / "partial.csv", ["id", "patient"], pairs[3:]),
             "no_column": write_csv(tmp_path / "no_column.csv", ["id", "site"], pairs),
             "empty": write_csv(tmp_path / "empty.csv", ["id", "patient"], [*pairs[:5], [pairs[5][0], ""]]),
             "conflict": write_csv(tmp_path / "conflict.csv", ["id", "patient"], [*pairs, [pairs[0][0], "p_other"]])}
    out = tmp_path / "cv"
    base = ["cv", "--model", TEST_MODEL, "--folds", "2", "--out", str(out)]
    data = ["--data-dir", str(records)]
    cases = [
        (data + ["--fold-group", "patient"], f"--data-dir {records} has no columns to read groups from; give "
                                             "--fold-group-file CSV"),
        (data + ["--fold-group", "patient", "--fold-group-file", str(tmp_path / "nowhere.csv")],
         f"{tmp_path / 'nowhere.csv'} does not exist"),
        (data + ["--fold-group", "patient", "--fold-group-file", str(files["no_column"])],
         f"{files['no_column']} has no column 'patient' (columns: id, site)"),
        (data + ["--fold-group", "patient", "--fold-group-file", str(files["partial"])],
         f"3 of the 80 records of {records} have no row in {files['partial']} (matched by its 'id' column), e.g. "
         f"'{pairs[0][0]}'"),
        (data + ["--fold-group", "patient", "--fold-group-file", str(files["empty"])],
         f"{files['empty']}, line 7: no patient value for id '{pairs[5][0]}'"),
        (data + ["--fold-group", "patient", "--fold-group-file", str(files["conflict"])],
         f"id '{pairs[0][0]}' is given groups '{pairs[0][1]}' and 'p_other'"),
        (data + ["--fold-group-file", str(files["partial"])], "needs --fold-group COLUMN"),
        (["--data-dir", str(sample.root), "--fold-group", "patient", "--fold-group-file", str(files["partial"])],
         "carry no unique 'id' feature"),
    ]
    for extra, words in cases:
        with pytest.raises(SystemExit) as exit_info:
            job.main(base + extra)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


# --------------------------------------------------------------------------- a tfds source


def test_a_tfds_source_is_converted_with_its_ids_and_test_split_and_grouped_by_a_group_file(tiny_tfds, tmp_path):
    """Past the conversion a CV reads OUT/data as it reads any source's (the folds' training: test_cv.py)."""
    from kaggle_utils.data import DataError, list_tfrecords
    from kaggle_utils.run import scan_test_ids

    groups = write_csv(tmp_path / "groups.csv", ["id", "video"], [[f"train-{i}", f"v{i // 3}"] for i in range(30)])
    config = TrainConfig().replace(source="tfds:tiny_digits:train", test_source="tfds:tiny_digits:test",
                                   tfds_data_dir=tiny_tfds, image_size=16, val_fraction=0.4, model=TEST_MODEL)
    out = tmp_path / "cv"
    result = run.cross_validate(config, out, folds=2, only_folds=[], fold_group="video", fold_group_file=groups,
                                progress=False)
    assert result.remaining == (0, 1)
    header, rows = read_csv(out / "folds.csv")
    assert header == ["id", "fold", "video"] and sorted(r[0] for r in rows) == sorted(f"train-{i}" for i in range(30))
    assert all(r[2] == f"v{int(r[0].split('-')[1]) // 3}" for r in rows)
    assert_groups_whole(np.array([r[2] for r in rows]), np.array([int(r[1]) for r in rows]), 2)
    assert sorted(scan_test_ids(list_tfrecords(out / "data" / "test"))) == sorted(f"test-{i}" for i in range(10))
    with pytest.raises(DataError, match=f"tfds dataset 'tiny_digits' is not prepared in {tmp_path}"):
        run.cross_validate(config.replace(tfds_data_dir=str(tmp_path)), tmp_path / "elsewhere", folds=2,
                           progress=False)  # --tfds-data-dir is where the dataset is looked for
    assert not (tmp_path / "elsewhere").exists()
