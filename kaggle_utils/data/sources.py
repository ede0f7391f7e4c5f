"""Image-classification data that is not in TFRecords: class folders, CSV + images, tensorflow-datasets.

A :class:`Source` is what a run needs before it reads a pixel (:func:`~.pipeline.load_source` reads one).
Everything that can be checked without decoding is checked when it is made, with a :class:`DataError` naming
the file, CSV line (the header is line 1) and column.
"""

import csv
import os
from dataclasses import dataclass, field

import numpy as np

from .tfhost import tensorflow_on_host
from .tfrecords import DataError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")


@dataclass(frozen=True, eq=False)
class Source:
    """Ids and labels of one split's examples: files (``paths``) or a tfds split (``tfds``). ``labels``: None (a
    test set), int32 ``[N]``, or float32 ``[N, C]`` multi-hot (``multi_label``); ``id_column`` / ``label_column``:
    the competition's column names, for the submission."""
    description: str
    ids: list[str]
    labels: np.ndarray | None
    class_names: list[str] | None
    id_column: str = "id"
    label_column: str | None = "label"
    multi_label: bool = False
    paths: list[str] | None = None
    tfds: dict | None = field(default=None, repr=False)  # builder, records (images not decoded)

    def __post_init__(self):
        if self.labels is not None and len(self.labels) != len(self.ids):
            raise ValueError(f"{self.description}: ids and labels differ in length")
        if not self.ids:
            raise DataError(f"{self.description}: no images found")

    def __repr__(self):
        kind = "multi-label" if self.multi_label else "labeled" if self.labeled else "unlabeled"
        classes = f", {self.num_classes} classes" if self.class_names is not None else ""
        return f"Source({self.description}: {self.num_examples} {kind} examples{classes})"

    @property
    def num_examples(self) -> int:
        return len(self.ids)

    @property
    def labeled(self) -> bool:
        return self.labels is not None

    @property
    def num_classes(self) -> int | None:
        return None if self.class_names is None else len(self.class_names)

    def indices(self, process_index: int = 0, process_count: int = 1) -> np.ndarray:
        """The examples process ``process_index`` of ``process_count`` reads (every k-th)."""
        if process_count < 1 or not 0 <= process_index < process_count:
            raise ValueError(f"process_index={process_index} is not in [0, process_count={process_count})")
        if self.num_examples < process_count:
            raise DataError(f"{self.description}: {self.num_examples} example(s) cannot be split over "
                            f"{process_count} processes")
        return np.arange(self.num_examples)[process_index::process_count]


# ---------- Folders
def _images_in(folder: str, *, nested: bool = False) -> list[str]:
    """The images in ``folder``; ``nested``: in its sub-folders too (hidden ones left out), as torchvision's
    ImageFolder. A link to a folder is refused: it can lead out of the source (``dir -> ..``) or loop."""
    found = []
    for here, folders, files in os.walk(folder):
        folders[:] = [d for d in folders if not d.startswith(".")] if nested else []
        for name in folders:
            link = os.path.join(here, name)
            if os.path.islink(link):
                raise DataError(f"{link} is a link to the folder {os.path.realpath(link)}: a class folder's images are "
                                "taken from inside it only (a link can lead out of the source, or loop); copy or link "
                                "the images themselves instead")
        found += [os.path.join(here, f) for f in files
                  if f.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(here, f))]
    return sorted(found)


def _check_folder(root: str) -> str:
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise DataError(f"image folder {root!r} does not exist or is not a folder")
    return root


def _check_unique(ids: list[str], where: list[str], what: str) -> None:
    first: dict[str, str] = {}
    for id_, place in zip(ids, where):
        if id_ in first:
            raise DataError(f"{what}: duplicate id {id_!r} ({first[id_]} and {place})")
        first[id_] = place


def class_folders(root) -> Source:
    """``root/<class>/<image>``: one sub-folder per class (images in its sub-folders included), class names
    sorted; an empty class folder is an error."""
    root = _check_folder(root)
    classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)) and not d.startswith("."))
    if not classes:
        raise DataError(f"{root}: no class sub-folders (expected {root}/<class>/<image>)")
    paths, labels = [], []
    for label, name in enumerate(classes):
        real = os.path.realpath(os.path.join(root, name))
        if os.path.commonpath([real, os.path.realpath(root)]) == real:
            raise DataError(f"class folder {os.path.join(root, name)} is a link to {real}, which holds the source "
                            "itself (a loop)")
        found = _images_in(os.path.join(root, name), nested=True)
        if not found:
            raise DataError(f"class folder {os.path.join(root, name)!r} holds no images "
                            f"({', '.join(IMAGE_EXTENSIONS)})")
        paths += found
        labels += [label] * len(found)
    ids = [os.path.splitext(os.path.relpath(p, root))[0].replace(os.sep, "/") for p in paths]
    return Source(f"class folders {root}", ids=ids, labels=np.asarray(labels, np.int32), class_names=classes,
                  paths=paths)


