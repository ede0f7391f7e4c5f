"""Multi-device training engine: state, steps (pmap or jit + shard_map), optimizer, fit loop.

``state``: TrainState (fp32 params, batch_stats, optimizer state, step, rng, optional EMA and loss scale).
``steps``: per-replica train / eval / predict steps and ``make_steps`` (mode "pmap" | "jit").
``optim``: schedules and optimizers by name, batch-size scaled learning rate, clipping / freezing.
``lr_groups``: learning rates per part of a model (layer-wise decay, classifier multiplier).
``tasks``: loss + metrics (softmax, focal, multi-label), summed on the device, finished on the host.
``loop``: ``fit`` and its ``FitSettings`` (actions at step intervals, history, resume, early stopping, hooks).
``run_dir``: the files of a run folder (last K + best checkpoints, history), written in a background thread.
``writers``: where logged scalars go (TensorBoard, W&B, or any object with ``write(step, scalars)``).
"""
from .loop import TIMING_COLUMNS, FitResult, FitSettings, Hook, TrainingDiverged, evaluate, fit, history_columns
from .lr_groups import LrGroups, assign_lr_groups, describe_lr_groups, group_multipliers
from .optim import make_optimizer, make_schedule, scaled_lr
from .state import TrainState, create_train_state, inference_state, init_variables
from .steps import (AXIS, StepConfig, Steps, eval_step, make_steps, micro_step, normalize, predict_step, replica_key,
                    train_step)
from .tasks import FocalClassification, MetricError, MultiLabelClassification, SoftmaxClassification, Task, make_task
from .writers import MetricWriter, TensorBoardWriter, WandbWriter, WriterError

__all__ = [
    "AXIS", "FitResult", "FitSettings", "FocalClassification", "Hook", "LrGroups", "MetricError",
    "MetricWriter", "MultiLabelClassification", "SoftmaxClassification", "StepConfig", "Steps", "TIMING_COLUMNS",
    "Task", "TensorBoardWriter", "TrainState", "TrainingDiverged", "WandbWriter", "WriterError", "assign_lr_groups",
    "create_train_state", "describe_lr_groups", "eval_step", "evaluate", "fit",
    "group_multipliers", "history_columns", "inference_state", "init_variables", "make_optimizer", "make_schedule",
    "make_steps", "micro_step", "make_task", "normalize", "predict_step", "replica_key", "scaled_lr", "train_step",
]
