"""The training run of the multi-host test, shared by the workers and the one-process reference.

Every process holds the same global batches and feeds its own rows (``local_rows``), exactly
as the job does for evaluation; the training batches are split the same way so the
two-process run and the one-process run see the same global batch at every step.
"""
import jax

from kaggle_utils.config import LoopConfig, OptimConfig
from kaggle_utils.parallel import local_rows, make_mesh
from kaggle_utils.train import (SoftmaxClassification, StepConfig, fit, init_variables,
                                make_optimizer, make_steps, make_schedule)
from train_helpers import TinyCNN, batches, digits

TRAIN, VAL = digits("train"), digits("val")
GLOBAL_BATCH, STEPS_PER_EPOCH, EPOCHS = 32, 3, 2


def run(mode, out_dir, devices=None):
    schedule = make_schedule("cosine", 0.03, STEPS_PER_EPOCH * EPOCHS, warmup_steps=2)
    tx = make_optimizer(schedule, OptimConfig(weight_decay=1e-4))
    model = TinyCNN(bn_axis_name="data", drop_rate=0.2)
    config = StepConfig(num_classes=10, task=SoftmaxClassification(label_smoothing=0.1),
                        optim=OptimConfig(ema_decay=0.999))
    steps = make_steps(model, tx, config, mode=mode, mesh=make_mesh(devices))
    state = jax.device_get(steps.init_state(init_variables(model, 8, seed=0), seed=5))

    def train_batches(epoch):
        return map(local_rows, batches(*TRAIN, GLOBAL_BATCH, shuffle_seed=epoch, pad=False))

    return fit(steps, state, train_batches, LoopConfig(steps_per_epoch=STEPS_PER_EPOCH, epochs=EPOCHS),
               val_batches=lambda: batches(*VAL, GLOBAL_BATCH), out_dir=out_dir, lr_schedule=schedule, progress=False)
