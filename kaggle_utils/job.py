"""The train / predict job behind ``python -m kaggle_utils``: the flower pipeline end to end.

``train``: TFRecords in the competition layout (``DIR/{train,val,test}``; without
``--data-dir`` the embedded digits sample is written to a temporary folder) -> EfficientNet
(from scratch, or ``--weights`` ported from timm with a new head) -> ``fit`` -> ``OUT/``
``best.msgpack``, ``last.msgpack``, ``metrics.json``, ``history.csv``, ``config.json`` and,
with a test split, ``submission.csv`` predicted by the best checkpoint.

``predict``: a saved checkpoint (its JSON manifest names the model) + ``DIR/test`` ->
``OUT/submission.csv``.

Every check on the input (splits present, labels vs ``--num-classes``, batch size vs device
count, weights vs model, output folder vs an earlier run) runs before the first step.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from . import checkpoint, runtime
from .data.feed import AXIS, MODES, local_rows, make_mesh

__all__ = ["JobError", "build_parser", "main", "predict_command", "train_command"]

DEFAULT_MODEL = "tf_efficientnetv2_b0"
SAMPLE_IMAGE_SIZE = 32
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
OUTPUTS = ("config.json", "best.msgpack", "best.json", "last.msgpack", "last.json", "metrics.json",
           "history.csv", "submission.csv")
# settings that change what a run computes; the rest (--out, --resume, progress, ...) do not
RUN_SETTINGS = ("data_dir", "image_size", "model", "num_classes", "epochs", "steps", "steps_per_epoch",
                "batch_size", "lr", "warmup_epochs", "weight_decay", "label_smoothing", "clip_norm", "drop_rate",
                "drop_path_rate", "ema_decay", "weights", "freeze", "augment", "dtype", "sync_bn", "seed",
                "monitor", "patience", "tta", "deterministic")


class JobError(ValueError):
    """Bad input found before any work: the message names the argument, file or folder."""


# --------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils",
                                     description="Train an EfficientNet on TFRecords in the flower competition's "
                                                 "layout, or predict a submission from a checkpoint.")
    commands = parser.add_subparsers(dest="command", required=True)

    train = commands.add_parser("train", help="train, evaluate every epoch, keep the best checkpoint")
    train.add_argument("--data-dir", help="folder with train/, val/ and optionally test/ TFRecords "
                                          "(default: the embedded digits sample, written to a temporary folder)")
    train.add_argument("--out", required=True, help="output folder")
    train.add_argument("--image-size", type=int, help="image side in the records (default: from the file names; "
                                                      f"{SAMPLE_IMAGE_SIZE} for the sample)")
    train.add_argument("--model", default=DEFAULT_MODEL, help=f"registered EfficientNet name (default {DEFAULT_MODEL})")
    train.add_argument("--weights", help="ported weights (.msgpack) of --model to fine-tune; the head is new")
    train.add_argument("--freeze", action="append", default=[],
                       help="with --weights: regex of parameter paths to keep frozen (repeatable)")
    train.add_argument("--num-classes", type=int, help="default: max label in train/val + 1")
    train.add_argument("--epochs", type=int, default=10)
    train.add_argument("--steps", type=int, help="total steps instead of --epochs")
    train.add_argument("--steps-per-epoch", type=int, help="default: train examples // batch size")
    train.add_argument("--batch-size", type=int, help="global batch (default 16 per device, at least 64)")
    train.add_argument("--lr", type=float, help="AdamW peak learning rate per 256 examples, scaled to the batch "
                                                "(default 1e-2 from scratch, 2e-3 with --weights)")
    train.add_argument("--warmup-epochs", type=float, default=1.0)
    train.add_argument("--weight-decay", type=float, default=0.05)
    train.add_argument("--label-smoothing", type=float, default=0.1)
    train.add_argument("--clip-norm", type=float, default=1.0)
    train.add_argument("--drop-rate", type=float, default=0.2)
    train.add_argument("--drop-path-rate", type=float, default=0.1)
    train.add_argument("--ema-decay", type=float, default=0.0, help="EMA of the weights for evaluation (0: off)")
    train.add_argument("--augment", default="none", help="none | randaugment | imgaug (see kaggle_utils.data)")
    train.add_argument("--dtype", choices=sorted(DTYPES), help="compute dtype (default bfloat16 on TPU, else float32)")
    train.add_argument("--sync-bn", action=argparse.BooleanOptionalAction, default=True,
                       help="BatchNorm statistics over the global batch (default on)")
    train.add_argument("--deterministic", action=argparse.BooleanOptionalAction, default=True,
                       help="deterministic input order, so --resume continues exactly (default on)")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--monitor", default="val_f1", help="history column that picks best.msgpack")
    train.add_argument("--patience", type=int, help="stop after this many epochs without improvement")
    train.add_argument("--tta", action="store_true", help="average with horizontally flipped images when predicting")
    _add_runtime_flags(train)
    train.add_argument("--resume", action="store_true", help="continue the run in --out from last.msgpack")
    train.add_argument("--overwrite", action="store_true", help="replace the run in --out")

    predict = commands.add_parser("predict", help="write submission.csv from a checkpoint")
    predict.add_argument("--checkpoint", required=True, help="best.msgpack (or last.msgpack) of a training run")
    predict.add_argument("--data-dir", required=True, help="folder with a test/ split")
    predict.add_argument("--out", required=True, help="output folder for submission.csv")
    predict.add_argument("--batch-size", type=int, help="global batch (default 16 per device, at least 64)")
    predict.add_argument("--tta", action="store_true")
    _add_runtime_flags(predict)
    return parser


def _add_runtime_flags(parser):
    parser.add_argument("--mode", choices=MODES, default="jit", help="jit + shard_map (default) or pmap")
    parser.add_argument("--log-every", type=int, default=20, help="steps between metric pulls")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")


# --------------------------------------------------------------------------- checks


def _global_batch(batch_size: int | None) -> int:
    n = jax.device_count()
    default = runtime.global_batch(n)  # 16 per device, at least 64: the notebooks' rule too
    size = default if batch_size is None else batch_size
    if size < 1 or size % n:
        raise JobError(f"--batch-size {size} must be a positive multiple of the {n} devices "
                       f"({jax.local_device_count()} per process x {jax.process_count()} process(es)), "
                       f"e.g. {default}")
    return size


def find_splits(data_dir: str | Path, *, need_labels: bool = True) -> dict[str, list[str]]:
    """``{split: files}`` of ``data_dir``; train/val required for training, test optional."""
    from .data import list_tfrecords

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise JobError(f"--data-dir {data_dir} is not a folder")
    splits = {}
    for split in ("train", "val", "test"):
        folder = data_dir / split
        required = need_labels and split != "test" or not need_labels and split == "test"
        try:
            splits[split] = list_tfrecords(folder) if folder.is_dir() else []
        except FileNotFoundError:
            splits[split] = []
        if required and not splits[split]:
            raise JobError(f"--data-dir {data_dir} has no {split}/ split: expected TFRecords in {folder}/ "
                           f"(the competition layout: {data_dir}/{{train,val,test}}/*.tfrec)")
    return splits


_SIZE_IN_NAME = re.compile(r"-(\d+)x(\d+)-")


def infer_image_size(files: list[str]) -> int | None:
    """The ``SxS`` of Kaggle's file names (``00-512x512-798.tfrec`` -> 512), if they carry one."""
    sizes = {m.group(1) for m in map(_SIZE_IN_NAME.search, map(lambda f: Path(f).name, files)) if m}
    return int(sizes.pop()) if len(sizes) == 1 else None


