"""Any source -> TFRecords in the competition's layout, so it runs at TFRecord speed and through the job.

``DIR/{train,val,test}/NN-SxS-COUNT.tfrec`` and ``DIR/class_names.json`` (classes, columns, counts, the images'
own size and the input's fingerprint). The validation split is stratified; the conversion is staged in ``DIR`` and
swapped in whole, so a re-run never mixes old and new shards.

Each image is stored as JPEG at ``S`` x ``S``, every split alike: its shorter side resized to ``S``, then the centre
square (the aspect ratio kept). Crops happen on read, so ``S`` should leave them real pixels: the job stores at
:func:`storage_size`, the images' own (median shorter) side between the training size and twice it, and a crop
then cuts the photo rather than re-enlarging a shrunk copy (squashed to the training size, a random-resized crop
of a 150 px photo trained at 112 px scored below no crop at all: bench/README.md, "Fine-tuning real photos").
The centre square, not padding: timm's evaluation crop cuts the same centre, a pad's flat bars would enter every
crop and the BatchNorm statistics as content no test photo has, and what is lost is the long side's ends
(an eighth of each end at 4:3).

The fingerprint says what a conversion was made from, so that converted records are reused only for the same
input: per source, digests of its ``files`` (path, size, mtime: a ``stat`` each) and ``content`` (ids, labels,
class names, columns), its example count, and the settings.

Multi-label data are split by iterative stratification (Sechidis, Tsoumakas and Vlahavas, ECML PKDD 2011),
scikit-multilearn's algorithm (order 1) in numpy, seeded (CV folds use it too): each subset ``j`` wants ``p_j * n_c``
examples of class ``c``; the class with the fewest examples left (ties at random) has each placed where that class
is most wanted (ties: most examples wanted, then at random), lowering that subset's wants for every class of the
example; examples with no class go where most examples are wanted.
"""

import dataclasses
import hashlib
import inspect
import json
import os
import shutil
import tempfile
from typing import Iterator, Sequence

import numpy as np

from .pipeline import load_source, source_records
from .sources import Source, class_folders, csv_source, image_folder, tfds_source
from .tfhost import tf
from .transforms import CenterCrop
from .tfrecords import SPLITS, DataError, atomic_output_path, count_from_name, write_shards

INFO_FILE = "class_names.json"
_READ_BATCH = 64
FIT = "centre-square"  # how an image becomes S x S: shorter side to S, the centre square (fingerprinted)
SIDES_SAMPLED = 256  # images whose size decides a source's own side: evenly spaced, so the same every time
MAX_STORE_FACTOR = 2  # storage_size's cap: twice the training size


def source_from_spec(spec: str, *, image_dir=None, id_column: str = "id", label_column: str | None = "label",
                     tfds_data_dir=None, labeled: bool = True, class_names: list[str] | None = None) -> Source:
    """``tfds:NAME[:SPLIT]``, a ``.csv`` (images in ``image_dir``, default its folder), or a folder (class folders
    when ``labeled``, else test images); ``id_column`` / ``label_column`` are the submission's."""
    label_column = label_column if labeled else None
    if spec.lower().endswith(".csv"):
        folder = image_dir if image_dir is not None else os.path.dirname(os.path.abspath(spec))
        return csv_source(spec, folder, id_column=id_column, label_column=label_column, class_names=class_names)
    if spec.startswith("tfds:"):
        name, _, split = spec[len("tfds:"):].partition(":")
        source = tfds_source(name, split or ("train" if labeled else "test"), data_dir=tfds_data_dir,
                             label_key="label" if labeled else None)
    else:
        source = class_folders(spec) if labeled else image_folder(spec, class_names=class_names)
    return dataclasses.replace(source, id_column=id_column, label_column=label_column)


