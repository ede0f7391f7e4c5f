"""How the job stops (issue 26, the weak list): one named line and an exit code, never a traceback,
and before any work where the input alone decides it."""
import errno
import json
import os

import numpy as np
import pytest
from PIL import Image

from kaggle_utils import checkpoint, job, run
from kaggle_utils.config import TrainConfig
from kaggle_utils.data import write_split

from fs_helpers import read_only_folder
from job_helpers import TEST_MODEL


def run_main(argv, capsys):
    """(exit code, stderr) of the job run in this process."""
    with pytest.raises(SystemExit) as exit_info:
        job.main(argv)
    return exit_info.value.code, capsys.readouterr().err


def _no_work(*args, **kwargs):
    raise AssertionError("the command started its work before refusing")


# --------------------------------------------------------------------------- output place


def test_predict_onto_a_file_is_refused_before_predicting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "load_run", _no_work)
    (tmp_path / "taken").write_text("x")
    code, err = run_main(["predict", "--checkpoint", str(tmp_path), "--data-dir", str(tmp_path),
                          "--out", str(tmp_path / "taken")], capsys)
    assert code == 2 and f"--out {tmp_path / 'taken'} is a file, not a folder" in err, err
    assert (tmp_path / "taken").read_text() == "x"


def test_predict_into_a_read_only_folder_is_refused_before_predicting(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "load_run", _no_work)
    with read_only_folder(tmp_path / "ro") as ro:
        code, err = run_main(["predict", "--checkpoint", str(tmp_path), "--data-dir", str(tmp_path),
                              "--out", str(ro / "sub")], capsys)
    assert code == 2 and f"--out {ro / 'sub'} is not writable ({ro} is not writable)" in err, err


# --------------------------------------------------------------------------- stops mid-run


def test_ctrl_c_says_where_the_run_can_go_on_from(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    checkpoint.save(out / "last.msgpack", {"x": [0]}, manifest={"step": 7})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "train", interrupted)
    code, err = run_main(["train", "--out", str(out)], capsys)
    assert code == 130 and "Traceback" not in err
    assert err.strip().splitlines() == [f"python -m kaggle_utils train: interrupted; {out}/last.msgpack (step 7) is "
                                        "intact: the same command with --resume continues from it"]
    code, err = run_main(["train", "--out", str(tmp_path / "new")], capsys)
    assert code == 130 and "stopped before its first checkpoint: run the same command again" in err


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_full_disk_mid_run_is_one_line_and_the_last_checkpoint_loads(sample, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    real_fsync = os.fsync

    def disk_full_after_the_first_checkpoint(fd):
        if (out / "last.json").exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", disk_full_after_the_first_checkpoint)
    code, err = run_main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--steps", "4",
                          "--steps-per-epoch", "2", "--checkpoint-every", "2", "--no-progress", "--out", str(out)],
                         capsys)
    monkeypatch.undo()
    step = json.loads((out / "last.json").read_text())["step"]
    assert code == 2 and "Traceback" not in err, err
    line, = err.strip().splitlines()
    assert line.startswith(f"python -m kaggle_utils train: error: {out}/") and "No space left on device [ENOSPC]" in line
    assert f"{out}/last.msgpack (step {step}) is intact: free space, then the same command with --resume" in line
    assert "state" in checkpoint.load(out / "last.msgpack")
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


# --------------------------------------------------------------------------- values and data the run cannot use


def _records(root, train_labels, val_labels, test_ids=None):
    images = np.zeros((len(train_labels), 16, 16, 3), np.uint8)
    write_split(root / "train", images, labels=train_labels)
    write_split(root / "val", images[:len(val_labels)], labels=val_labels)
    if test_ids is not None:
        (root / "test").mkdir()
        if test_ids:
            write_split(root / "test", images[:len(test_ids)], ids=test_ids)
    return root


def _class_folders(root, per_class):
    for name, count in per_class.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(root / name / f"{i}.png")
    return root


