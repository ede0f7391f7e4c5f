"""Multi-device training engine: state, steps (pmap or jit + shard_map), optimizer, tasks, fit loop, run files."""
from .loop import TIMING_COLUMNS, FitResult, Hook, TrainingDiverged, evaluate, fit, history_columns
from .lr_groups import LrGroups, assign_lr_groups, describe_lr_groups, group_multipliers
from .optim import make_optimizer, make_schedule, scaled_lr
from .steps import (AXIS, StepConfig, Steps, TrainState, create_train_state, eval_step, inference_state, init_variables,
                    make_steps, micro_step, normalize, predict_step, replica_key, train_step)
from .tasks import FocalClassification, MetricError, MultiLabelClassification, SoftmaxClassification, Task, make_task
from .writers import MetricWriter, TensorBoardWriter, WandbWriter, WriterError

__all__ = [
    "AXIS", "FitResult", "FocalClassification", "Hook", "LrGroups", "MetricError",
    "MetricWriter", "MultiLabelClassification", "SoftmaxClassification", "StepConfig", "Steps", "TIMING_COLUMNS",
    "Task", "TensorBoardWriter", "TrainState", "TrainingDiverged", "WandbWriter", "WriterError", "assign_lr_groups",
    "create_train_state", "describe_lr_groups", "eval_step", "evaluate", "fit",
    "group_multipliers", "history_columns", "inference_state", "init_variables", "make_optimizer", "make_schedule",
    "make_steps", "micro_step", "make_task", "normalize", "predict_step", "replica_key", "scaled_lr", "train_step",
]