def scan_labels(files: list[str], image_size: int) -> np.ndarray:
    """Every label of ``files`` (reads the split once; also proves the records decode at this size)."""
    from .data import load_dataset

    labels = [b["label"][b["mask"]] for b in load_dataset(files, labeled=True, image_size=image_size,
                                                             batch_size=256, ordered=True, process_index=0,
                                                             process_count=1)]
    return np.concatenate(labels) if labels else np.zeros(0, np.int32)


def resolve_num_classes(requested: int | None, splits: dict, image_size: int) -> int:
    seen = {split: scan_labels(splits[split], image_size) for split in ("train", "val")}
    top = max(int(v.max()) for v in seen.values() if v.size)
    if requested is None:
        return top + 1
    if requested <= top:
        where = next(s for s, v in seen.items() if v.size and v.max() == top)
        raise JobError(f"--num-classes {requested} is too small: the {where} split holds label {top} "
                       f"(needs at least {top + 1})")
    return requested


def _config_file(out: Path) -> Path:
    return out / "config.json"


def prepare_out_dir(out: Path, settings: dict, *, resume: bool, overwrite: bool) -> None:
    """Refuses to mix runs: an existing run in ``out`` needs --resume (same settings) or --overwrite."""
    if resume and overwrite:
        raise JobError("--resume and --overwrite exclude each other")
    existing = [name for name in OUTPUTS if (out / name).exists()]
    if not existing:
        if resume:
            raise JobError(f"--resume: {out} holds no run to resume (no last.msgpack)")
        return
    if overwrite:
        if jax.process_index() == 0:
            for name in existing:
                (out / name).unlink()
        return
    if not _config_file(out).is_file():
        raise JobError(f"--out {out} holds {', '.join(existing)} but no config.json: not a run of this job; "
                       "pass --overwrite to replace it or choose another folder")
    before = json.loads(_config_file(out).read_text()).get("settings", {})
    changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
    if changed:
        detail = "; ".join(f"{k}: {before.get(k)!r} -> {settings.get(k)!r}" for k in changed)
        raise JobError(f"--out {out} holds a run with other settings ({detail}); --resume continues only the same "
                       "settings: pass --overwrite to start a new run there, or choose another folder")
    if not resume:
        raise JobError(f"--out {out} already holds this run ({', '.join(existing)}); pass --resume to continue it "
                       "or --overwrite to start again")
    if not (out / "last.msgpack").is_file():
        raise JobError(f"--resume: {out} has no last.msgpack yet (the run stopped before its first epoch ended); "
                       "pass --overwrite to start again")