@pytest.mark.parametrize("flags, message", [
    (["--monitor", "val_loss", "--monitor-mode", "max"],
     "--monitor val_loss --monitor-mode max: lower val_loss is better, so max would keep the worst epoch"),
    (["--monitor", "val_acc", "--monitor-mode", "min"],
     "--monitor val_acc --monitor-mode min: higher val_acc is better"),
    (["--class-names", "cat", "--class-names", "dog", "--class-names", "cat"], "--class-names repeats 'cat'"),
])
def test_values_no_run_can_use_are_refused_before_the_folder_is_made(tmp_path, capsys, monkeypatch, flags, message):
    monkeypatch.setattr(run, "open_data", _no_work)
    code, err = run_main(["train", *flags, "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_user_metrics_may_be_monitored_either_way(tmp_path, monkeypatch):
    from kaggle_utils.run.resolve import check_config
    from kaggle_utils.train import make_task

    task = make_task("softmax").with_metric("error", lambda sums: 1.0)
    check_config(TrainConfig().replace(monitor="val_error", monitor_mode="min"), task)


@pytest.mark.parametrize("layout, message", [
    (dict(train_labels=[0] * 8, val_labels=[0] * 4), "the train and val splits hold one class only (label 0)"),
    (dict(train_labels=[0, 1] * 4, val_labels=[0, 1], test_ids=[]), "has a test/ folder with no TFRecords"),
])
def test_data_a_run_would_waste_itself_on_is_refused(tmp_path, capsys, monkeypatch, layout, message):
    monkeypatch.setattr(run, "build_training", _no_work)
    data = _records(tmp_path / "data", **layout)
    code, err = run_main(["train", "--data-dir", str(data), "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_source_too_small_for_a_val_split_names_val_fraction_not_data_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "open_data", _no_work)
    source = _class_folders(tmp_path / "src", {"a": 1, "b": 1})
    code, err = run_main(["train", "--source", str(source), "--image-size", "16", "--out", str(tmp_path / "out")],
                         capsys)
    assert code == 2 and "--val-fraction 0.15 gives no validation image" in err and "--data-dir" not in err, err
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- sources read as the files say


def test_images_in_a_class_folders_sub_folders_are_read_like_torchvisions_image_folder(tmp_path):
    from kaggle_utils.data import class_folders

    root = _class_folders(tmp_path / "src", {"a": 2, "b": 1})
    _class_folders(root / "a", {"extra": 2})  # a/extra/0.png, a/extra/1.png
    source = class_folders(root)
    assert sorted(source.ids) == ["a/0", "a/1", "a/extra/0", "a/extra/1", "b/0"]
    assert [int(source.labels[source.ids.index(i)]) for i in ("a/extra/0", "b/0")] == [0, 1]


def test_a_folder_link_inside_a_class_folder_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    """``dir -> ..`` inside a class folder turned 16 images into 656 taken from outside the source, exit 0."""
    monkeypatch.setattr(run, "build_training", _no_work)
    root = _class_folders(tmp_path / "src", {"a": 5, "b": 5})
    (root / "a" / "dir").symlink_to("..")
    code, err = run_main(["train", "--source", str(root), "--image-size", "16", "--model", TEST_MODEL,
                          "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{root / 'a' / 'dir'} is a link to the folder {tmp_path / 'src'}" in err
    assert not (tmp_path / "out").exists()


def _record_file(path, records):
    import tensorflow as tf

    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options="GZIP" if path.suffix == ".gz" else None) as writer:
        for record in records:
            writer.write(record)
    if path.suffix == ".gz":
        path.rename(path.with_suffix(""))
    return path.with_suffix("") if path.suffix == ".gz" else path


@pytest.mark.parametrize("fault, message", [
    ("bytes class", "01-16x16-2.tfrec, record 1: record is not a tf.train.Example with the expected feature types"),
    ("gzip", "00-16x16-4.tfrec, record 0: a gzip-compressed file, which TFRecord readers here do not decompress"),
])
def test_a_record_of_another_type_or_a_gzip_file_is_one_line_naming_file_and_record(tmp_path, capsys, monkeypatch,
                                                                                     fault, message):
    import tensorflow as tf
    from kaggle_utils.data import encode_jpeg, serialize_example

    monkeypatch.setattr(run, "build_training", _no_work)
    data = _records(tmp_path / "data", train_labels=[0, 1] * 2, val_labels=[0, 1])
    jpeg = encode_jpeg(np.zeros((16, 16, 3), np.uint8))
    if fault == "gzip":
        train = data / "train" / "00-16x16-4.tfrec"
        _record_file(train.with_name(train.name + ".gz"), [serialize_example(jpeg, label=i % 2) for i in range(4)])
    else:
        bytes_class = tf.train.Example(features=tf.train.Features(feature={
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[jpeg])),
            "class": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"1"]))})).SerializeToString()
        _record_file(data / "train" / "01-16x16-2.tfrec", [serialize_example(jpeg, label=0), bytes_class])
    code, err = run_main(["train", "--data-dir", str(data), "--model", TEST_MODEL, "--out", str(tmp_path / "out")],
                         capsys)
    error, *hint = err.strip().splitlines()  # the one line, and the job's --skip-errors hint where skipping fixes it
    assert code == 2 and message in error and hint in ([], ["(--skip-errors skips unreadable records, counts them "
                                                           "and names them in the log)"]), err
    assert not (tmp_path / "out").exists()


def _csv(path, rows):
    path.write_text("id,label\n" + "".join(f"{i},{label}\n" for i, label in rows))
    return path


