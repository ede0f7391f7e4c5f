"""Input pipeline: Kaggle's flower TFRecords and other image sources -> uint8 host batches for JAX.

TensorFlow is imported on first use, with the accelerators hidden from it (:func:`tensorflow_on_host`), so the
augmentation workers, which import this package, stay light.
"""
from .augment import (RANDAUGMENT_OPS, ColorJitter, ImgaugRandAugment, RandAugment, augment_images,
                      import_imgaug_augmenters, resolve_augment, show_augmented)
from .augment_workers import AugmentWorkerError, ProcessPoolAugmenter, default_worker_count
from .fields import ExampleFields, record_key
from .pipeline import HostDataset, check_tfrecords, load_dataset, load_source, scan_labels
from .sample import SampleDataset, make_sample_dataset
from .sources import Source, class_folders, csv_source, image_folder, tfds_source
from .tfhost import host_cores, tensorflow_on_host
from .tfrecords import (FLOWER_NUM_CLASSES, BadRecordError, DataError, NoTFRecordsError, RecordProblem,
                        count_data_items, count_from_name, count_records, encode_jpeg, flower_class_names,
                        list_tfrecords, locate_competition_data, serialize_example, shard_files, shard_name,
                        write_split, write_tfrecord)
from .transforms import CenterCrop, RandomResizedCrop, Resize

__all__ = [
    "AugmentWorkerError", "BadRecordError", "CenterCrop", "ColorJitter", "DataError", "ExampleFields",
    "FLOWER_NUM_CLASSES", "HostDataset",
    "ImgaugRandAugment", "NoTFRecordsError", "ProcessPoolAugmenter", "RANDAUGMENT_OPS", "RandAugment",
    "RandomResizedCrop", "RecordProblem", "Resize", "SampleDataset", "Source", "augment_images", "check_tfrecords",
    "class_folders", "count_data_items", "count_from_name", "count_records", "csv_source", "default_worker_count",
    "encode_jpeg", "flower_class_names", "host_cores", "image_folder", "import_imgaug_augmenters", "list_tfrecords",
    "load_dataset", "load_source", "locate_competition_data", "make_sample_dataset", "record_key", "resolve_augment",
    "scan_labels", "serialize_example", "shard_files", "shard_name", "show_augmented", "tensorflow_on_host",
    "tfds_source", "write_split", "write_tfrecord",
]
