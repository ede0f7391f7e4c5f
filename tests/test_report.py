"""What a run reports: the summary block, curves.png, per_class.csv, ``report OUT``, and a quiet log.

Two tiny job runs (timm's test_efficientnet, the 16 px sample, 2 steps), one with a test split and
one without, as real processes: their logs are what a user's terminal shows. The per-class
figures are checked against counts worked out by hand, not by the code under test.
"""
import csv
import json
import shutil

import numpy as np
import pytest

from kaggle_utils import job, report

from job_helpers import TEST_MODEL, finish, job_process

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TINY = ["train", "--model", TEST_MODEL, "--steps", "2", "--batch-size", "32", "--no-progress"]


def run_main(argv, capsys):
    """(exit code, stdout, stderr) of the job run in this process."""
    try:
        code = job.main(argv)
    except SystemExit as exit_info:
        code = exit_info.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 5000, f"{path}: {len(data)} bytes, not a drawn PNG"


@pytest.fixture(scope="module")
def runs(sample, tmp_path_factory):
    """(folder, log) of a run with a test split and of one without (the sample minus test/)."""
    tmp = tmp_path_factory.mktemp("report")
    no_test = tmp / "no_test_data"
    shutil.copytree(sample.root, no_test, ignore=shutil.ignore_patterns("test"))
    with_log = finish(job_process([*TINY, "--data-dir", sample.root], tmp / "with_test", tmp))
    without_log = finish(job_process([*TINY, "--data-dir", str(no_test)], tmp / "without_test", tmp))
    return {"with": (tmp / "with_test", with_log), "without": (tmp / "without_test", without_log)}


# --------------------------------------------------------------------------- per-class figures


def test_per_class_rows_match_a_confusion_matrix_worked_by_hand(tmp_path):
    # rows: true class, columns: predicted. Class 2 never occurs but is predicted once.
    confusion = [[5, 1, 0],
                 [2, 3, 1],
                 [0, 0, 0]]
    path = report.write_per_class(tmp_path, {"confusion": confusion, "class_names": ["cat", "dog", "fox"]})
    rows = read_csv(path)
    assert [r["name"] for r in rows] == ["cat", "dog", "fox"]
    expected = {  # class: support, predicted, precision, recall, f1, most confused with, count
        "cat": (6, 7, 5 / 7, 5 / 6, 10 / 13, "dog", 1),
        "dog": (6, 4, 3 / 4, 3 / 6, 6 / 10, "cat", 2),
        "fox": (0, 1, 0.0, 0.0, 0.0, "", 0),
    }
    for row in rows:
        support, predicted, precision, recall, f1, other, count = expected[row["name"]]
        assert (int(row["support"]), int(row["predicted"])) == (support, predicted), row
        np.testing.assert_allclose([float(row[k]) for k in ("precision", "recall", "f1")], [precision, recall, f1],
                                   atol=1e-6, err_msg=str(row))
        assert (row["most_confused_with"], int(row["most_confused_count"])) == (other, count), row