# ---------- Sizes
def source_sides(source: Source, limit: int = SIDES_SAMPLED) -> np.ndarray:
    """The shorter side of up to ``limit`` of ``source``'s images, evenly spaced (a JPEG's from its header); an
    image that does not read counts as 0 (the conversion names it)."""
    picked = np.unique(np.linspace(0, source.num_examples - 1, min(limit, source.num_examples)).round().astype(int))

    def side(name, index, payload):
        encoded = tf.io.read_file(payload) if source.paths is not None else payload
        shape = tf.cond(tf.io.is_jpeg(encoded), lambda: tf.io.extract_jpeg_shape(encoded)[:2],
                        lambda: tf.shape(tf.io.decode_image(encoded, channels=3, expand_animations=False))[:2])
        return tf.reduce_min(shape)

    sides = source_records(source, picked).map(side, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return np.fromiter(sides.ignore_errors().as_numpy_iterator(), np.int64)


def source_side(source: Source) -> int:
    """The median shorter side of ``source``'s images (:func:`source_sides`)."""
    sides = source_sides(source)
    if not len(sides):
        raise DataError(f"{source.description}: none of its images could be read to find their size")
    return int(np.median(sides))


def storage_size(image_size: int, side: int) -> int:
    """The side a source is stored at to train at ``image_size``: the images' own ``side``, at least ``image_size``
    (smaller photos are enlarged once, at conversion) and at most ``MAX_STORE_FACTOR`` times it (a crop of a
    quarter of the image still holds the training size in real pixels; more costs bytes and decoding)."""
    return int(min(max(side, image_size), MAX_STORE_FACTOR * image_size))


def one_tag_rows(source: Source) -> Source:
    """A single-label source as a multi-label one (``--task multilabel`` on one class per image): multi-hot rows of
    one tag each."""
    rows = np.zeros((source.num_examples, len(source.class_names)), np.float32)
    rows[np.arange(source.num_examples), source.labels] = 1.0
    return dataclasses.replace(source, labels=rows, multi_label=True)


# ---------- Splits
def _most(wants: np.ndarray, then: np.ndarray, rng: np.random.Generator) -> int:
    """The index of the largest ``wants``; ties broken by the largest ``then``, then at random."""
    best = np.flatnonzero(wants == wants.max())
    if len(best) > 1:
        best = best[then[best] == then[best].max()]
    return int(best[0] if len(best) == 1 else rng.choice(best))


def iterative_stratification(labels: np.ndarray, proportions: Sequence[float], seed: int = 0) -> np.ndarray:
    """The subset (0..len(proportions)-1) of each example of multi-hot ``labels`` ``[N, C]``; ``proportions``: each
    subset's share (normalised), e.g. ``[1] * k`` for k folds; ``seed`` orders the examples and breaks every tie."""
    present = np.asarray(labels) > 0.5
    if present.ndim != 2:
        raise ValueError(f"labels must be multi-hot [N, C], got shape {present.shape}")
    shares = np.asarray(proportions, np.float64)
    if shares.ndim != 1 or len(shares) < 2 or np.any(shares < 0) or shares.sum() <= 0:
        raise ValueError(f"proportions must be two or more shares >= 0, not all 0; got {list(proportions)}")
    shares = shares / shares.sum()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(present))
    counts = present.sum(0).astype(np.int64)  # examples of each class not placed yet
    wanted = np.outer(shares, counts)  # [subsets, C]: examples of each class each subset still wants
    room = shares * len(present)  # examples each subset still wants
    subset = np.full(len(present), -1, np.int64)
    while np.any(counts > 0):
        rarest = np.flatnonzero(counts == counts[counts > 0].min())
        label = int(rng.choice(rarest))
        for i in order[(subset[order] < 0) & present[order, label]]:
            j = _most(wanted[:, label], room, rng)
            subset[i] = j
            wanted[j] -= present[i]
            room[j] -= 1
            counts -= present[i]
    for i in order[subset[order] < 0]:  # no class at all
        j = _most(room, room, rng)
        subset[i] = j
        room[j] -= 1
    return subset


def stratified_split(labels: np.ndarray, val_fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) example numbers in random order: ``round(val_fraction * n_c)`` of class c to val, one at least
    kept in train; multi-hot ``labels`` by iterative stratification."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    rng = np.random.default_rng(seed)
    if np.ndim(labels) == 2:
        subset = iterative_stratification(labels, [1 - val_fraction, val_fraction], seed) if val_fraction else \
            np.zeros(len(labels), np.int64)
        return rng.permutation(np.flatnonzero(subset == 0)), rng.permutation(np.flatnonzero(subset == 1))
    train, val = [], []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_val = min(int(round(val_fraction * len(members))), len(members) - 1)
        val.append(members[:n_val])
        train.append(members[n_val:])
    return rng.permutation(np.concatenate(train)), rng.permutation(np.concatenate(val))


