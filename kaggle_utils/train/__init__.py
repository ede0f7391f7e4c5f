"""Multi-device training engine: state, steps (pmap or jit + shard_map), optimizer, fit loop.

``state``: TrainState (fp32 params, batch_stats, optimizer state, step, rng, optional EMA).
``steps``: per-replica train / eval / predict steps and ``make_steps`` (mode "pmap" | "jit").
``optim``: warmup + cosine schedule, batch-size scaled learning rate, AdamW with clipping / freezing.
``loop``: ``fit`` (history, checkpoints, resume, early stopping, NaN guard, callbacks).
"""
from .loop import HISTORY_COLUMNS, TIMING_COLUMNS, FitResult, TrainingDiverged, evaluate, fit, load_last
from .optim import make_optimizer, scaled_lr, warmup_cosine
from .state import TrainState, create_train_state, inference_state, init_variables
from .steps import AXIS, StepConfig, Steps, eval_step, make_steps, normalize, predict_step, replica_key, train_step

__all__ = [
    "AXIS", "FitResult", "HISTORY_COLUMNS", "StepConfig", "Steps", "TIMING_COLUMNS", "TrainState",
    "TrainingDiverged", "create_train_state", "eval_step", "evaluate", "fit", "inference_state", "init_variables",
    "load_last", "make_optimizer", "make_steps", "normalize", "predict_step", "replica_key", "scaled_lr",
    "train_step", "warmup_cosine",
]
