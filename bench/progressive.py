"""Progressive learning vs a fixed image size: time to a validation accuracy, and the final accuracy, same epochs.

    python bench/progressive.py                                  # test_efficientnet, digits at 48 px, 8 epochs
    python bench/progressive.py --size 224 --model tf_efficientnetv2_b0 --epochs 12 --data-dir DIR   # a GPU

Both runs are ``kaggle_utils.run.train`` of one config, the progressive one with
``--progressive-stages --progressive-min-size --progressive-dropout`` added, into their own
folders, back to back and alternating in order round by round (``--rounds``). Each run's clock
is its history's ``seconds`` column summed up to the row: training, evaluation and the compiles
inside them (the progressive run compiles one train step per stage); the time to ``--target``
is that sum at the first evaluation that reaches it. The figures without compiling subtract
the run's ``compile_s`` up to that row (every compile happens by the stage's first step, and
the evaluation's in the first row). The persistent compilation cache is off, so no run reads
another's compiled programs (the progressive run's last stage is the fixed run's step).
Without ``--data-dir`` the data is the kit's digits sample written at ``--size``. Figures:
bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="test_efficientnet")
    parser.add_argument("--size", type=int, default=48, help="the fixed run's size and the last stage's")
    parser.add_argument("--min-size", type=int, default=16, help="--progressive-min-size")
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--target", type=float, default=0.9, help="validation accuracy to time")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--lr", type=float, default=None, help="per 256 images (default: the kit's)")
    return parser.parse_args(argv)


def fixed_config(args, data_dir: str):
    from kaggle_utils.config import TrainConfig

    return TrainConfig().replace(model=args.model, data_dir=data_dir, image_size=args.size, batch_size=args.batch,
                                 epochs=args.epochs, tensorboard=False, log_every=10_000,
                                 **({} if args.lr is None else {"lr": args.lr}))


def progressive_config(args, data_dir: str):
    return fixed_config(args, data_dir).replace(progressive_stages=args.stages, progressive_min_size=args.min_size,
                                                progressive_dropout=True)


def time_to(history: list[dict], target: float, compile_s: dict) -> tuple[float | None, float | None]:
    """(seconds, seconds without compiling) of the run until its first row with val_acc >= target."""
    clock = 0.0
    for row in history:
        clock += row["seconds"]
        if row["val_acc"] >= target:
            compiled = sum(seconds for epoch, seconds in compile_s.items() if epoch <= row["epoch"])
            return clock, clock - compiled
    return None, None


def train_one(name: str, config, out: Path) -> dict:
    from kaggle_utils import run

    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()) as log:
        result = run.train(config, out, progress=False)
    wall = time.perf_counter() - started
    report = json.loads((out / "metrics.json").read_text())
    stage_compile = report.get("stage_compile_s")
    if stage_compile:  # compiled by the stage's first step: counted in that stage's first epoch
        compile_by_epoch = {s.first_epoch: stage_compile[str(s.number)] for s in result.plan.stages}
        compile_by_epoch[1] += report["compile_s"] - sum(stage_compile.values())  # evaluation, prediction, ...
    else:
        compile_by_epoch = {1: report["compile_s"]}
    return {"name": name, "history": result.history, "wall": wall, "compile_s": report["compile_s"],
            "compile_by_epoch": compile_by_epoch, "plan": result.plan.describe(result.config),
            "log": log.getvalue()}


def show(run: dict, target: float) -> str:
    seconds, without = time_to(run["history"], target, run["compile_by_epoch"])
    reached = f"{seconds:6.1f} s ({without:6.1f} s without compiling)" if seconds is not None else "not reached"
    accs = " ".join(f"{row['val_acc']:.3f}" for row in run["history"])
    return (f"{run['name']:>11}: to val_acc {target}: {reached}; final val_acc {run['history'][-1]['val_acc']:.4f}; "
            f"fit {sum(r['seconds'] for r in run['history']):.1f} s of which compiling {run['compile_s']:.1f} s; "
            f"val_acc by epoch {accs}")


def main(argv=None) -> None:
    args = parse_args(argv)
    import jax

    jax.config.update("jax_enable_compilation_cache", False)  # no run reads another's programs
    import kaggle_utils
    from kaggle_utils.data import make_sample_dataset

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.node()}: {os.cpu_count()} CPU(s), "
          f"jax {jax.__version__} on {jax.devices()[0].device_kind}; load average {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench_progressive_") as tmp:
        data_dir = args.data_dir or make_sample_dataset(Path(tmp) / "digits", image_size=args.size).root
        configs = {"fixed": fixed_config(args, data_dir), "progressive": progressive_config(args, data_dir)}
        for round_ in range(args.rounds):
            order = list(configs) if round_ % 2 == 0 else list(configs)[::-1]
            for name in order:
                done = train_one(name, configs[name], Path(tmp) / f"{name}{round_}")
                if round_ == 0:
                    print(f"{name}: {done['plan']}")
                print(f"round {round_ + 1} {show(done, args.target)}", flush=True)
    print(f"load average at the end {os.getloadavg()}; kaggle_utils at {Path(kaggle_utils.__file__).parent}")


if __name__ == "__main__":
    main()
