"""``--teacher`` and ``--pseudo-labels`` (issue 47): a finished run's probabilities joined to a new run's records.

The teachers here are files in the formats the kit writes (a CV folder's folds.csv, oof.csv and
test_probabilities.csv; a run's config.json and probabilities.csv; predict.json), made with known probabilities so
that what the student reads can be checked row by row; one run trains with both to the end."""
import csv
import json

import numpy as np
import pytest

from kaggle_utils import checkpoint, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.data import list_tfrecords, load_dataset
from kaggle_utils.data.tfrecords import scan_records
from kaggle_utils.run import cv, teacher
from kaggle_utils.run.data import record_names

from job_helpers import TEST_MODEL

CLASSES = 10


def tiny_config(sample, **changes):
    return TrainConfig().replace(**{"data_dir": sample.root, "model": TEST_MODEL, "batch_size": 64, "steps": 4,
                                    "eval_every": 2, "tensorboard": False, **changes})


def write_csv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([header, *rows])
    return path


@pytest.fixture(scope="module")
def pool(sample):
    records = scan_records(list_tfrecords(sample.split_dirs["train"]) + list_tfrecords(sample.split_dirs["val"]))
    return records, record_names(records)[0]


@pytest.fixture(scope="module")
def teacher_cv(sample, pool, tmp_path_factory):
    """A 2-fold CV folder's files: every labelled record's out-of-fold row, the test images' mean rows (a third of
    them sure of a class, at 0.97)."""
    records, names = pool
    folder = tmp_path_factory.mktemp("teacher") / "cv"
    rng = np.random.default_rng(0)
    folds = np.arange(len(names)) % 2
    oof = rng.dirichlet(np.ones(CLASSES), size=len(names))
    write_csv(folder / "folds.csv", ["id", "fold"], zip(names, folds))
    write_csv(folder / "oof.csv", ["id", "label", "fold", *range(CLASSES)],
              ([n, int(y), int(f), *row] for n, y, f, row in zip(names, records.labels, folds, oof)))
    test_ids = list(scan_records(list_tfrecords(sample.split_dirs["test"])).ids)
    test = rng.dirichlet(np.ones(CLASSES) * 0.3, size=len(test_ids)) * 0.1
    sure = np.arange(len(test_ids)) % 3 == 0
    test[sure] = np.eye(CLASSES)[np.arange(sure.sum()) % CLASSES] * 0.97 + 0.003
    test /= test.sum(1, keepdims=True)
    write_csv(folder / "test_probabilities.csv", ["id", *map(str, range(CLASSES))],
              ([i, *row] for i, row in zip(test_ids, test)))
    for k in range(2):  # the folds' run folders, as a CV leaves them (their config says the classes)
        (folder / f"fold{k}").mkdir()
        config = run.resolve(tiny_config(sample), run.open_data(tiny_config(sample), sample.root))[0]
        (folder / f"fold{k}" / "config.json").write_text(json.dumps({"config": config.to_dict()}))
    return folder, dict(zip(names, oof)), dict(zip(test_ids, test))


def taught(sample, **changes):
    config = tiny_config(sample, **changes)
    return config, teacher.teach(config, run.open_data(config, sample.root))


def test_a_teacher_s_out_of_fold_rows_join_each_training_record_by_its_name(sample, pool, teacher_cv):
    folder, oof, _ = teacher_cv
    config, data = taught(sample, teacher=str(folder))
    records, names = pool
    name_of = {f"{f}#{i}": n for (f, i), n in zip(records.pairs(), names)}
    row_of = {k: r for r, k in enumerate(data.fields.keys)}
    train_pairs = scan_records(list_tfrecords(sample.split_dirs["train"])).pairs()
    assert data.num_train == len(train_pairs) and sorted(data.select["train"]) == sorted(train_pairs)
    for f, i in train_pairs[::97]:
        key = f"{f}#{i}"
        np.testing.assert_allclose(data.fields.values["teacher"][row_of[key]], oof[name_of[key]], rtol=1e-6)
    assert data.teaching["teacher"]["rows_are"] == "out-of-fold" and data.teaching["teacher"]["alpha"] == 0.5
    assert data.splits["val"] == run.open_data(config, sample.root).splits["val"]  # validation: as it was


def test_pseudo_labelled_test_images_join_training_only_never_validation_nor_a_fold_s_held_out_part(sample, pool,
                                                                                                 teacher_cv):
    folder, _, test_probs = teacher_cv
    config = tiny_config(sample, teacher=str(folder), pseudo_labels=str(folder), pseudo_threshold=0.95)
    data = run.open_data(config, sample.root)
    fold_pool = cv._pool(data, 2, config.seed)
    fold = cv._fold_data(data, fold_pool, 0)
    student = teacher.teach(config, fold)
    sure = [i for i, p in test_probs.items() if p.max() >= 0.95]
    note = student.teaching["pseudo_labels"]
    assert note["images"] == len(sure) and note["of"] == len(test_probs) and len(sure) > 20
    assert sum(note["per_class"].values()) == len(sure) and set(note["per_class"]) == set(map(str, range(10)))
    test_pairs = set(scan_records(list_tfrecords(sample.split_dirs["test"])).pairs())
    pseudo = [pair for pair in student.select["train"] if pair in test_pairs]
    held_out = set(fold_pool.pairs(fold_pool.folds == 0))
    assert len(pseudo) == len(sure) and not held_out & set(student.select["train"])
    assert student.num_train == int((fold_pool.folds != 0).sum()) + len(sure)

    def read(split):  # what a read of the split delivers, record by record, with its label
        dataset = load_dataset(student.splits[split], image_size=16, batch_size=64, select=student.select[split],
                               with_records=True, fields=student.fields if split == "train" else None)
        return {r.decode(): label for b in dataset for r, label, m in zip(b["record"], b["label"], b["mask"]) if m}

    val, train = read("val"), read("train")
    keys = {f"{f}#{i}" for f, i in pseudo}
    assert not keys & set(val) and set(val) == {f"{f}#{i}" for f, i in held_out}
    assert keys <= set(train) and len(train) == student.num_train
    test_index = scan_records(list_tfrecords(sample.split_dirs["test"]))
    id_of = {f"{f}#{i}": n for (f, i), n in zip(test_index.pairs(), test_index.ids)}
    for key in sorted(keys)[::7]:  # soft targets: the teacher's row
        np.testing.assert_allclose(train[key], test_probs[id_of[key]], rtol=1e-6)