@pytest.mark.parametrize("image_id", ["../outside", "OUTSIDE_ABS"])
def test_a_csv_id_reaching_outside_the_image_folder_is_refused(tmp_path, image_id):
    from kaggle_utils.data import DataError, csv_source

    _class_folders(tmp_path, {"images": 1})
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "outside.png")
    image_id = str(tmp_path / "outside") if image_id == "OUTSIDE_ABS" else image_id
    table = _csv(tmp_path / "train.csv", [("0", "cat"), (image_id, "dog")])
    with pytest.raises(DataError, match=rf"train.csv, line 3, column 'id': id '{image_id}' points outside the image "
                                        rf"folder"):
        csv_source(table, tmp_path / "images", id_column="id", label_column="label")


def test_a_nan_label_is_a_missing_value_not_a_class(tmp_path):
    from kaggle_utils.data import DataError, csv_source

    _class_folders(tmp_path, {"images": 2})
    table = _csv(tmp_path / "train.csv", [("0", "cat"), ("1", "nan")])
    with pytest.raises(DataError, match=r"line 3, column 'label': label 'nan' is a missing value"):
        csv_source(table, tmp_path / "images", id_column="id", label_column="label")
    named = csv_source(table, tmp_path / "images", id_column="id", label_column="label", class_names=["cat", "nan"])
    assert named.labels.tolist() == [0, 1]  # a class the user named so is one


# --------------------------------------------------------------------------- files that differ from their manifest


def _saved_then_changed(tmp_path):
    """Ported-like weights of the test model, changed after their manifest was written."""
    import jax
    from kaggle_utils.efficientnet import create_model
    from kaggle_utils.variable_trees import init_variables

    path = tmp_path / "weights.msgpack"
    variables = init_variables(create_model(TEST_MODEL), jax.ShapeDtypeStruct((1, 16, 16, 3), np.float32))
    checkpoint.save(path, variables, manifest={"model": TEST_MODEL})
    changed = jax.tree.map(lambda v: np.asarray(v) + 1, variables)
    checkpoint.save(tmp_path / "other.msgpack", changed)
    (tmp_path / "other.msgpack").replace(path)
    return path


def test_a_checkpoint_that_differs_from_its_manifest_is_refused_unless_accepted_knowingly(tmp_path):
    path = _saved_then_changed(tmp_path)
    with pytest.raises(checkpoint.ChangedCheckpointError, match=r"weights.msgpack differs from its manifest "
                                                                r"weights.json \(sha256"):
        checkpoint.load(path)
    with pytest.warns(RuntimeWarning, match=r"weights.msgpack differs from its manifest weights.json \(sha256"):
        assert "params" in checkpoint.load(path, accept_changed=True)


def test_weights_that_differ_from_their_manifest_are_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(run, "open_data", _no_work)
    path = _saved_then_changed(tmp_path)
    code, err = run_main(["train", "--weights", str(path), "--model", TEST_MODEL, "--out", str(tmp_path / "out")],
                         capsys)
    assert code == 2 and f"--weights: checkpoint {path} differs from its manifest weights.json" in err, err


# --------------------------------------------------------------------------- the other command lines


@pytest.mark.parametrize("argv, message", [
    (["tf_efficientnetv2_s", "--random", "--num-classes", "-1"], "--num-classes: -1 is not in [1, inf]"),
    (["tf_efficientnetv2_s", "--random", "--verify-size", "0"], "--verify-size: 0 is not in [1, inf]"),
])
def test_porter_values_are_usage_errors(tmp_path, capsys, argv, message):
    from weights_port.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(tmp_path / "w.msgpack")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "Traceback" not in err, err


def test_porter_on_a_truncated_safetensors_file_names_it(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file
    from weights_port.__main__ import main

    ckpt = tmp_path / "model.safetensors"
    save_file({"conv_stem.weight": torch.zeros(8, 3, 3, 3)}, str(ckpt))
    ckpt.write_bytes(ckpt.read_bytes()[:-100])
    assert main([TEST_MODEL, "--checkpoint", str(ckpt), "--out", str(tmp_path / "w.msgpack")]) == 2
    err = capsys.readouterr().err
    assert f"cannot read {ckpt} as a safetensors file" in err and not (tmp_path / "w.msgpack").exists()


def test_convert_quality_outside_1_to_100_is_a_usage_error(tmp_path, capsys):
    from kaggle_utils.data.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(tmp_path), "--quality", "150", "--out", str(tmp_path / "records")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--quality: 150 is not in [1, 100]" in err, err


@pytest.mark.parametrize("name, content, key", [
    ("kernel-metadata.json", {"id": "a/b", "title": "a title", "kernel_type": ["notebook"]}, "kernel_type"),
    ("nb.ipynb", {"cells": [], "metadata": 1}, "metadata"),
    ("nb.ipynb", {"cells": [{"cell_type": "code", "source": [1]}], "metadata": {}}, "cells[0].source"),
])
def test_lint_names_a_metadata_value_of_the_wrong_json_type(tmp_path, capsys, name, content, key):
    from kaggle_utils.publish import main

    (tmp_path / name).write_text(json.dumps(content))
    assert main(["lint", str(tmp_path / name)]) == 1
    assert f"{tmp_path / name}: {key}: " in capsys.readouterr().err