def image_folder(root, *, id_column: str = "id", class_names: list[str] | None = None) -> Source:
    """``root/<image>`` without labels (a test set); ids are the file names without extension."""
    root = _check_folder(root)
    paths = _images_in(root)
    ids = [os.path.splitext(os.path.basename(p))[0] for p in paths]
    _check_unique(ids, paths, root)
    return Source(f"image folder {root}", ids=ids, labels=None, class_names=class_names,
                  id_column=id_column, label_column=None, paths=paths)


# ---------- CSV + images
def _read_csv(path: str, columns: list[str]) -> list[tuple[int, dict]]:
    if not os.path.isfile(path):
        raise DataError(f"CSV file {path!r} does not exist")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in columns if c not in header]
        if missing:
            raise DataError(f"{path}: no column {', '.join(map(repr, missing))} (columns: {', '.join(header)})")
        return [(reader.line_num, row) for row in reader]


class MissingImageError(DataError):
    """A CSV row whose image file is not in the image folder (often: the wrong folder given)."""


def _find_image(image_dir: str, value: str, where: str) -> str:
    """The file a CSV id names: ``image_dir/value`` as is, or with an image extension when it has none. An id
    that reaches outside ``image_dir`` (``../x``, an absolute path) is another folder's image, read as if it were
    this one's: refused."""
    root = os.path.realpath(image_dir)
    if os.path.isabs(value) or os.path.commonpath([root, os.path.realpath(os.path.join(root, value))]) != root:
        raise DataError(f"{where}: id {value!r} points outside the image folder {image_dir}: ids name files "
                        "inside it (give --image-dir the folder that holds them)")
    base = os.path.join(image_dir, value)
    if value.lower().endswith(IMAGE_EXTENSIONS):
        candidates, tried = [base], ""
    else:
        candidates = [base + e for e in IMAGE_EXTENSIONS] + [base + e.upper() for e in IMAGE_EXTENSIONS]
        tried = f" with any of the extensions {', '.join(IMAGE_EXTENSIONS)} (or upper case)"
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise MissingImageError(f"{where}: no image file {base}{tried}")


# what a missing value becomes when a table is written by pandas or a database: never a class name
MISSING_MARKERS = frozenset({"nan", "NaN", "NAN", "<NA>", "None", "null", "NULL"})


def _parse_labels(rows, path: str, column: str, class_names):
    """Per row a list of class indices; class names from the data unless given."""
    tokens = []
    kinds: dict[str, str] = {}
    for line, row in rows:
        where = f"{path}, line {line}, column {column!r}"
        found = (row[column] or "").split()
        if not found:
            raise DataError(f"{where}: empty label")
        missing = [t for t in found if t in MISSING_MARKERS]
        if missing and (class_names is None or missing[0] not in class_names):
            raise DataError(f"{where}: label {missing[0]!r} is a missing value (pandas writes NaN as 'nan'), not a "
                            "class: fill in the label or drop the row")
        for token in found:
            kinds.setdefault("integer" if token.lstrip("-").isdigit() else "name", f"line {line} ({token!r})")
        if len(kinds) > 1:
            raise DataError(f"{path}, column {column!r}: mixed label kinds, class names and integers "
                            f"(integer at {kinds['integer']}, name at {kinds['name']})")
        tokens.append((where, found))
    integers = kinds and next(iter(kinds)) == "integer"
    if class_names is None:
        seen = {t for _, found in tokens for t in found}
        class_names = [str(i) for i in range(max(map(int, seen)) + 1)] if integers else sorted(seen)
    index = {name: i for i, name in enumerate(class_names)}

    def label_of(token: str, where: str) -> int:
        label = int(token) if integers else index.get(token)
        if label is None or not 0 <= label < len(class_names):
            raise DataError(f"{where}: label {token!r} is not in the {len(class_names)} classes "
                            f"({', '.join(class_names[:10])}{', ...' if len(class_names) > 10 else ''})")
        return label

    return [[label_of(token, where) for token in found] for where, found in tokens], list(class_names)


