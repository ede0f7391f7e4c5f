"""One training run from a :class:`~kaggle_utils.config.TrainConfig`: what the job, notebook 04 and ``cv`` share.

Read :mod:`.trainer` first: :func:`train` is the whole run, top to bottom. Each step's helpers sit in a
module of their own, each importing only those above it in this list:

* ``data``: :func:`open_data` -> :class:`RunData`, every input check (``--source`` converted, the sample).
* ``stages``: ``--progressive-stages``, each stage a config.
* ``build``: the :class:`Plan` a run is built from; :func:`build_model`, :func:`initial_variables`,
  :func:`build_training` (optimizer, steps, state), the datasets.
* ``memory_plan``: ``--batch-per-device auto``, the batch whose compiled train step fits.
* ``resolve``: :func:`check_config`, :func:`resolve` (what the config left open, for this machine and data).
* ``saved``: ``config.json``, checkpoints' manifests, :func:`load_run`.
* ``predict``: the one prediction path :func:`predict` ``(steps, variables, batches) -> (ids, probabilities)``,
  ensembles, and :func:`write_predictions` (``submission.csv``, ``probabilities.csv``).
* ``lr_find``: ``--lr auto``, the LR range test (:func:`find_lr` alone, for a notebook).
* ``trainer``: :func:`train` and :func:`fit_run` (the loop with the config's settings).
* ``cv`` (with ``folds``, ``groups``): :func:`cross_validate`, a :func:`train` per fold over one pool.
"""
from .build import (Plan, Training, build_model, build_training, device_augmentation, eval_dataset, initial_variables,
                    make_task, train_dataset, val_dataset)
from .cv import CVResult, cross_validate
from .data import RunData, SAMPLE, data_root, infer_image_size, open_data, sample_or_folder, scan_test_ids
from .lr_find import LrFinding, find_lr
from .predict import (Member, load_members, open_test_split, predict, predict_ensemble, predict_split,
                      prediction_steps, write_predictions)
from .resolve import check_config, global_batch, resolve
from .saved import load_run, run_manifest, write_config
from .stages import epoch_config
from .trainer import RunResult, fit_run, train

__all__ = [
    "CVResult", "LrFinding", "Member", "Plan", "RunData", "RunResult", "SAMPLE", "Training", "build_model",
    "build_training", "check_config", "cross_validate", "data_root", "device_augmentation", "epoch_config",
    "eval_dataset", "find_lr", "fit_run", "global_batch", "infer_image_size", "initial_variables", "load_members",
    "load_run", "make_task", "open_data", "open_test_split", "predict", "predict_ensemble", "predict_split",
    "prediction_steps", "resolve", "run_manifest", "sample_or_folder", "scan_test_ids", "train", "train_dataset",
    "val_dataset", "write_config", "write_predictions",
]
