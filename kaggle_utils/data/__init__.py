"""TFRecord input pipeline: Kaggle's flower records -> uint8 host batches for JAX.

Nothing here imports TensorFlow at import time: it is loaded on first use, with GPUs and
TPUs hidden from it (:func:`tensorflow_on_host`), so JAX keeps the accelerator and the
augmentation worker processes, which import this package, stay light.
"""
from .augment import augment_images, resolve_augment, show_augmented
from .augment_workers import AugmentWorkerError, ProcessPoolAugmenter, default_worker_count
from .flowers import FLOWER_NUM_CLASSES, flower_class_names
from .imgaug_compat import import_imgaug_augmenters
from .numpy_augment import ImgaugRandAugment, apply_batch_augment
from .pipeline import HostDataset, SourceDataset, load_dataset, load_source
from .randaugment_tf import RANDAUGMENT_OPS, RandAugment
from .sample import SampleDataset, make_sample_dataset
from .sources import Source, class_folders, csv_source, image_folder, tfds_source
from .tfrecord_writer import encode_jpeg, serialize_example, shard_name, write_split, write_tfrecord
from .tfrecords import (
    BadRecordError,
    DataError,
    NoTFRecordsError,
    RecordProblem,
    check_tfrecords,
    count_data_items,
    count_from_name,
    count_records,
    decode_example,
    list_tfrecords,
    locate_competition_data,
    shard_files,
    tensorflow_on_host,
)
from .transforms import CenterCrop, RandomResizedCrop, Resize

__all__ = [
    "AugmentWorkerError", "BadRecordError", "DataError", "FLOWER_NUM_CLASSES", "HostDataset", "ImgaugRandAugment",
    "NoTFRecordsError",
    "ProcessPoolAugmenter", "RANDAUGMENT_OPS", "RandAugment", "RecordProblem", "SampleDataset",
    "apply_batch_augment", "augment_images", "check_tfrecords", "count_data_items", "count_from_name",
    "count_records", "decode_example", "default_worker_count", "encode_jpeg", "flower_class_names",
    "import_imgaug_augmenters", "list_tfrecords", "load_dataset", "locate_competition_data", "make_sample_dataset",
    "resolve_augment", "serialize_example", "shard_files", "shard_name", "show_augmented", "tensorflow_on_host",
    "write_split", "write_tfrecord",
    # sources other than TFRecords, and resolution
    "CenterCrop", "RandomResizedCrop", "Resize", "Source", "SourceDataset", "class_folders", "csv_source",
    "image_folder", "load_source", "tfds_source",
]
