"""A conversion is reused only for the input it was made from: the converter's check and the run's ``OUT/data``.

Each test changes the source on disk (or a setting) the way a user does between two runs, and
checks that the old records are not taken for the new input, and that the reason is named.
"""
import json
import os

import numpy as np
import pytest
from PIL import Image

import kaggle_utils.data as kd
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.data import convert
from kaggle_utils.run.data import converted_source, scan_test_ids

SIZE = 8


def _image(path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((SIZE, SIZE, 3), value, np.uint8)).save(path)


@pytest.fixture
def images(tmp_path):
    """``train/{a,b}/`` with 4 images each, ``test/`` with 3."""
    for c, name in enumerate("ab"):
        for i in range(4):
            _image(tmp_path / "train" / name / f"{name}{i}.png", 100 * c + 10 * i)
    for i in range(3):
        _image(tmp_path / "test" / f"t{i}.png", 200 + i)
    return tmp_path


def _changes(root, out, **settings) -> str:
    train, test = kd.class_folders(root / "train"), kd.image_folder(root / "test")
    return "; ".join(convert.conversion_changes(out, train, test, **{"image_size": SIZE, **settings}))


def test_the_converter_names_every_change_of_files_and_settings(images, tmp_path):
    out = tmp_path / "records"
    assert _changes(images, out) == "no earlier conversion"
    convert.convert_source(kd.class_folders(images / "train"), out, image_size=SIZE,
                           test=kd.image_folder(images / "test"))
    assert _changes(images, out) == ""  # the same input, as the next run sees it
    assert "--val-fraction changed 0.15 -> 0.5" in _changes(images, out, val_fraction=0.5)
    assert "--seed changed 0 -> 1" in _changes(images, out, seed=1)
    assert "--image-size changed 8 -> 16" in _changes(images, out, image_size=16)
    assert "--skip-errors changed False -> True" in _changes(images, out, skip_errors=True)

    replaced = images / "train" / "a" / "a0.png"
    stat = replaced.stat()
    _image(replaced, 77)
    os.utime(replaced, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a later save, whatever the clock's tick
    assert "train source's files changed: as many images (8)" in _changes(images, out)
    _image(images / "train" / "c" / "c0.png", 150)  # a class folder added
    _image(images / "test" / "t9.png", 250)
    both = _changes(images, out)
    assert "train source's files changed: 8 -> 9 images" in both and "test source's files changed: 3 -> 4" in both


def test_an_edited_csv_is_a_change_though_no_image_file_is(images, tmp_path):
    rows = [f"{name}/{name}{i},{name}" for name in "ab" for i in range(4)]
    table = images / "train.csv"
    table.write_text("id,label\n" + "\n".join(rows) + "\n")
    source = kd.csv_source(table, images / "train", id_column="id", label_column="label")
    out = tmp_path / "records"
    convert.convert_source(source, out, image_size=SIZE)
    table.write_text("id,label\n" + "\n".join(rows[:-1] + ["b/b3,a"]) + "\n")  # one label corrected
    edited = kd.csv_source(table, images / "train", id_column="id", label_column="label")
    assert convert.conversion_changes(out, source, image_size=SIZE) == []
    assert convert.conversion_changes(out, edited, image_size=SIZE) == [
        "the train source's ids, labels or class names changed"]


def _run_config(images, **changes) -> TrainConfig:
    return TrainConfig().replace(source=str(images / "train"), test_source=str(images / "test"), image_size=SIZE,
                                 **changes)


def test_the_runs_data_is_reconverted_when_the_source_changed_and_reused_when_not(images, tmp_path, capsys):
    run = tmp_path / "run"
    data = converted_source(_run_config(images), run)
    assert "converting 8 images" in capsys.readouterr().out
    written = {p: p.stat().st_mtime_ns for p in data.rglob("*.tfrec")}
    converted_source(_run_config(images), run)  # e.g. --resume
    assert capsys.readouterr().out == "" and {p: p.stat().st_mtime_ns for p in data.rglob("*.tfrec")} == written

    for i in range(2):  # a class folder added, a test image added, and another validation share asked for
        _image(images / "train" / "c" / f"c{i}.png", 150 + i)
    _image(images / "test" / "t9.png", 250)
    converted_source(_run_config(images, val_fraction=0.5), run)
    log = capsys.readouterr().out
    assert "converting 10 images" in log and "8 -> 10 images" in log and "--val-fraction changed 0.15 -> 0.5" in log
    info = convert.read_conversion_info(data)
    assert info["class_names"] == ["a", "b", "c"]
    assert info["counts"]["val"] == sum(min(round(0.5 * n), n - 1) for n in (4, 4, 2))
    test_ids = scan_test_ids(kd.list_tfrecords(data / "test"))
    assert sorted(test_ids) == sorted(p.stem for p in (images / "test").iterdir())


def test_a_test_image_the_conversion_skipped_is_refused(images, tmp_path):
    (images / "test" / "t5.png").write_bytes(b"not an image")
    with pytest.raises(ConfigError, match=r"holds 3 of the 4 images of image folder .*test \(1 unreadable"):
        converted_source(_run_config(images, skip_errors=True), tmp_path / "run")


def test_a_refused_run_leaves_the_folders_run_and_its_data_as_they_were(images, tmp_path):
    """RUN holds a run on source A; a run on source B into RUN is refused, and RUN/data is still A's."""
    from kaggle_utils import run
    from kaggle_utils.outdir import OutDirError
    from kaggle_utils.run.data import STAGED

    out = tmp_path / "run"
    first = _run_config(images)
    converted_source(first, out)
    (out / "config.json").write_text(json.dumps({"config": first.to_dict()}))
    (out / "history.csv").write_text("epoch,step\n")
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    other = tmp_path / "other"
    for c, name in enumerate("xyz"):
        for i in range(6):
            _image(other / name / f"{name}{i}.png", 40 * c + 5 * i)
    second = TrainConfig().replace(source=str(other), image_size=SIZE, model="test_efficientnet", batch_size=8,
                                   steps=1)
    with pytest.raises(OutDirError, match="holds a run with another config"):
        run.train(second, out, progress=False)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert not (out / STAGED).exists()