# --------------------------------------------------------------------------- model


def build_model(config: dict):
    """The module a run trains; ``config`` is the ``model`` section of config.json / a manifest."""
    from .efficientnet import create_model

    return create_model(config["name"], num_classes=config["num_classes"], dtype=DTYPES[config["dtype"]],
                        drop_rate=config["drop_rate"], drop_path_rate=config["drop_path_rate"],
                        bn_axis_name=AXIS if config["sync_bn"] else None)


def _abstract_variables(model, image_size: int) -> dict:
    x = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
    shapes = jax.eval_shape(model.init, jax.random.key(0), x)
    return {k: v for k, v in shapes.items() if k in ("params", "batch_stats")}


def initial_variables(model, model_config: dict, image_size: int, *, weights: str | None, seed: int) -> dict:
    """Random init, or ported weights for everything but the new classifier (via surgery)."""
    from .train import init_variables

    variables = init_variables(model, image_size, seed=seed)
    if weights is None:
        return variables
    from . import surgery
    from .efficientnet import efficientnet_v2_pretrained

    _, ported = efficientnet_v2_pretrained(model_config["name"], weights, input_size=image_size)
    variables, report = surgery.inherit(ported, variables)
    if jax.process_index() == 0:
        print(f"--weights {Path(weights).name}: {report}")
    return variables


def _freeze_mask(patterns: list[str], params):
    """The --freeze mask (True = frozen), checked now: a pattern that matches nothing is an input error."""
    if not patterns:
        return None
    from . import surgery

    try:
        return surgery.freeze_mask(params, patterns)
    except surgery.SurgeryError as err:
        raise JobError(f"--freeze: {err}") from None


def _training_model(model, patterns: list[str]):
    """With --freeze, BatchNorm layers in the frozen part run in inference mode: stats used and kept."""
    if not patterns:
        return model
    from . import surgery

    return surgery.freeze_batchnorm(model, patterns)


# --------------------------------------------------------------------------- train


def _deterministic_input() -> None:
    # tf.data's parallel map/interleave otherwise return shuffled records in a timing-dependent
    # order; with op determinism the seeded order is reproduced exactly, which --resume needs.
    from .data import tensorflow_on_host

    tensorflow_on_host().config.experimental.enable_op_determinism()


@contextlib.contextmanager
def _data_dir(requested: str | None, image_size: int | None):
    """The user's folder, or the digits sample written to a temporary folder for this run."""
    if requested is not None:
        yield Path(requested), image_size
        return
    from .data import make_sample_dataset

    size = image_size or SAMPLE_IMAGE_SIZE
    with tempfile.TemporaryDirectory(prefix="kaggle_utils_sample_") as tmp:
        if jax.process_index() == 0:
            print(f"no --data-dir: training on the embedded digits sample ({size}x{size}) in {tmp}")
        make_sample_dataset(tmp, source="digits", image_size=size)
        yield Path(tmp), size


