"""Sample data in the flower competition's exact layout (TFRecords, file names, features, test ids), made from
what is installed: scikit-learn's 1797 real 8x8 digits upscaled (``"digits"``, so a model learns on a CPU), or
104 classes of coloured shapes (``"synthetic"``). The hidden test labels go to ``test_labels.csv``.
"""

import colorsys
import csv
import glob
import hashlib
import json
import os
from dataclasses import asdict, dataclass

import numpy as np

from .tfhost import tf
from .tfrecords import SPLITS, TFRECORD_SUFFIXES, atomic_output_path, write_split

SYNTHETIC_NUM_CLASSES = 104
MANIFEST = "sample_manifest.json"
TEST_LABELS = "test_labels.csv"


@dataclass(frozen=True)
class SampleDataset:
    root: str
    source: str
    image_size: int
    num_classes: int
    class_names: list[str]
    split_dirs: dict[str, str]
    counts: dict[str, int]
    test_labels: dict[str, int]  # id -> class, hidden in the competition


def _digits(image_size: int, num_examples: int | None):
    from sklearn.datasets import load_digits  # here: scikit-learn is needed (and imported) only for this sample

    digits = load_digits()
    count = len(digits.images) if num_examples is None else num_examples
    if not 0 < count <= len(digits.images):
        raise ValueError(f"num_examples must be in [1, {len(digits.images)}] for source='digits', got {count}")
    grey = np.round(digits.images[:count] * (255.0 / 16.0))[..., np.newaxis].astype(np.float32)
    resized = tf.image.resize(grey, [image_size, image_size], "bilinear").numpy()  # bilinear, then grey -> RGB
    images = np.repeat(np.clip(np.round(resized), 0, 255).astype(np.uint8), 3, axis=-1)
    return images, digits.target[:count].astype(np.int64), [str(d) for d in range(10)]