def test_a_teacher_that_trained_on_the_run_s_records_is_refused_naming_them(sample, pool, tmp_path):
    """A prediction of the training images by a model trained on them: a run folder's, or a blend of it."""
    records, names = pool
    config = run.resolve(tiny_config(sample), run.open_data(tiny_config(sample), sample.root))[0]
    teacher_run = tmp_path / "run"
    teacher_run.mkdir()
    (teacher_run / "config.json").write_text(json.dumps({"config": config.to_dict()}))
    probs = np.full((len(names), CLASSES), 0.1)
    write_csv(teacher_run / "probabilities.csv", ["id", *map(str, range(CLASSES))],
              ([n, *row] for n, row in zip(names, probs)))
    blend = tmp_path / "blend"
    write_csv(blend / "probabilities.csv", ["id", *map(str, range(CLASSES))],
              ([n, *row] for n, row in zip(names, probs)))
    (blend / "predict.json").write_text(json.dumps({"checkpoints": [str(teacher_run / "best.msgpack")]}))
    for path in (teacher_run, blend / "probabilities.csv"):
        with pytest.raises(ConfigError, match=r"its model\(s\) trained on 1258 of this run's training records "
                                              r"\('train/00-16x16-315.tfrec#0', .*\): their rows would teach"):
            taught(sample, teacher=str(path))
    alone = write_csv(tmp_path / "alone" / "t.csv", ["id", *map(str, range(CLASSES))],
                      ([n, *row] for n, row in zip(names, probs)))
    _, data = taught(sample, teacher=str(alone))  # no record of its models: taken as given, and said so
    assert data.teaching["teacher"]["rows_are"] == "of models whose training records are not known (a CSV)"


@pytest.mark.parametrize("change, words", [
    (lambda header, rows: (header[:-1], [r[:-1] for r in rows]), "its probabilities are of 9 classes, the run 10"),
    (lambda header, rows: (header, rows[:100]), "has no row for 1158 of the run's 1258 training records"),
    (lambda header, rows: (header, [[r[0], *(0.5 * float(v) for v in r[1:])] for r in rows]),
     "rows that do not sum to 1"),
])
def test_a_teacher_of_other_classes_or_missing_rows_is_refused(sample, teacher_cv, tmp_path, change, words):
    folder, _, _ = teacher_cv
    with open(folder / "oof.csv", newline="") as f:
        header, *rows = list(csv.reader(f))
    header, rows = change(header[:1] + header[3:], [r[:1] + r[3:] for r in rows])
    path = write_csv(tmp_path / "t.csv", header, rows)
    with pytest.raises(ConfigError, match=words):
        taught(sample, teacher=str(path))


def test_flags_of_a_teacher_need_the_teacher():
    with pytest.raises(ConfigError, match="--distill-alpha and --distill-temperature need --teacher"):
        TrainConfig().replace(distill_alpha=0.8, distill_temperature=2.0).check()
    with pytest.raises(ConfigError, match="--pseudo-threshold needs --pseudo-labels"):
        TrainConfig().replace(pseudo_threshold=0.5).check()


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_run_learns_from_a_teacher_and_its_pseudo_labels_and_says_so(sample, teacher_cv, tmp_path, capsys):
    folder, _, test_probs = teacher_cv
    config = tiny_config(sample, pseudo_labels=str(folder), pseudo_threshold=0.95, distill_alpha=0.7, mixup_alpha=0.2)
    with pytest.raises(ConfigError, match="--distill-alpha needs --teacher"):
        config.check()
    result = run.train(config, tmp_path / "student", teacher=folder, progress=False)
    assert all(np.isfinite(row["train_loss"]) and np.isfinite(row["val_loss"]) for row in result.history)
    assert result.steps.config.task.distill_alpha == 0.7
    said = capsys.readouterr().out
    sure = sum(p.max() >= 0.95 for p in test_probs.values())
    assert f"teacher {folder / 'oof.csv'}: 1258 rows out-of-fold, alpha 0.7, temperature 1" in said
    assert f"pseudo-labels {folder / 'test_probabilities.csv'}: {sure} of {len(test_probs)} test images at p >= " \
           "0.95 (soft targets; per class: 0 " in said
    metrics = json.loads((tmp_path / "student" / "metrics.json").read_text())
    record = json.loads((tmp_path / "student" / "config.json").read_text())
    assert metrics["pseudo_labels"]["images"] == sure == record["teaching"]["pseudo_labels"]["images"]
    assert record["plan"]["steps_per_epoch"] == (1258 + sure) // 64
    assert record["config"]["distill"]["teacher"] == str(folder)
    assert checkpoint.load(tmp_path / "student" / "best.msgpack")  # a whole run: predicted, saved
