"""One training run from a :class:`~kaggle_utils.config.TrainConfig`: what the job, notebook 04 and ``cv`` share.

Read :func:`train` in ``trainer`` first: the whole run, top to bottom; the other modules are its steps' helpers
(the README's layout section maps them).
"""
from .build import (Plan, Training, build_model, build_training, device_augmentation, epoch_config, eval_dataset,
                    initial_variables, model_size, train_crop, train_dataset, val_dataset)
from .cv import CVResult, cross_validate
from .data import RunData, SAMPLE, data_root, infer_image_size, open_data, scan_test_ids
from .lr_find import LrFinding, find_lr
from .predict import (Member, ensemble_thresholds, load_members, load_run, open_test_split, predict, predict_ensemble,
                      predict_split, prediction_steps, write_blend_record, write_predictions)
from .resolve import check_config, global_batch, resolve, run_task
from .trainer import RunResult, fit_run, open_writers, run_manifest, train, write_config
from .tune import TuneResult, parse_space, tune

__all__ = [
    "CVResult", "LrFinding", "Member", "Plan", "RunData", "RunResult", "SAMPLE", "Training", "TuneResult",
    "build_model", "build_training", "check_config", "cross_validate", "data_root", "device_augmentation",
    "ensemble_thresholds", "epoch_config", "eval_dataset", "find_lr", "fit_run", "global_batch", "infer_image_size",
    "initial_variables", "load_members", "load_run", "model_size", "open_data", "open_writers", "open_test_split",
    "parse_space", "predict", "predict_ensemble", "predict_split", "prediction_steps", "resolve", "run_manifest",
    "run_task", "scan_test_ids", "train", "train_crop", "train_dataset", "tune", "val_dataset", "write_blend_record",
    "write_config", "write_predictions",
]
