"""Writing TFRecords in the competition's layout, ``NN-SxS-COUNT.tfrec`` shards of JPEG records, each written
beside its final name and renamed into place (a crash leaves no half-written shard for a ``*.tfrec`` glob).
"""

import contextlib
import itertools
import math
import os
import tempfile
from typing import Iterable, Iterator, Sequence

import numpy as np

from .tfhost import tf


@contextlib.contextmanager
def atomic_output_path(path: str | os.PathLike) -> Iterator[str]:
    """A temporary path beside ``path`` (``.NAME.*.partial``), renamed onto ``path`` on success."""
    path = os.fspath(path)
    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".partial", dir=folder)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def encode_jpeg(image: np.ndarray, quality: int = 95) -> bytes:
    """uint8 [H, W, 3] -> JPEG bytes (TensorFlow's libjpeg, as the competition files)."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"encode_jpeg needs a uint8 [H, W, 3] image, got {image.dtype} {image.shape}")
    return tf.io.encode_jpeg(image, quality=quality).numpy()


def serialize_example(image_jpeg: bytes, *, label: int | None = None, labels: Sequence[int] | None = None,
                      id: bytes | str | None = None) -> bytes:
    """One ``tf.train.Example`` in the competition's format: image + class or labels (multi-label) (+ id), or
    image + id (test records)."""
    if label is not None and labels is not None:
        raise ValueError("give label= (single-label) or labels= (multi-label), not both")
    if label is None and labels is None and id is None:
        raise ValueError("give label= or labels= (train/val records, with id= where known) or id= (test records)")
    feature = {"image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image_jpeg]))}
    if labels is not None:
        if not len(labels):
            raise ValueError("a multi-label example needs at least one class in labels=")
        feature["labels"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(c) for c in labels]))
    elif label is not None:
        feature["class"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))
    if id is not None:
        id_bytes = id.encode("utf-8") if isinstance(id, str) else bytes(id)
        feature["id"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[id_bytes]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_tfrecord(path: str | os.PathLike, records: Iterable[bytes]) -> int:
    """Write serialized records with ``tf.io.TFRecordWriter``, atomically; returns the count."""
    count = 0
    with atomic_output_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
        for count, record in enumerate(records, 1):
            writer.write(record)
    return count


def shard_name(index: int, image_size: int, count: int) -> str:
    """Kaggle's file name: ``NN-SxS-COUNT.tfrec`` (the count lets readers skip counting)."""
    return f"{index:02d}-{image_size}x{image_size}-{count}.tfrec"


def write_split(split_dir: str | os.PathLike, images: np.ndarray, *, labels: Sequence[int] | np.ndarray | None = None,
                ids: Sequence[bytes | str] | None = None, num_files: int = 1, quality: int = 95) -> list[str]:
    """Square uint8 images [N, S, S, 3] as ``num_files`` shards (all but the last of ``ceil(N / num_files)``);
    ``labels``: class indices ``[N]`` or multi-hot rows ``[N, C]`` (multi-label records)."""
    images = np.asarray(images)
    if images.ndim != 4 or images.shape[1] != images.shape[2] or images.shape[3] != 3:
        raise ValueError(f"write_split needs square uint8 images [N, S, S, 3], got {images.shape}")
    targets = labels if labels is not None else ids
    if (labels is None) == (ids is None) or len(targets) != len(images):
        raise ValueError("give labels= or ids= (one of them), one per image")
    if not 1 <= num_files <= max(1, len(images)):
        raise ValueError(f"num_files={num_files} must be between 1 and the number of images ({len(images)})")
    labels, ids = ([None] * len(images) if x is None else x for x in (labels, ids))
    records = (serialize_example(encode_jpeg(image, quality), **target_of(label, id_))
               for image, label, id_ in zip(images, labels, ids))
    return write_shards(split_dir, records, per_file=math.ceil(len(images) / num_files), image_size=images.shape[1])


def target_of(label=None, id=None) -> dict:
    """``serialize_example``'s target keywords: ``label=`` (an int), ``labels=`` (a multi-hot row's classes), ``id=``."""
    if label is None:
        return {"id": id}
    row = np.asarray(label)
    target = {"labels": np.flatnonzero(row > 0.5)} if row.ndim == 1 else {"label": int(row)}
    return target if id is None else {**target, "id": id}


def write_shards(split_dir, records: Iterable[bytes], *, per_file: int, image_size: int) -> list[str]:
    """Serialized ``records`` as shards of ``per_file`` records (the last may hold fewer), in Kaggle's names."""
    paths, records = [], iter(records)
    while chunk := list(itertools.islice(records, per_file)):
        paths.append(os.path.join(os.fspath(split_dir), shard_name(len(paths), image_size, len(chunk))))
        write_tfrecord(paths[-1], chunk)
    return paths