def _settings(args, image_size: int, batch_size: int) -> dict:
    settings = {k: getattr(args, k) for k in RUN_SETTINGS}
    settings.update(data_dir=str(Path(args.data_dir).resolve()) if args.data_dir else "sample:digits",
                    image_size=image_size, batch_size=batch_size, dtype=args.dtype or _default_dtype(),
                    lr=args.lr or (2e-3 if args.weights else 1e-2),
                    weights=str(Path(args.weights).resolve()) if args.weights else None)
    return settings


def _default_dtype() -> str:
    return runtime.default_dtype(runtime.current_platform())


def train_command(args) -> dict:
    """Runs ``train``; returns a summary (best row, files written)."""
    from .data import count_data_items, load_dataset
    from .efficientnet import pretrained_cfg
    from .inference import predict_split
    from .train import (SoftmaxClassification, StepConfig, create_train_state, fit, make_optimizer, make_steps,
                        scaled_lr, warmup_cosine)

    batch_size = _global_batch(args.batch_size)
    if batch_size % jax.process_count():
        raise JobError(f"--batch-size {batch_size} must split evenly over {jax.process_count()} processes")
    if args.freeze and not args.weights:
        raise JobError("--freeze needs --weights (freezing a randomly initialised network is a mistake)")
    if args.weights and not Path(args.weights).is_file():
        raise JobError(f"--weights {args.weights} does not exist")
    out = Path(args.out)
    with _data_dir(args.data_dir, args.image_size) as (data_dir, image_size):
        splits = find_splits(data_dir)
        image_size = image_size or infer_image_size(splits["train"])
        if image_size is None:
            raise JobError(f"--image-size is needed: the file names in {data_dir}/train carry no SxS size")
        settings = _settings(args, image_size, batch_size)
        prepare_out_dir(out, settings, resume=args.resume, overwrite=args.overwrite)
        if args.deterministic:
            _deterministic_input()
        num_classes = resolve_num_classes(args.num_classes, splits, image_size)
        model_config = {"name": args.model, "num_classes": num_classes, "dtype": settings["dtype"],
                        "drop_rate": args.drop_rate, "drop_path_rate": args.drop_path_rate, "sync_bn": args.sync_bn,
                        "image_size": image_size}
        model = build_model(model_config)
        cfg = pretrained_cfg(args.model)
        variables = initial_variables(model, model_config, image_size, weights=args.weights, seed=args.seed)

        n_train = count_data_items(splits["train"])
        steps_per_epoch = args.steps_per_epoch or n_train // batch_size
        if steps_per_epoch < 1:
            raise JobError(f"--batch-size {batch_size} is larger than the {n_train} training examples")
        total_steps = args.steps or args.epochs * steps_per_epoch
        schedule = warmup_cosine(scaled_lr(settings["lr"], batch_size), total_steps,
                                 warmup_steps=round(args.warmup_epochs * steps_per_epoch))
        tx = make_optimizer(schedule, weight_decay=args.weight_decay, clip_norm=args.clip_norm or None,
                            frozen=_freeze_mask(args.freeze, variables["params"]))
        step_config = StepConfig(num_classes=num_classes, mean=tuple(cfg["mean"]), std=tuple(cfg["std"]),
                                 task=SoftmaxClassification(label_smoothing=args.label_smoothing),
                                 ema_decay=args.ema_decay or 0.999,
                                 tta_flip=args.tta)
        steps = make_steps(_training_model(model, args.freeze), tx, step_config, mode=args.mode, mesh=make_mesh())
        state = jax.device_get(create_train_state(variables, tx, seed=args.seed, ema=args.ema_decay > 0))
        if jax.process_index() == 0:
            out.mkdir(parents=True, exist_ok=True)
            checkpoint.atomic_write_text(_config_file(out), json.dumps(
                {"settings": settings, "model": model_config}, indent=2) + "\n")

        per_process = batch_size // jax.process_count()

        def train_batches(epoch):
            dataset = load_dataset(splits["train"], labeled=True, image_size=image_size, batch_size=per_process,
                                   augment=None if args.augment == "none" else args.augment, drop_remainder=True,
                                   repeat=True, seed=args.seed * 100_003 + epoch)
            try:
                yield from dataset
            finally:
                dataset.close()

        val_dataset = load_dataset(splits["val"], labeled=True, image_size=image_size, batch_size=batch_size,
                                   ordered=True, process_index=0, process_count=1)
        result = fit(steps, state, train_batches, steps_per_epoch=steps_per_epoch,
                     **({"total_steps": args.steps} if args.steps else {"epochs": args.epochs}),
                     val_batches=lambda: map(local_rows, val_dataset), out_dir=out, monitor=args.monitor,
                     patience=args.patience, log_every=args.log_every, lr_schedule=schedule, resume=args.resume,
                     manifest={"model": model_config, "mean": list(cfg["mean"]), "std": list(cfg["std"])},
                     progress=args.progress)
        summary = {"best": result.best, "stop_reason": result.stop_reason, "out": str(out)}
        if splits["test"]:
            best = _best_variables(out, result)
            path, ids, _ = predict_split(steps, best, splits["test"], image_size=image_size, batch_size=batch_size,
                                         out_path=out / "submission.csv")
            summary["submission"] = str(path)
            if jax.process_index() == 0:
                print(f"wrote {path}: {len(ids)} rows (best epoch {result.best and result.best['epoch']})")
    return summary