def test_multilabel_counts_give_per_class_rows_without_a_confusion_column(tmp_path):
    record = {"class_names": ["a", "b"], "tp": [3, 0], "fp": [1, 0], "fn": [1, 2]}
    rows = read_csv(report.write_per_class(tmp_path, record))
    assert "most_confused_with" not in rows[0]
    assert [(r["name"], int(r["support"]), int(r["predicted"])) for r in rows] == [("a", 4, 4), ("b", 2, 0)]
    np.testing.assert_allclose([float(rows[0][k]) for k in ("precision", "recall", "f1")], [0.75, 0.75, 0.75])
    assert [float(rows[1][k]) for k in ("precision", "recall", "f1")] == [0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- the job's run folder


@pytest.mark.slow  # starts a job process (tests/tiers.py)
@pytest.mark.parametrize("kind", ["with", "without"])
def test_a_run_writes_curves_and_the_best_checkpoints_per_class_table(runs, kind):
    out, _ = runs[kind]
    assert_png(out / "curves.png")
    metrics = json.loads((out / "metrics.json").read_text())
    counts = json.loads((out / "val_counts.json").read_text())
    confusion = np.asarray(counts["confusion"])
    best = metrics["best"]
    assert counts["step"] == best["step"]
    # the stored counts are the best checkpoint's: they give back the best row's validation figures
    assert confusion.sum() == counts["count"]
    assert np.trace(confusion) / confusion.sum() == pytest.approx(best["val_acc"], abs=1e-9)
    rows = read_csv(out / "per_class.csv")
    assert [int(r["support"]) for r in rows] == confusion.sum(1).tolist()
    assert [int(r["predicted"]) for r in rows] == confusion.sum(0).tolist()
    f1 = [float(r["f1"]) for r in rows]
    present = (confusion.sum(0) + confusion.sum(1)) > 0
    assert np.mean(np.asarray(f1)[present]) == pytest.approx(best["val_f1"], abs=1e-5)


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_the_summary_block_ends_a_run_with_a_test_split(runs):
    out, log = runs["with"]
    block = log[log.index("run finished:"):]
    best = json.loads((out / "metrics.json").read_text())["best"]
    assert f"best val_f1 {best['val_f1']:.4f} at epoch {best['epoch']}, step {best['step']}" in block
    assert "(with compile)" in block and "time: " in block and "images/s" in block
    rows = len(read_csv(out / "submission.csv"))
    assert f"submission.csv ({rows} rows)" in block and "curves.png" in block and "per_class.csv" in block
    assert f"python -m kaggle_utils predict --checkpoint {out}" in block
    assert "wrote " not in block  # the old one-line ending is gone


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_the_summary_block_ends_a_run_without_a_test_split(runs):
    out, log = runs["without"]
    assert not (out / "submission.csv").exists()
    block = log[log.index("run finished:"):]
    assert "best val_f1 " in block and "submission.csv" not in block.split("next:")[0]
    assert f"look at {out}/curves.png" in block and "--data-dir DIR" in block


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_the_log_has_no_tensorflow_start_up_noise_and_still_shows_our_errors(runs, sample, tmp_path, monkeypatch):
    for _, log in runs.values():
        assert "use_unbounded_threadpool" not in log and "absl::InitializeLog" not in log, log[-3000:]
        assert "E0000" not in log
    # as a user runs it: the kit's own TensorFlow log level, not the one conftest.py sets for the tests
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    # an error of ours found after TensorFlow started (scanning labels) still reaches the terminal
    proc = job_process([*TINY, "--data-dir", sample.root, "--num-classes", "3"], tmp_path / "bad", tmp_path)
    log = proc.communicate(timeout=600)[0]
    assert proc.returncode == 2 and "error: --num-classes 3 is too small" in log, log[-2000:]
    assert "absl::InitializeLog" not in log and "I0000" not in log and "oneDNN" not in log, log[-3000:]


# --------------------------------------------------------------------------- report OUT


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_report_redraws_a_run_folder_after_its_files_are_deleted(runs, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(runs["with"][0], out, ignore=shutil.ignore_patterns("*.msgpack", "tensorboard"))
    table = (out / "per_class.csv").read_text()
    (out / "curves.png").unlink()
    (out / "per_class.csv").unlink()
    code, printed, err = run_main(["report", str(out)], capsys)
    assert code == 0, err
    assert_png(out / "curves.png")
    assert (out / "per_class.csv").read_text() == table  # rebuilt from val_counts.json: no model, no data
    assert f"wrote {out / 'curves.png'}" in printed and "best val_f1" in printed


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_report_redraws_each_fold_of_a_cv_folder(runs, tmp_path, capsys):
    cv = tmp_path / "cv"
    for fold, kind in (("fold0", "with"), ("fold1", "without")):
        shutil.copytree(runs[kind][0], cv / fold, ignore=shutil.ignore_patterns("*.msgpack", "tensorboard", "*.png",
                                                                              "per_class.csv"))
    code, printed, err = run_main(["report", str(cv)], capsys)
    assert code == 0, err
    for fold in ("fold0", "fold1"):
        assert_png(cv / fold / "curves.png")
        assert (cv / fold / "per_class.csv").is_file()
        assert f"{fold}: best val_f1" in printed
    assert "over 2 folds" in printed


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_report_without_stored_counts_draws_the_curves_and_says_why_no_table(runs, tmp_path, capsys):
    out = tmp_path / "old_run"
    shutil.copytree(runs["without"][0], out, ignore=shutil.ignore_patterns("*.msgpack", "tensorboard", "*.png",
                                                                           "per_class.csv", "val_counts.json"))
    code, printed, _ = run_main(["report", str(out)], capsys)
    assert code == 0
    assert_png(out / "curves.png")
    assert not (out / "per_class.csv").exists() and "no per_class.csv: " in printed


def test_report_refuses_what_is_not_a_run_in_one_line_naming_it(tmp_path, capsys):
    empty = tmp_path / "not_a_run"
    empty.mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "metrics.json").write_text("{not json")
    for path, words in ((empty, "is neither a run folder"), (tmp_path / "missing", "is not a folder"),
                        (tmp_path / "broken", "metrics.json is not valid JSON")):
        code, printed, err = run_main(["report", str(path)], capsys)
        assert code == 2 and not printed, (printed, err)
        assert len(err.strip().splitlines()) == 1 and str(path) in err and words in err, err
