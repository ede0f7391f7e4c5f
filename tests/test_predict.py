"""``predict``: ensembles of runs and CV folds, probabilities.csv, any test source; a converted folder's labels.

Issue 24: predict could not ensemble or read images; a converted folder's columns and class names were lost.
"""
import csv
import json
import shutil

import numpy as np
import pytest

from kaggle_utils import job, run
from kaggle_utils.config import ConfigError, TrainConfig

from job_helpers import TEST_MODEL

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
CLASSES = sorted(NAMES)  # a CSV's class names, in the order a conversion numbers them


def tiny_config(**changes):
    return TrainConfig().replace(**{"model": TEST_MODEL, "batch_size": 64, "steps": 2, "eval_every": 2, **changes})


def run_main(argv, capsys):
    """(exit code, stderr) of the job run in this process."""
    with pytest.raises(SystemExit) as exit_info:
        job.main(argv)
    return exit_info.value.code, capsys.readouterr().err


def read_csv(path):
    with open(path) as f:
        rows = list(csv.reader(f))
    return rows[0], rows[1:]


def probabilities(path):
    """(header, ids, float64 [N, C]) of a probabilities.csv."""
    header, rows = read_csv(path)
    return header, [r[0] for r in rows], np.array([[float(v) for v in r[1:]] for r in rows])


# --------------------------------------------------------------------------- ensembles of runs on the sample


@pytest.fixture(scope="module")
def two_runs(sample, tmp_path_factory):
    """Two runs on the sample (other seeds), and a CV folder holding them as fold0/ and fold1/."""
    tmp = tmp_path_factory.mktemp("runs")
    for name, seed in (("a", 0), ("b", 1)):
        run.train(tiny_config(data_dir=sample.root, seed=seed), tmp / name, progress=False)
        shutil.copytree(tmp / name, tmp / "cv" / f"fold{seed}")
    return tmp


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_run_writes_probabilities_beside_its_submission(two_runs):
    header, ids, probs = probabilities(two_runs / "a" / "probabilities.csv")
    sub_header, rows = read_csv(two_runs / "a" / "submission.csv")
    assert header == ["id"] + [str(c) for c in range(10)] and sub_header == ["id", "label"]
    assert ids == [r[0] for r in rows] and len(set(ids)) == len(ids)
    np.testing.assert_allclose(probs.sum(1), 1, atol=1e-5)
    assert [int(r[1]) for r in rows] == list(probs.argmax(1))


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_predict_averages_runs_and_a_cv_folder_s_folds_with_the_weights_given(two_runs, sample, tmp_path):
    _, ids, a = probabilities(two_runs / "a" / "probabilities.csv")
    b = probabilities(two_runs / "b" / "probabilities.csv")[2]
    assert np.abs(a - b).max() > 1e-3  # two models, so the mean is not either
    # the CV folder's two folds share its weight 1: (a + b) / 2 x 1/4, plus a x 3/4
    assert job.main(["predict", "--checkpoint", str(two_runs / "cv"), "--checkpoint", str(two_runs / "a"),
                     "--weights-per-checkpoint", "1,3", "--data-dir", sample.root, "--out", str(tmp_path)]) == 0
    header, got_ids, got = probabilities(tmp_path / "probabilities.csv")
    assert got_ids == ids
    np.testing.assert_allclose(got, 0.25 * (a + b) / 2 + 0.75 * a, atol=2e-6)
    _, rows = read_csv(tmp_path / "submission.csv")
    assert [r[0] for r in rows] == ids and [int(r[1]) for r in rows] == list(got.argmax(1))


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_predict_ends_with_a_block_saying_what_it_predicted_with_which_models_and_files(two_runs, sample, tmp_path,
                                                                                         capsys):
    out = tmp_path / "pred"
    assert job.main(["predict", "--checkpoint", str(two_runs / "cv"), "--checkpoint", str(two_runs / "a"),
                     "--weights-per-checkpoint", "1,3", "--tta", "--data-dir", sample.root, "--out", str(out)]) == 0
    said = capsys.readouterr().out.strip().splitlines()
    rule = said[-1]
    assert set(rule) == {"-"} and said.count(rule) == 2
    block = said[said.index(rule) + 1:-1]
    rows = len(read_csv(out / "submission.csv")[1])
    assert block[0] == (f"predicted: {rows} test images of {sample.root}/test with 3 model(s), the weighted mean of "
                        "their probabilities")
    for line, (folder, weight) in zip(block[1:4], ((two_runs / "cv" / "fold0", 1 / 8), (two_runs / "cv" / "fold1", 1 / 8),
                                                   (two_runs / "a", 3 / 4))):
        saved = json.loads((folder / "best.json").read_text())
        assert line == (f"  {folder / 'best.msgpack'} (step {saved['step']}, {saved['monitor']} {saved['value']:.4f}): "
                        f"weight {weight:.3f}, 16 px, flip TTA")
    assert block[4].startswith("time: ") and block[4].endswith(" total (reading the models, compiling, predicting)")
    assert block[5] == f"files in {out}: submission.csv ({rows} rows), probabilities.csv ({rows} rows)"
    assert block[6].startswith(f"next: submit {out / 'submission.csv'}")
    assert block[7] == (f"  python -m kaggle_utils predict --checkpoint {two_runs / 'cv'} --checkpoint {two_runs / 'a'} "
                        f"--checkpoint OTHER_RUN --weights-per-checkpoint 1,1,1 --data-dir {sample.root} "
                        f"--out {out}-blend")


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_models_of_other_sizes_each_predict_at_their_own_crop(two_runs, sample, tmp_path):
    """A run at 24 px (the 16 px records resized) blends with one at 16 px: each reads the test split its own way."""
    run.train(tiny_config(data_dir=sample.root, image_size=24), tmp_path / "c24", progress=False)
    _, ids, a = probabilities(two_runs / "a" / "probabilities.csv")
    c = probabilities(tmp_path / "c24" / "probabilities.csv")[2]
    assert job.main(["predict", "--checkpoint", str(two_runs / "a"), "--checkpoint", str(tmp_path / "c24"),
                     "--data-dir", sample.root, "--out", str(tmp_path / "pred")]) == 0
    np.testing.assert_allclose(probabilities(tmp_path / "pred" / "probabilities.csv")[2], (a + c) / 2, atol=2e-6)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_checkpoints_whose_classes_disagree_are_refused_naming_both(two_runs, sample, tmp_path, capsys):
    other = tmp_path / "named"
    shutil.copytree(two_runs / "b", other)
    for manifest in other.glob("*.json"):
        record = json.loads(manifest.read_text())
        if "config" in record:
            record["config"]["data"]["class_names"] = NAMES
            manifest.write_text(json.dumps(record))
    code, err = run_main(["predict", "--checkpoint", str(two_runs / "a"), "--checkpoint", str(other), "--data-dir",
                          sample.root, "--out", str(tmp_path / "pred")], capsys)
    assert code == 2, err
    assert f"--checkpoint {two_runs / 'a'} and {other} disagree (class 0 is unnamed vs 'zero')" in err
    code, err = run_main(["predict", "--checkpoint", str(two_runs / "a"), "--checkpoint", str(two_runs / "b"),
                          "--weights-per-checkpoint", "1", "--data-dir", sample.root, "--out", str(tmp_path / "pred")],
                         capsys)
    assert code == 2 and "gives 1 weight(s) for 2 --checkpoint(s)" in err
    assert not (tmp_path / "pred").exists()


