"""A run's data: the TFRecord folder it reads (``--data-dir``, ``--source`` converted, or the sample), checked.

Every check the submission depends on runs here, before any training: splits present, labels in
``[0, classes)``, the task fitting the labels (multi-label records need ``--task multilabel``), the test
split's ids present, unique and as many as its file names promise, and a converted ``--source`` made from
the files as they are now. A conversion is staged in ``OUT/.data.staging`` and becomes ``OUT/data`` only
once the run is accepted (:func:`commit_conversion`), so a refused run leaves the folder as it was.
"""
import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import jax
import numpy as np
from jax.experimental import multihost_utils

from ..config import ConfigError, TrainConfig
from ..data import ExampleFields, Source, count_data_items, list_tfrecords, make_sample_dataset, scan_labels
from ..data.convert import (INFO_FILE, conversion_changes, convert_source, read_conversion_info, source_from_spec,
                            one_tag_rows, source_side, storage_size, stratified_split)
from ..data.tfrecords import RecordIndex, scan_records
from ..data.sources import MissingImageError

SAMPLE = "sample:digits"  # the data_dir of a run on the embedded sample, as config.json records it
SAMPLE_IMAGE_SIZE = 32
STAGED = ".data.staging"  # OUT/.data.staging: a conversion not yet accepted as OUT/data


@dataclasses.dataclass(frozen=True)
class RunData:
    root: Path
    splits: dict[str, list[str]]  # train / val / test -> TFRecord files (test may be empty)
    stored_size: int  # image side in the records
    num_train: int
    max_label: int
    description: str  # where the data came from, for config.json
    class_names: tuple[str, ...] = ()  # submission labels by index (empty: the index)
    columns: tuple[str, str] = ("id", "label")  # the submission's id and label columns
    multi_label: bool = False  # records with a ``labels`` list (several classes per image), read as multi-hot rows
    source_side: int | None = None  # the converted images' own (median shorter) side; None: unknown (records given)
    unlabelled: int = 0  # multi-label train + val records with no class at all
    # split -> the (file, index) records of its files it reads (a cross-validation fold, load_dataset's select=);
    # absent: all of them
    select: dict[str, tuple[tuple[str, int], ...]] = dataclasses.field(default_factory=dict)
    fields: ExampleFields | None = None  # the training records' own fields: a teacher's (run.teacher)
    teaching: dict | None = None  # what --teacher and --pseudo-labels added: the plan line, config.json, metrics.json


