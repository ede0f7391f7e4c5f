"""One training run from a :class:`~kaggle_utils.config.TrainConfig`: the functions the job and notebook 04 share.

In the order a run uses them:

1. ``data``: :func:`data_root` (``--data-dir``, ``--source`` converted once into TFRecords, or
   the embedded digits sample) and :func:`open_data` -> :class:`RunData` (splits, counts, stored
   size), every label checked against ``[0, num_classes)`` and the test split's ids checked,
   before anything trains.
2. ``resolve``: :func:`resolve`, the config with everything left open filled in for this
   machine and this data (classes, image size, precision, global batch, learning rate), and the
   :class:`Plan` of numbers derived from it (steps, warmup, peak learning rate, and with
   ``--progressive-stages`` each stage's size and regularisation: ``stages``).
3. ``build``: :func:`build_model`, :func:`initial_variables` (a new head on ported weights
   starts at zero, so a fine-tune's first loss is ln C), :func:`build_training` (task,
   optimizer, device augmentation and mixing, steps, state) and :func:`fit_run` (the loop with
   the config's intervals, crops, TensorBoard, files in ``out_dir``) over :func:`train_dataset`.
4. ``saved``: :func:`write_config` and :func:`load_run`, ``(model, variables, config)`` back from
   any run folder or checkpoint the kit wrote, for ``predict``, notebooks and users.
5. ``predict``: checkpoints (runs, CV folders' folds) + test images -> ids and mean probabilities
   (:func:`load_members`, :func:`open_test_split`, :func:`predict_ensemble`), and
   :func:`write_predictions` (``submission.csv``, ``probabilities.csv``), which a run uses too.

6. ``lr_find``: ``lr="auto"`` (``--lr auto``): the LR range test :func:`train` runs before the loop,
   and :func:`find_lr`, the same test alone for a notebook (an :class:`LrFinding`: curve and pick).

:func:`train` (``trainer``) is all of it in order, into one folder: what the job and notebook 04 call.
:func:`cross_validate` (``cv``, folds from ``folds``, ``--fold-group`` from ``groups``) runs it once per fold
over one pool of records. :func:`tune` (``tune``) runs an Optuna study whose trials are :func:`train` runs.
"""
from .build import (Training, build_model, build_training, device_augmentation, eval_transform, fit_run,
                    fit_settings, host_augment, initial_variables, model_size, open_writers, train_dataset,
                    train_transform, val_dataset)
from .cv import CVResult, cross_validate
from .data import (SAMPLE, RunData, commit_conversion, converted_source, data_root, find_splits, infer_image_size,
                   named_classes, open_data, sample_or_folder, scan_labels, scan_test_ids, submission_labels)
from .lr_find import LrFinding, find_lr, pick_lr
from .predict import Member, expand_checkpoint, load_members, open_test_split, predict_ensemble, write_predictions
from .resolve import Plan, check_config, global_batch, make_task, resolve, run_manifest
from .saved import load_run, write_config
from .stages import describe_stages, epoch_config, progressive_stages, stage_config
from .trainer import RunResult, predict_test_split, train
from .tune import TuneResult, parse_space, tune

__all__ = [
    "CVResult", "Member", "Plan", "RunData", "RunResult", "SAMPLE", "Training", "build_model", "build_training",
    "check_config", "commit_conversion", "converted_source", "cross_validate", "data_root", "describe_stages",
    "device_augmentation", "epoch_config",
    "eval_transform",
    "expand_checkpoint",
    "find_splits", "fit_run", "fit_settings", "global_batch", "host_augment", "infer_image_size", "initial_variables", "model_size", "open_writers",
    "LrFinding", "find_lr", "load_members", "load_run", "make_task", "named_classes", "open_data", "open_test_split",
    "pick_lr", "predict_ensemble", "predict_test_split", "progressive_stages", "resolve", "run_manifest",
    "sample_or_folder", "scan_labels", "scan_test_ids", "stage_config",
    "submission_labels", "train", "train_dataset", "train_transform", "TuneResult", "parse_space", "tune",
    "val_dataset", "write_config",
    "write_predictions",
]