def _another_run_s_checkpoint(run_folder, out, classes=12):
    """``run_folder``'s best checkpoint with a classifier ``classes`` wide and its manifest saying so: what a copy of
    another run's best.msgpack and best.json would be."""
    from kaggle_utils import checkpoint

    variables = checkpoint.load(run_folder / "best.msgpack")
    head = variables["params"]["classifier"]
    variables["params"]["classifier"] = {"kernel": np.pad(head["kernel"], ((0, 0), (0, classes - 10))),
                                         "bias": np.pad(head["bias"], (0, classes - 10))}
    manifest = json.loads((run_folder / "best.json").read_text())
    manifest["config"]["model"]["num_classes"] = classes
    checkpoint.save(out / "best.msgpack", variables, manifest=manifest)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_run_folder_s_checkpoint_that_is_not_what_its_manifest_says_is_refused(two_runs, sample, tmp_path, capsys):
    """Issue 47: another run's 12-class checkpoint copied over best.msgpack was predicted as this 10-class run (its
    wider head cut as padding), a changed best.msgpack used with only a RuntimeWarning."""
    other, folder = tmp_path / "other", tmp_path / "run"
    other.mkdir()
    _another_run_s_checkpoint(two_runs / "a", other)
    shutil.copytree(two_runs / "a", folder)
    shutil.copy(other / "best.msgpack", folder / "best.msgpack")  # the file only: its manifest is this run's
    argv = ["predict", "--checkpoint", str(folder), "--data-dir", sample.root, "--out", str(tmp_path / "pred")]
    code, err = run_main(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"checkpoint {folder / 'best.msgpack'} differs from its manifest best.json (sha256 " in err
    assert "--accept-changed-checkpoint uses it knowingly" in err
    code, err = run_main(argv + ["--accept-changed-checkpoint"], capsys)  # accepted: its head is still refused
    assert code == 2 and err.count("\n") == 1, err
    assert (f"{folder / 'best.msgpack'}: its classifier has 12 outputs, but its run has 10 classes (a head 10 wide, "
            "per best.json): it is another run's checkpoint") in err
    shutil.copy(other / "best.json", folder / "best.json")  # and its manifest: config.json still says 10 classes
    code, err = run_main(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert (f"{folder / 'best.msgpack'}: its manifest best.json records classes 12 but {folder / 'config.json'} "
            "records 10: it is another run's checkpoint") in err
    assert not (tmp_path / "pred" / "submission.csv").exists()


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_checkpoint_changed_knowingly_predicts_with_a_warning(two_runs, sample, tmp_path):
    from kaggle_utils import checkpoint

    folder = tmp_path / "run"
    shutil.copytree(two_runs / "a", folder)
    variables = checkpoint.load(folder / "best.msgpack")
    variables["params"]["classifier"]["bias"] = variables["params"]["classifier"]["bias"] + np.arange(10) * 100.0
    (folder / "best.msgpack").write_bytes(checkpoint.serialization.msgpack_serialize(variables))
    with pytest.warns(RuntimeWarning, match="differs from its manifest best.json"):
        assert job.main(["predict", "--checkpoint", str(folder), "--accept-changed-checkpoint", "--data-dir",
                         sample.root, "--out", str(tmp_path / "pred")]) == 0
    _, rows = read_csv(tmp_path / "pred" / "submission.csv")
    assert {r[1] for r in rows} == {"9"}  # the changed file was the one used: its bias picks class 9


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_predict_refuses_a_batch_of_zero_as_train_does(two_runs, sample, tmp_path, capsys):
    for command in (["predict", "--checkpoint", str(two_runs / "a"), "--data-dir", sample.root],
                    ["train", "--data-dir", sample.root, "--model", TEST_MODEL]):
        code, err = run_main([*command, "--batch-size", "0", "--out", str(tmp_path / command[0])], capsys)
        assert code == 2 and "error: --batch-size 0: must be at least 1" in err, err
        assert not (tmp_path / command[0]).exists()


# --------------------------------------------------------------------------- Kaggle's CSV layout, converted or not


def _save_png(path, image):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image).save(path)


@pytest.fixture(scope="module")
def kaggle_layout(tmp_path_factory):
    """train.csv (image_id, texture names) + train_images/, test.csv + test_images/: digits at 16 px."""
    from sklearn.datasets import load_digits

    root = tmp_path_factory.mktemp("kaggle")
    digits = load_digits()
    train_rows, test_ids = [], []
    for digit in range(10):
        for i, image in enumerate(digits.images[digits.target == digit][:12]):
            big = np.kron((image * 255 / 16).astype(np.uint8), np.ones((2, 2), np.uint8))  # 8 -> 16 px
            pixels = np.repeat(big[..., None], 3, -1)
            if i < 10:
                _save_png(root / "train_images" / f"a{digit}_{i}.png", pixels)
                train_rows.append(f"a{digit}_{i},{NAMES[digit]}")
            else:
                _save_png(root / "test_images" / f"b{digit}_{i}.png", pixels)
                test_ids.append(f"b{digit}_{i}")
    (root / "train.csv").write_text("image_id,texture\n" + "\n".join(train_rows) + "\n")
    (root / "test.csv").write_text("image_id\n" + "\n".join(test_ids) + "\n")
    return root


@pytest.fixture(scope="module")
def records_run(kaggle_layout):
    """The README's convert command, then train --data-dir records with no column or class flags."""
    from kaggle_utils.data.__main__ import main as data_main

    root = kaggle_layout
    assert data_main(["convert", str(root / "train.csv"), "--image-dir", str(root / "train_images"), "--id-column",
                      "image_id", "--label-column", "texture", "--test", str(root / "test.csv"), "--test-image-dir",
                      str(root / "test_images"), "--image-size", "16", "--shards", "2",
                      "--out", str(root / "records")]) == 0
    run.train(tiny_config(data_dir=str(root / "records")), root / "run", progress=False)
    return root / "run"


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_converted_folder_s_columns_and_class_names_reach_the_submission(records_run, kaggle_layout):
    header, rows = read_csv(records_run / "submission.csv")
    assert header == ["image_id", "texture"]
    assert [r[0] for r in rows] == (kaggle_layout / "test.csv").read_text().split()[1:]
    assert {r[1] for r in rows} <= set(NAMES)
    assert probabilities(records_run / "probabilities.csv")[0] == ["image_id", *CLASSES]
    recorded = json.loads((records_run / "config.json").read_text())["config"]["data"]
    assert (recorded["id_column"], recorded["label_column"]) == ("image_id", "texture")
    assert recorded["class_names"] == CLASSES


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_flags_that_disagree_with_the_converted_folder_are_refused_naming_both(records_run, kaggle_layout, tmp_path):
    records = kaggle_layout / "records"
    with pytest.raises(ConfigError, match=f"--label-column 'digit' disagrees with {records / 'class_names.json'} "
                                          r"\(written by the conversion of CSV .*train.csv\), which records "
                                          "'texture'"):
        run.train(tiny_config(data_dir=str(records), label_column="digit"), tmp_path / "refused", progress=False)
    with pytest.raises(ConfigError, match="--class-names a, b, c, d, e, f, ... disagrees with .* which records "
                                          "eight, five, four, nine, one, seven, ..."):
        run.train(tiny_config(data_dir=str(records), class_names=tuple("abcdefghij")), tmp_path / "refused",
                  progress=False)
    assert not (tmp_path / "refused").exists()


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_predict_reads_a_test_csv_and_an_image_folder_as_the_run_read_its_test_split(records_run, kaggle_layout,
                                                                                      tmp_path):
    want_header, want_ids, want = probabilities(records_run / "probabilities.csv")
    assert job.main(["predict", "--checkpoint", str(records_run), "--test-source", str(kaggle_layout / "test.csv"),
                     "--test-image-dir", str(kaggle_layout / "test_images"), "--out", str(tmp_path / "csv")]) == 0
    assert (tmp_path / "csv" / "submission.csv").read_text() == (records_run / "submission.csv").read_text()
    header, ids, got = probabilities(tmp_path / "csv" / "probabilities.csv")
    assert (header, ids) == (want_header, want_ids)
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert job.main(["predict", "--checkpoint", str(records_run), "--test-source", str(kaggle_layout / "test_images"),
                     "--out", str(tmp_path / "folder")]) == 0
    header, ids, got = probabilities(tmp_path / "folder" / "probabilities.csv")
    order = [want_ids.index(i) for i in ids]  # a folder is read in file-name order
    assert sorted(ids) == sorted(want_ids)
    np.testing.assert_allclose(got, want[order], atol=1e-6)


def test_train_finds_test_images_in_their_own_folder_and_says_where_it_looked(kaggle_layout, tmp_path, capsys):
    root = kaggle_layout
    args = ["train", "--source", str(root / "train.csv"), "--image-dir", str(root / "train_images"), "--id-column",
            "image_id", "--label-column", "texture", "--test-source", str(root / "test.csv"), "--image-size", "16",
            "--model", TEST_MODEL, "--out", str(tmp_path / "run")]
    code, err = run_main(args, capsys)
    assert code == 2
    assert (f"test.csv, line 2, column 'image_id': no image file {root / 'train_images' / 'b0_10'} with any of the "
            "extensions .jpg, .jpeg, .png, .bmp, .gif, .webp (or upper case)") in err
    assert "give it as --test-image-dir" in err and "--skip-errors" not in err
    config = tiny_config(source=str(root / "train.csv"), image_dir=str(root / "train_images"), id_column="image_id",
                         label_column="texture", image_size=16, test_source=str(root / "test.csv"),
                         test_image_dir=str(root / "test_images"))
    with run.data_root(config, tmp_path / "run") as data:  # the conversion the run would train on
        assert json.loads((data / "class_names.json").read_text())["counts"]["test"] == 20


def test_the_skip_errors_hint_comes_only_with_errors_that_skipping_fixes(kaggle_layout, tmp_path, capsys):
    images = tmp_path / "images"
    shutil.copytree(kaggle_layout / "train_images", images)
    (images / "a3_0.png").write_bytes(b"not an image")
    args = ["train", "--source", str(kaggle_layout / "train.csv"), "--image-dir", str(images), "--id-column",
            "image_id", "--label-column", "texture", "--image-size", "16", "--model", TEST_MODEL,
            "--out", str(tmp_path / "run")]
    code, err = run_main(args, capsys)
    assert code == 2 and "a3_0.png" in err and "(--skip-errors skips unreadable records" in err