def _sync(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


# --------------------------------------------------------------------------- where the records are


@contextlib.contextmanager
def data_root(config: TrainConfig, out_dir: str | Path | None) -> Iterator[Path]:
    """The folder of TFRecords a run reads: ``--data-dir``, the digits sample written to a temporary folder, or
    ``--source`` converted (staged in ``out_dir``: removed on the way out unless committed)."""
    if config.data.source is not None:
        try:
            yield converted_source(config, out_dir, stage=True)
        finally:
            if jax.process_index() == 0:
                shutil.rmtree(Path(out_dir) / STAGED, ignore_errors=True)
    elif config.data.data_dir not in (None, SAMPLE):
        yield Path(config.data.data_dir)
    else:
        size = config.model.image_size or SAMPLE_IMAGE_SIZE
        with tempfile.TemporaryDirectory(prefix="kaggle_utils_sample_") as tmp:
            if jax.process_index() == 0:
                print(f"no --data-dir: training on the embedded digits sample ({size}x{size}) in {tmp}")
            make_sample_dataset(tmp, source="digits", image_size=size)
            yield Path(tmp)


@contextlib.contextmanager
def run_data(config: TrainConfig, out_dir: str | Path, data: RunData | None = None) -> Iterator[RunData]:
    """``data`` as given, or the config's data opened and checked in :func:`data_root` (``out_dir`` stages a
    ``--source`` conversion)."""
    if data is not None:
        yield data
        return
    with data_root(config, out_dir) as root:
        yield open_data(config, root)


def converted_source(config: TrainConfig, out_dir: str | Path, *, stage: bool = False) -> Path:
    """``--source`` as competition-layout TFRecords in ``OUT/data``, converted again only when its fingerprint
    (:mod:`kaggle_utils.data.convert`) changed; with ``stage``, into ``OUT/.data.staging`` until committed."""
    data = config.data
    if config.model.image_size is None:
        raise ConfigError("--source needs --image-size: the size the images are stored at (e.g. 256 to train at 224)")
    target, staged = Path(out_dir) / "data", Path(out_dir) / STAGED
    columns = dict(id_column=data.id_column or "id", label_column=data.label_column or "label")
    train = source_from_spec(data.source, image_dir=data.image_dir, tfds_data_dir=data.tfds_data_dir, **columns)
    test = _test_source(data, columns) if data.test_source else None
    if config.task.task == "multilabel" and train.labeled and not train.multi_label:
        train = one_tag_rows(train)  # one class per image, trained as multi-label: a row of one tag each
    check_task_fits(config, train.multi_label, f"--source {data.source}")
    _check_val_split(train, data)
    if jax.process_index() == 0:  # the one that decides and writes: the others could see a half-swapped folder
        shutil.rmtree(staged, ignore_errors=True)  # left by a run that was refused or killed
        side = source_side(train)
        size = store_size(config, side)
        settings = dict(image_size=size, val_fraction=data.val_fraction, seed=config.seed, skip_errors=data.skip_errors)
        changes = conversion_changes(target, train, test, **settings)
        if changes:
            written = staged if stage else target
            print(f"--source {data.source}: converting {train.num_examples} images to {size}px TFRecords (their "
                  f"shorter side to {size}, the centre square; their own side {side} px) in {written} "
                  f"({'; '.join(changes)})")
            convert_source(train, written, test=test, overwrite=True, side=side, **settings)
    _sync("kaggle_utils converted_source")  # the others read what process 0 wrote (a shared filesystem)
    folder = staged if stage and staged.is_dir() else target
    if test is not None:  # a submission needs a row per test image: --skip-errors must not have left one out
        converted = read_conversion_info(folder)["counts"].get("test", 0)
        if converted != test.num_examples:
            raise ConfigError(f"{folder}/test holds {converted} of the {test.num_examples} images of "
                              f"{test.description} ({test.num_examples - converted} unreadable, skipped by "
                              "--skip-errors): a submission needs a row for each; fix or remove those files")
    return folder


def store_size(config: TrainConfig, side: int) -> int:
    """The side a ``--source`` is stored at: ``--store-size``, else :func:`~kaggle_utils.data.convert.storage_size` of
    the images' own ``side`` for the larger of the training and evaluation sizes."""
    given = config.data.store_size
    if given != "auto":
        return given
    return storage_size(max(config.model.image_size, config.data.eval_image_size or 0), side)


def commit_conversion(data: RunData, out_dir: str | Path) -> RunData:
    """Moves a staged conversion into ``OUT/data`` (the run was accepted); ``data`` then reads it there."""
    target, staged = Path(out_dir) / "data", Path(out_dir) / STAGED
    if data.root.resolve() != staged.resolve():
        return data
    if jax.process_index() == 0:
        old = Path(out_dir) / ".data.replaced"
        shutil.rmtree(old, ignore_errors=True)
        if target.exists():
            target.rename(old)
        staged.rename(target)
        shutil.rmtree(old, ignore_errors=True)
    _sync("kaggle_utils commit_conversion")
    staged_at, target_at = os.path.abspath(staged), os.path.abspath(target)

    def moved(file: str) -> str:  # a staged file where it lives now
        file = os.path.abspath(file)
        return target_at + file[len(staged_at):] if file.startswith(staged_at + os.sep) else file

    return dataclasses.replace(data, root=target, splits={k: [moved(f) for f in v] for k, v in data.splits.items()},
                               select={k: tuple((moved(f), i) for f, i in v) for k, v in data.select.items()},
                               fields=data.fields and data.fields.moved(moved))


def _check_val_split(train: Source, data) -> None:
    """Refuses a --source whose classes are too small for --val-fraction to give any validation image."""
    if not train.labeled or len(stratified_split(train.labels, data.val_fraction, 0)[1]):
        return  # an unlabeled source is refused by the conversion itself
    where = f"--source {data.source}: --val-fraction {data.val_fraction} gives no validation image"
    if train.multi_label:
        raise ConfigError(f"{where} of its {train.num_examples} multi-label images: add images, or raise "
                          "--val-fraction")
    raise ConfigError(f"{where} (the largest of its {train.num_classes} classes has "
                      f"{int(np.bincount(train.labels).max())} image(s), and each class keeps one for training): add "
                      "images, or raise --val-fraction")


def _test_source(data, columns: dict) -> Source:
    """``--test-source`` as a source; a missing image says which flag names the test images' folder."""
    try:
        return source_from_spec(data.test_source, image_dir=data.test_image_dir or data.image_dir, labeled=False,
                                tfds_data_dir=data.tfds_data_dir, **columns)
    except MissingImageError as err:
        if data.test_image_dir is not None:
            raise
        raise MissingImageError(f"{err} (test images in a folder of their own: give it as --test-image-dir)") from None


def find_splits(data_dir: str | Path, *, need_labels: bool = True) -> dict[str, list[str]]:
    """``{split: files}`` of ``data_dir``; train/val required for training, test for predicting."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"--data-dir {data_dir} is not a folder")
    splits = {}
    for split in ("train", "val", "test"):
        folder = data_dir / split
        try:
            splits[split] = list_tfrecords(folder) if folder.is_dir() else []
        except FileNotFoundError:
            splits[split] = []
        if split == "test" and need_labels and folder.is_dir() and not splits[split]:
            raise ConfigError(f"--data-dir {data_dir} has a test/ folder with no TFRecords: the run would end with "
                              f"no submission; put the test records in {folder}/, or remove the empty folder")
        if (split != "test" if need_labels else split == "test") and not splits[split]:
            raise ConfigError(f"--data-dir {data_dir} has no {split}/ split: expected TFRecords in {folder}/ "
                              f"(the competition layout: {data_dir}/{{train,val,test}}/*.tfrec)")
    return splits


_SIZE_IN_NAME = re.compile(r"-(\d+)x(\d+)-")


def infer_image_size(files: list[str]) -> int | None:
    """The ``SxS`` of Kaggle's file names (``00-512x512-798.tfrec`` -> 512), if they carry one."""
    sizes = {m.group(1) for m in map(_SIZE_IN_NAME.search, (Path(f).name for f in files)) if m}
    return int(sizes.pop()) if len(sizes) == 1 else None


# --------------------------------------------------------------------------- what the records hold


def check_task_fits(config: TrainConfig, multi_label: bool, where: str) -> None:
    """Refuses a task that does not fit the labels of ``where`` (a source or records folder), naming the flag to use:
    a softmax over multi-hot rows would train on a fraction of each image's classes."""
    task = config.task.task
    if multi_label and task != "multilabel":
        raise ConfigError(f"{where} is multi-label (several classes per image), which --task {task} cannot train: "
                          "use --task multilabel")
    if not multi_label and task == "multilabel":
        raise ConfigError(f"--task multilabel needs multi-label records, but {where} holds one class per image: use "
                          "--task softmax (or focal), or give the images as --source (read as one tag per image)")


def _label_range(config: TrainConfig, splits: dict, stored: int) -> tuple[bool, int, dict]:
    """(multi-label?, the largest label, {split: labels}) of the train and val splits, every label checked."""
    multi_label = scan_records(splits["train"][:1]).multi_label  # multi-label records are the kit's own: one file tells
    if multi_label:
        found = np.concatenate(scan_records(splits["train"] + splits["val"]).label_sets)
        low, top = int(found.min()), int(found.max())
        width = max(config.model.num_classes or 0, top + 1)
        seen = {split: scan_labels(splits[split], image_size=stored, skip_errors=config.data.skip_errors,
                                   multi_label_classes=width) for split in ("train", "val")} if low >= 0 else {}
        where = "train or val"
    else:
        seen = {split: scan_labels(splits[split], image_size=stored, skip_errors=config.data.skip_errors)
                for split in ("train", "val")}
        low = min(int(v.min()) for v in seen.values() if v.size)
        where = next(s for s, v in seen.items() if v.size and v.min() == low)
        top = max(int(v.max()) for v in seen.values() if v.size)
    if low < 0:
        raise ConfigError(f"the {where} split holds label {low}: labels must be in [0, classes)")
    return multi_label, top, seen


def record_names(records: RecordIndex) -> tuple[np.ndarray, bool]:
    """``(names, by id?)``: how a CV's folds, a teacher's rows and its student name labelled records: their ``id``
    feature where every one has a unique one, else where they lie, ``split/file#index``."""
    ids = records.ids
    if all(ids) and len(set(ids)) == len(ids):
        return np.asarray(ids), True
    where = [f"{Path(f).parent.name}/{Path(f).name}#{i}" for f, i in zip(records.files, records.indices)]
    return np.array(where), False


def scan_test_ids(files: list[str]) -> list[str]:
    """The test split's ids in order, read without decoding images; checked as a submission needs them."""
    index = scan_records(files)
    missing = next((r for r, i in enumerate(index.ids) if not i), None)
    if missing is not None:
        raise ConfigError(f"{index.files[missing]}, record {index.indices[missing]}: the test split has no 'id' "
                          "feature; submission.csv needs one id per test image")
    expected = count_data_items(files)
    if len(index) != expected:
        raise ConfigError(f"the test split holds {len(index)} records but its file names promise {expected}: "
                          "a submission would miss or repeat images")
    ids, counts = np.unique(index.ids, return_counts=True)
    if (counts > 1).any():
        repeated = [str(i) for i in ids[counts > 1][:5]]
        raise ConfigError(f"test ids repeat ({int((counts - 1).sum())} duplicates, e.g. {repeated}): refusing to "
                          "train for an ambiguous submission")
    return list(index.ids)


def open_data(config: TrainConfig, root: str | Path) -> RunData:
    """The run's data in ``root``, checked: splits, stored size, labels in range, test ids usable."""
    root = Path(root)
    splits = find_splits(root)
    stored = infer_image_size(splits["train"]) or config.model.image_size
    if stored is None:
        raise ConfigError(f"--image-size is needed: the file names in {root}/train carry no SxS size")
    multi_label, top, seen = _label_range(config, splits, stored)
    if config.model.num_classes is not None and config.model.num_classes <= top:
        where = "train or val" if multi_label else next(s for s, v in seen.items() if v.size and v.max() == top)
        raise ConfigError(f"--num-classes {config.model.num_classes} is too small: the {where} split holds label "
                          f"{top} (needs at least {top + 1})")
    if config.data.data_dir in (None, SAMPLE) and config.data.source is None:
        description = SAMPLE
    else:  # a staged conversion is recorded where it will live once the run is accepted
        description = str((root.parent / "data" if root.name == STAGED else root).resolve())
    where = (f"--source {config.data.source}" if config.data.source else
             "the embedded digits sample (no --data-dir)" if description == SAMPLE else f"--data-dir {description}")
    check_task_fits(config, multi_label, where)
    if top == 0 and (config.model.num_classes or 1) == 1:  # a softmax over one class has loss 0 and learns nothing
        raise ConfigError(f"the train and val splits hold one class only (label 0): --task {config.task.task} over one "
                          "class learns nothing; check the data (--data-dir / --source), or pass --num-classes N "
                          "if the other classes are only absent from these splits")
    if splits["test"]:
        scan_test_ids(splits["test"])
    info = read_conversion_info(root) if (root / INFO_FILE).is_file() else {}
    unlabelled = sum(int((~(v > 0.5).any(-1)).sum()) for v in seen.values()) if multi_label else 0
    return RunData(root=root, splits=splits, stored_size=stored, num_train=count_data_items(splits["train"]),
                   max_label=top, description=description, multi_label=multi_label,
                   source_side=info.get("source_side"), unlabelled=unlabelled, **submission_labels(config, root))


def named_classes(names) -> tuple[str, ...]:
    """``names``, or () where they are only the indices ("0", "1", ...: integer labels), which name nothing."""
    names = tuple(names)
    return () if names == tuple(str(i) for i in range(len(names))) else names


def submission_labels(config: TrainConfig, root: Path) -> dict:
    """The class names and id / label columns of a run on ``root``: given, else recorded by its conversion
    (``class_names.json``), else the defaults; a flag that disagrees with the record is refused, naming both."""
    info = read_conversion_info(root) if (root / INFO_FILE).is_file() else {}
    where = f"{root / INFO_FILE} (written by the conversion of {info.get('source')})"
    data = config.data
    recorded_names = tuple(info.get("class_names") or ())
    names = _agree("--class-names", tuple(data.class_names),
                   named_classes(recorded_names) if data.class_names else recorded_names, where)
    id_column = _agree("--id-column", data.id_column, info.get("id_column"), where)
    label_column = _agree("--label-column", data.label_column, info.get("label_column"), where)
    return {"class_names": tuple(names or ()), "columns": (id_column or "id", label_column or "label")}


def _agree(flag: str, given, recorded, where: str):
    """The given value, else the recorded one; both and different: the submission would be mislabelled, refused."""
    if given and recorded and given != recorded:
        show = (lambda v: ", ".join(v[:6]) + (", ..." if len(v) > 6 else "")) if isinstance(given, tuple) else repr
        raise ConfigError(f"{flag} {show(given)} disagrees with {where}, which records {show(recorded)}: "
                          f"leave {flag} out (the record is used) or give the same")
    return given or recorded