def csv_source(csv_path, image_dir, *, id_column: str, label_column: str | None = None,
               class_names: list[str] | None = None, multi_label: bool | None = None) -> Source:
    """A CSV of ids (file names, with or without extension, in ``image_dir``) and, unless ``label_column=None``,
    labels: class names or integers (not both); ``class_names`` fixes the classes (else the sorted names found,
    or ``0..max``). A row with several labels (split on whitespace) makes the source multi-label, float32
    ``[N, C]`` (also ``multi_label=True``); ``multi_label=False`` refuses such a row."""
    csv_path, image_dir = os.fspath(csv_path), _check_folder(image_dir)
    columns = [id_column] + ([label_column] if label_column else [])
    rows = _read_csv(csv_path, columns)
    paths, ids = [], []
    for line, row in rows:
        where = f"{csv_path}, line {line}, column {id_column!r}"
        value = (row[id_column] or "").strip()
        if not value:
            raise DataError(f"{where}: empty id")
        paths.append(_find_image(image_dir, value, where))
        ids.append(value)
    _check_unique(ids, [f"line {line}" for line, _ in rows], f"{csv_path}, column {id_column!r}")
    labels = None
    if label_column is not None:
        per_row, class_names = _parse_labels(rows, csv_path, label_column, class_names)
        several = [line for (line, _), found in zip(rows, per_row) if len(found) > 1]
        if multi_label is False and several:
            raise DataError(f"{csv_path}, line {several[0]}, column {label_column!r}: several labels in a "
                            "single-label source (multi_label=False)")
        multi_label = bool(several) if multi_label is None else multi_label
        if multi_label:
            labels = np.zeros((len(rows), len(class_names)), np.float32)
            for i, found in enumerate(per_row):
                labels[i, found] = 1.0
        else:
            labels = np.asarray([found[0] for found in per_row], np.int32)
    return Source(f"CSV {csv_path}", ids=ids, labels=labels, class_names=class_names,
                  id_column=id_column, label_column=label_column, multi_label=bool(multi_label), paths=paths)


# ---------- tensorflow-datasets
def tfds_source(name: str, split: str = "train", *, data_dir=None, label_key: str | None = "label") -> Source:
    """A tfds split, prepared before in ``data_dir``, read offline; labels read without decoding the images; ids
    ``<split>-<record index>`` (tfds splits have no common id feature)."""
    tensorflow_on_host()  # first: tensorflow_datasets imports TensorFlow, which must not see the accelerators
    import tensorflow_datasets as tfds  # only for a tfds source: a slow import

    try:
        builder = tfds.builder(name, data_dir=None if data_dir is None else os.fspath(data_dir))
    except Exception as err:  # tfds raises DatasetNotFoundError and others
        raise DataError(f"tfds dataset {name!r}: {err}") from None
    if not builder.is_prepared():
        raise DataError(f"tfds dataset {name!r} is not prepared in {builder.data_dir}: prepare it once where the "
                        f"internet is on (tfds.builder({name!r}, data_dir=...).download_and_prepare()) and attach "
                        "that folder")
    features = builder.info.features
    if "image" not in features:
        raise DataError(f"tfds dataset {name!r} has no feature 'image' (features: {', '.join(features)})")
    class_names, labels = None, None
    if label_key is not None:
        if label_key not in features or not hasattr(features[label_key], "names"):
            raise DataError(f"tfds dataset {name!r}: {label_key!r} is not a class-label feature "
                            f"(features: {', '.join(features)})")
        class_names = list(features[label_key].names)
    try:
        records = builder.as_dataset(split=split, shuffle_files=False, decoders={"image": tfds.decode.SkipDecoding()})
    except Exception as err:
        raise DataError(f"tfds dataset {name!r}: split {split!r}: {err}") from None
    if label_key is not None:
        labels = np.fromiter(records.map(lambda ex: ex[label_key]).as_numpy_iterator(), np.int64).astype(np.int32)
        count = len(labels)
    else:
        count = int(records.reduce(np.int64(0), lambda n, _: n + 1))
    return Source(f"tfds:{name}/{split}", ids=[f"{split}-{i}" for i in range(count)], labels=labels,
                  class_names=class_names, label_column=label_key, tfds={"builder": builder, "records": records})
