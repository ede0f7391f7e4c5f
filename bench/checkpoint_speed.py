"""Checkpoints off the training path: the step time of ``fit`` with background writes vs writes on the loop's thread.

    python bench/checkpoint_speed.py                        # an MLP of 17.6 M parameters on 8 px images, CPU
    python bench/checkpoint_speed.py --model tf_efficientnetv2_m --size 384 --batch 64   # a GPU

One compiled engine (``--model``: a kit model, or ``mlp``, whose state is a V2-S's in size but compiles in
seconds on a CPU; AdamW with EMA: the state a real run saves) trains on random images
with a checkpoint every ``--every`` steps, in rounds that alternate the two modes: the kit's
(``RunFolder`` writing from a thread: the loop pays the state's pull to the host and waits only if the
previous write is still going) and the old one (the same writes inline, patched in here). Per mode: the
median seconds per step over the rounds, the training thread's checkpoint seconds (``metrics.json``'s
``checkpoint_s``) and the checkpoint's size. Results go to ``--out`` line by line as they come.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from kaggle_utils import checkpoint
from kaggle_utils.config import LoopConfig, OptimConfig
from kaggle_utils.efficientnet import create_model
from kaggle_utils.train import StepConfig, fit, init_variables, make_optimizer
from kaggle_utils.train import make_steps


class MLP(nn.Module):
    """Two 4096-wide layers: 17.6 M parameters (a 280 MB state with AdamW and EMA) for little compute."""

    @nn.compact
    def __call__(self, x, train=None):
        x = nn.relu(nn.Dense(4096)(x.reshape(x.shape[0], -1)))
        return nn.Dense(10)(nn.relu(nn.Dense(4096)(x)))


class InlineWrites(checkpoint.BackgroundWrites):
    """The writes on the caller's thread: what every save cost before they moved to a thread."""

    def submit(self, job, *args, **kwargs) -> None:
        job(*args, **kwargs)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mlp", help="mlp, or a kit model name")
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40, help="steps per timed run")
    parser.add_argument("--every", type=int, default=5, help="--checkpoint-every")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="bench/checkpoint_speed.jsonl")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    model = MLP() if args.model == "mlp" else create_model(args.model, num_classes=10)
    tx = make_optimizer(1e-3, OptimConfig(weight_decay=0.05))
    steps = make_steps(model, tx, StepConfig(num_classes=10, optim=OptimConfig(ema_decay=0.999)), mode="jit")
    state = jax.device_get(steps.init_state(init_variables(model, args.size)))
    rng = np.random.default_rng(0)
    batches = [{"image": rng.integers(0, 256, (args.batch, args.size, args.size, 3), np.uint8),
                "label": rng.integers(0, 10, args.batch).astype(np.int32), "mask": np.ones(args.batch, bool)}
               for _ in range(8)]

    def train_batches(epoch):
        while True:
            yield from batches

    def timed(mode: str, total: int, folder: Path) -> dict:
        writes = checkpoint.BackgroundWrites
        checkpoint.BackgroundWrites = InlineWrites if mode == "inline" else writes  # RunFolder makes one per fit
        try:
            settings = LoopConfig(steps_per_epoch=total, steps=total, checkpoint_every=args.every,
                                   log_every=total, monitor="train_loss")
            started = time.perf_counter()
            fit(steps, state, train_batches, settings, out_dir=folder, progress=False)
            wall = time.perf_counter() - started
        finally:
            checkpoint.BackgroundWrites = writes
        report = json.loads((folder / "metrics.json").read_text())
        return {"mode": mode, "s_per_step": wall / total, "checkpoint_s": report["checkpoint_s"],
                "checkpoint_mb": (folder / "last.msgpack").stat().st_size / 2**20, "saves": total // args.every}

    out = Path(args.out)
    with tempfile.TemporaryDirectory() as tmp, open(out, "a") as log:
        head = {"model": args.model, "size": args.size, "batch": args.batch, "steps": args.steps,
                "every": args.every, "device": jax.devices()[0].device_kind, "host": platform.node(),
                "date": time.strftime("%Y-%m-%d %H:%M")}
        log.write(json.dumps({"run": head}) + "\n")
        timed("background", 2, Path(tmp) / "warmup")  # compiles the step once for every later run
        results = {"background": [], "inline": []}
        for round_ in range(args.rounds):
            for mode in ("background", "inline") if round_ % 2 == 0 else ("inline", "background"):
                result = timed(mode, args.steps, Path(tmp) / f"{mode}-{round_}")
                results[mode].append(result)
                log.write(json.dumps(result) + "\n")
                log.flush()
                print(result, flush=True)
        for mode, rows in results.items():
            summary = {"mode": mode, "median_s_per_step": statistics.median(r["s_per_step"] for r in rows),
                       "median_checkpoint_s": statistics.median(r["checkpoint_s"] for r in rows),
                       "checkpoint_mb": rows[0]["checkpoint_mb"], "saves_per_run": rows[0]["saves"]}
            log.write(json.dumps({"summary": summary}) + "\n")
            print(summary, flush=True)


if __name__ == "__main__":
    main()