def _best_variables(out: Path, result) -> dict:
    """The best checkpoint's variables on every process (only process 0 has the file)."""
    final = result.state.variables()
    if result.best is None:
        return final
    if jax.process_index() == 0:
        variables = checkpoint.load(out / "best.msgpack", target=final)
    else:
        variables = jax.tree.map(np.zeros_like, final)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        variables = multihost_utils.broadcast_one_to_all(variables)
    return variables


# --------------------------------------------------------------------------- predict


def predict_command(args) -> dict:
    from .inference import predict_split
    from .train import StepConfig, make_steps

    ckpt = Path(args.checkpoint)
    manifest_file = checkpoint.manifest_path(ckpt)
    if not ckpt.is_file():
        raise JobError(f"--checkpoint {ckpt} does not exist")
    if not manifest_file.is_file():
        raise JobError(f"--checkpoint {ckpt} has no manifest {manifest_file.name} beside it: cannot tell which "
                       "model it holds")
    manifest = json.loads(manifest_file.read_text())
    if "model" not in manifest:
        raise JobError(f"{manifest_file} names no model (is {ckpt.name} a checkpoint of this job?)")
    model_config = manifest["model"]
    batch_size = _global_batch(args.batch_size)
    splits = find_splits(args.data_dir, need_labels=False)
    image_size = model_config["image_size"]
    found = infer_image_size(splits["test"])
    if found is not None and found != image_size:
        raise JobError(f"{args.data_dir}/test holds {found}x{found} images but {ckpt.name} was trained at "
                       f"{image_size}x{image_size}")
    model = build_model(model_config)
    template = _abstract_variables(model, image_size)
    raw = checkpoint.load(ckpt)
    variables = raw["state"] if "state" in raw else raw  # last.msgpack holds the whole training state
    variables = {k: variables[k] for k in ("params", "batch_stats") if k in variables}
    checkpoint.check_tree(variables, template, what=f"checkpoint {ckpt} for {model_config['name']} "
                                                    f"with {model_config['num_classes']} classes")
    config = StepConfig(num_classes=model_config["num_classes"], mean=tuple(manifest["mean"]),
                        std=tuple(manifest["std"]), tta_flip=args.tta)
    steps = make_steps(model, None, config, mode=args.mode, mesh=make_mesh())
    out = Path(args.out)
    path, ids, _ = predict_split(steps, variables, splits["test"], image_size=image_size, batch_size=batch_size,
                                 out_path=out / "submission.csv")
    if jax.process_index() == 0:
        print(f"wrote {path}: {len(ids)} rows")
    return {"submission": str(path), "rows": len(ids)}


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = train_command if args.command == "train" else predict_command
    from .data import DataError
    from .train import TrainingDiverged

    try:
        command(args)
    except (JobError, checkpoint.CheckpointError, DataError) as err:
        parser.exit(2, f"{parser.prog} {args.command}: error: {err}\n")
    except TrainingDiverged as err:
        parser.exit(3, f"{parser.prog} {args.command}: {err}\n")
    return 0