# ---------- Fingerprints
def _digest(parts: Iterator[str | bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")  # a separator, so that ("ab", "c") and ("a", "bc") differ
    return h.hexdigest()


def _file_stats(source: Source) -> Iterator[str]:
    """Path, size and modification time of each file the source reads (a tfds split: its dataset's files)."""
    if source.tfds is not None:
        gfile = tf.io.gfile
        folder = source.tfds["builder"].data_dir
        for path in sorted(gfile.glob(os.path.join(folder, "*"))):
            stat = gfile.stat(path)
            yield f"{path}|{stat.length}|{stat.mtime_nsec}"
        return
    for path in source.paths:
        try:
            stat = os.stat(path)
        except OSError as err:
            raise DataError(f"{source.description}: cannot read {path}: {err.strerror or err}") from None
        yield f"{path}|{stat.st_size}|{stat.st_mtime_ns}"


def _content(source: Source) -> Iterator[str | bytes]:
    yield from (source.id_column, str(source.label_column), str(source.multi_label))
    yield from source.class_names or ()
    yield "ids"
    yield from source.ids
    if source.labels is not None:
        labels = np.ascontiguousarray(source.labels)
        yield f"labels {labels.dtype.str} {labels.shape}"
        yield labels.tobytes()


def source_fingerprint(source: Source) -> dict:
    """``{"source", "examples", "files", "content"}`` of ``source`` as it is now."""
    return {"source": source.description, "examples": source.num_examples,
            "files": _digest(_file_stats(source)), "content": _digest(_content(source))}


def conversion_fingerprint(train: Source, test: Source | None, **settings) -> dict:
    """Everything a conversion of ``train`` (and ``test``) with ``settings`` (its keyword arguments) depends on."""
    return {"train": source_fingerprint(train), "test": None if test is None else source_fingerprint(test),
            "settings": dict(sorted(settings.items()))}


def _source_change(role: str, old: dict | None, new: dict | None) -> str | None:
    if old == new:
        return None
    if old is None or new is None:
        return f"a {role} source was added: {new['source']}" if old is None else f"the {role} source was dropped"
    if old["source"] != new["source"]:
        return f"the {role} source is another one: {old['source']} -> {new['source']}"
    if old["examples"] != new["examples"]:
        return f"the {role} source's files changed: {old['examples']} -> {new['examples']} images"
    if old["files"] != new["files"]:
        return (f"the {role} source's files changed: as many images ({new['examples']}), but a file was replaced, "
                "renamed or modified")
    return f"the {role} source's ids, labels or class names changed"


def fingerprint_changes(old: dict | None, new: dict) -> list[str]:
    """Why a conversion fingerprinted ``old`` is not one of the input fingerprinted ``new`` (settings named as the
    converter's flags); empty if it is."""
    if not old:
        return ["it records no fingerprint of its input (written by an older version)"]
    changes = [_source_change(role, old.get(role), new.get(role)) for role in ("train", "test")]
    before, after = old.get("settings", {}), new["settings"]
    changes += [f"images stored as {after.get(name)} (shorter side, then the centre square), not "
                f"{before.get(name) or 'squashed to a square (an older version)'}" if name == "fit" else
                f"--{name.replace('_', '-')} changed {before.get(name)} -> {after.get(name)}"
                for name in sorted(set(before) | set(after)) if before.get(name) != after.get(name)]
    return [c for c in changes if c]


# ---------- Conversion
def _write_split(source: Source, indices: np.ndarray, folder: str, *, image_size: int, shards: int, quality: int,
                 skip_errors: bool) -> list[str]:
    """``indices`` of ``source``, in order, as about ``shards`` files."""
    dataset = load_source(source, indices=indices, batch_size=_READ_BATCH, crop=CenterCrop(image_size, crop_pct=1.0),
                          with_ids=True, skip_errors=skip_errors)
    examples = ((batch["image"][i], batch["label"][i] if source.labeled else None, batch["id"][i])
                for batch in dataset for i in np.flatnonzero(batch["mask"]))
    return write_shards(folder, examples, count=len(indices), num_files=min(shards, len(indices)),
                        image_size=image_size, quality=quality)


def _existing_splits(out_dir: str) -> list[str]:
    return [s for s in SPLITS if os.path.exists(os.path.join(out_dir, s))]


def convert_source(train: Source, out_dir, *, image_size: int, val_fraction: float = 0.15, shards: int = 16,
                   test: Source | None = None, seed: int = 0, quality: int = 95, overwrite: bool = False,
                   skip_errors: bool = False, side: int | None = None) -> dict:
    """Write ``train`` (split into train/val) and ``test`` as TFRecords of ``image_size`` x ``image_size`` images
    (the module docstring), at most ``shards`` files per split, swapped into ``out_dir`` whole; returns the info
    written. ``side``: ``train``'s own (:func:`source_side`), recorded as ``source_side`` (found if not given)."""
    if not train.labeled:
        raise DataError(f"{train.description} has no labels: give it as the test source (--test)")
    if test is not None and test.labeled:
        raise DataError(f"the test source {test.description} has labels: give an unlabeled folder or CSV")
    if shards < 1 or image_size < 1:
        raise ValueError(f"shards and image_size must be >= 1, got {shards} and {image_size}")
    out_dir = os.path.abspath(os.fspath(out_dir))
    os.makedirs(out_dir, exist_ok=True)
    if _existing_splits(out_dir) and not overwrite:
        raise FileExistsError(f"{out_dir} already holds {', '.join(_existing_splits(out_dir))}: pass overwrite=True "
                              "(--overwrite) to replace them, or choose another --out")
    # taken before reading: a file that changes during the conversion makes the next check redo it
    fingerprint = conversion_fingerprint(train, test, image_size=image_size, val_fraction=val_fraction,
                                         shards=shards, seed=seed, quality=quality, skip_errors=skip_errors, fit=FIT)
    side = source_side(train) if side is None else side
    train_idx, val_idx = stratified_split(train.labels, val_fraction, seed)
    jobs = [("train", train, train_idx), ("val", train, val_idx)]
    if test is not None:
        jobs.append(("test", test, np.arange(test.num_examples)))
    staging = tempfile.mkdtemp(prefix=".convert-staging-", dir=out_dir)
    try:
        counts = {}
        for split, source, indices in jobs:
            if len(indices):
                folder = os.path.join(staging, split)
                os.makedirs(folder)
                files = _write_split(source, indices, folder, image_size=image_size, shards=shards, quality=quality,
                                     skip_errors=skip_errors)
                counts[split] = sum(count_from_name(f) for f in files)
        info = {"class_names": train.class_names, "multi_label": train.multi_label, "id_column": (test or train).id_column,
                "label_column": train.label_column, "image_size": image_size, "source_side": side, "fit": FIT,
                "counts": counts,
                "source": train.description, "test_source": None if test is None else test.description,
                "fingerprint": fingerprint}
        with atomic_output_path(os.path.join(staging, INFO_FILE)) as tmp, open(tmp, "w") as f:
            json.dump(info, f, indent=1)
        old = tempfile.mkdtemp(prefix=".convert-old-", dir=out_dir)  # the old splits aside, the staged ones in
        for split in _existing_splits(out_dir):
            os.replace(os.path.join(out_dir, split), os.path.join(old, split))
        for split in _existing_splits(staging):
            os.replace(os.path.join(staging, split), os.path.join(out_dir, split))
        os.replace(os.path.join(staging, INFO_FILE), os.path.join(out_dir, INFO_FILE))
        shutil.rmtree(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return info


def convert_test_split(test: Source, out_dir, *, image_size: int, quality: int = 95) -> list[str]:
    """``test`` alone as ``out_dir/test/`` TFRecords, stored as :func:`convert_source` does, so that a trained run
    predicts it through the same resize, JPEG and crop."""
    if test.labeled:
        raise DataError(f"the test source {test.description} has labels: give an unlabeled folder or CSV")
    folder = os.path.join(os.fspath(out_dir), "test")
    os.makedirs(folder, exist_ok=True)
    return _write_split(test, np.arange(test.num_examples), folder, image_size=image_size, shards=1, quality=quality,
                        skip_errors=False)


# what convert_source's output depends on besides its sources, with its defaults
_DEFAULT_SETTINGS = {name: parameter.default for name, parameter in inspect.signature(convert_source).parameters.items()
                     if name in ("val_fraction", "shards", "seed", "quality", "skip_errors")} | {"fit": FIT}


def conversion_changes(out_dir, train: Source, test: Source | None = None, **settings) -> list[str]:
    """Why ``out_dir`` does not hold what ``convert_source(train, out_dir, test=test, **settings)`` would write now
    (empty if it does)."""
    try:
        info = read_conversion_info(out_dir)
    except DataError:
        return ["no earlier conversion"]
    settings = {**_DEFAULT_SETTINGS, **settings}
    return fingerprint_changes(info.get("fingerprint"), conversion_fingerprint(train, test, **settings))


def read_conversion_info(out_dir) -> dict:
    """The ``class_names.json`` a conversion wrote (``multi_label`` absent: single-label)."""
    path = os.path.join(os.fspath(out_dir), INFO_FILE)
    if not os.path.isfile(path):
        raise DataError(f"{path} does not exist: {out_dir} was not written by kaggle_utils.data convert")
    with open(path) as f:
        return json.load(f)