def _synthetic(image_size: int, num_examples: int | None, seed: int):
    """Coloured shapes: class = (shape kind, size/frequency, colour), with jitter and noise."""
    count = 4 * SYNTHETIC_NUM_CLASSES if num_examples is None else num_examples
    if count < 1:
        raise ValueError(f"num_examples must be >= 1, got {count}")
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % SYNTHETIC_NUM_CLASSES
    rng.shuffle(labels)
    yy, xx = np.mgrid[0:image_size, 0:image_size] / image_size
    images = np.empty((count, image_size, image_size, 3), np.uint8)
    for i, label in enumerate(labels):
        kind, variant = label % 4, (label // 4) % 3
        foreground = np.array(colorsys.hsv_to_rgb(label / SYNTHETIC_NUM_CLASSES, 0.8, 0.95)) * 255
        background = np.array(colorsys.hsv_to_rgb(((label * 37) % SYNTHETIC_NUM_CLASSES) / SYNTHETIC_NUM_CLASSES,
                                                  0.4, 0.5)) * 255
        cx, cy = 0.5 + rng.uniform(-0.15, 0.15, 2)
        radius = 0.18 + 0.08 * variant
        distance = np.hypot(xx - cx, yy - cy)
        mask = (distance < radius,  # disc
                np.maximum(abs(xx - cx), abs(yy - cy)) < radius,  # square
                np.sin(2 * np.pi * (3 + 2 * variant) * (xx + cx)) > 0,  # stripes
                abs(distance - radius) < 0.06)[kind]  # ring
        shade = 0.75 + 0.25 * (xx + yy) / 2  # a gradient, so JPEGs are not trivially flat
        pixels = np.where(mask[..., None], foreground, background) * shade[..., None]
        pixels += rng.normal(0, 6, pixels.shape)
        images[i] = np.clip(pixels, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int64), [f"class_{c:03d}" for c in range(SYNTHETIC_NUM_CLASSES)]


def _load_existing(root: str, params: dict) -> SampleDataset | None:
    try:
        with open(os.path.join(root, MANIFEST)) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    if manifest.get("params") != params or not all(os.path.exists(os.path.join(root, p)) for p in manifest["files"]):
        return None
    split_dirs = {split: os.path.join(root, split) for split in SPLITS}  # the folder may have moved
    return SampleDataset(**{**manifest["dataset"], "root": root, "split_dirs": split_dirs})


def make_sample_dataset(out_dir: str | os.PathLike, source: str = "digits", *, image_size: int = 64,
                        num_examples: int | None = None, split_fractions=(0.70, 0.15, 0.15),
                        num_files: tuple[int, int, int] = (4, 2, 2), seed: int = 0, quality: int = 95,
                        overwrite: bool = False) -> SampleDataset:
    """Write a sample dataset (default: all 1797 digits, or 4 synthetic images per class), shuffled with ``seed``
    and split; a call with the same arguments reuses the files."""
    if source not in ("digits", "synthetic"):
        raise ValueError(f"source must be 'digits' or 'synthetic', got {source!r}")
    if image_size < 8:
        raise ValueError(f"image_size must be >= 8, got {image_size}")
    root = os.path.abspath(os.fspath(out_dir))
    params = dict(source=source, image_size=image_size, num_examples=num_examples,
                  split_fractions=list(split_fractions), num_files=list(num_files), seed=seed, quality=quality)
    existing = _load_existing(root, params)
    if existing is not None:
        return existing
    stale = sorted(path for split in SPLITS for suffix in TFRECORD_SUFFIXES
                   for path in glob.glob(os.path.join(root, split, "*" + suffix)))
    if stale and not overwrite:
        raise FileExistsError(
            f"{root} already holds {len(stale)} TFRecord file(s) written with other settings (e.g. "
            f"{stale[0]}); pass overwrite=True to replace them or choose another out_dir")
    for path in stale:
        os.unlink(path)

    if source == "digits":
        images, labels, class_names = _digits(image_size, num_examples)
    else:
        images, labels, class_names = _synthetic(image_size, num_examples, seed)
    order = np.random.default_rng(seed).permutation(len(images))
    fractions, count = split_fractions, len(images)
    if len(fractions) != 3 or min(fractions) <= 0 or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"split_fractions must be three positive numbers summing to 1, got {fractions}")
    train, val = int(round(count * fractions[0])), int(round(count * fractions[1]))
    if min(train, val, count - train - val) < 1:
        raise ValueError(f"{count} examples are too few for three splits {fractions}")
    bounds = np.cumsum([0, train, val, count - train - val])
    files, split_dirs, counts, test_labels = [], {}, {}, {}
    for split, start, stop, n_files in zip(SPLITS, bounds[:-1], bounds[1:], num_files):
        chosen = order[start:stop]
        folder = os.path.join(root, split)
        target = {"labels": labels[chosen]}
        if split == "test":
            target = {"ids": [hashlib.sha1(f"{source}-{i}".encode()).hexdigest()[:9] for i in chosen]}  # like Kaggle's
            test_labels = {id_: int(labels[i]) for id_, i in zip(target["ids"], chosen)}
        paths = write_split(folder, images[chosen], num_files=min(n_files, len(chosen)), quality=quality, **target)
        files += [os.path.relpath(p, root) for p in paths]
        split_dirs[split], counts[split] = folder, len(chosen)

    with atomic_output_path(os.path.join(root, TEST_LABELS)) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "label"])
        writer.writerows(test_labels.items())
    dataset = SampleDataset(root=root, source=source, image_size=image_size, num_classes=len(class_names),
                            class_names=class_names, split_dirs=split_dirs, counts=counts, test_labels=test_labels)
    manifest = {"params": params, "files": files + [TEST_LABELS], "dataset": asdict(dataset)}
    with atomic_output_path(os.path.join(root, MANIFEST)) as tmp, open(tmp, "w") as f:
        json.dump(manifest, f, indent=1)
    return dataset
