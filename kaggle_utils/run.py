"""One training run from a :class:`~kaggle_utils.config.TrainConfig`: the functions the job and notebook 04 share.

In the order a run uses them:

1. :func:`sample_or_folder` / :func:`open_data`: the data folder (the competition's TFRecord
   layout, or the embedded digits sample) -> :class:`RunData` (splits, counts, stored size),
   every label checked against ``[0, num_classes)`` and the test split's ids checked, before
   anything trains.
2. :func:`resolve`: the config with everything left open filled in for this machine and this
   data (classes, image size, dtype, global batch, learning rate) and the :class:`Plan` of
   numbers derived from it (steps, warmup, peak learning rate). The job prints them.
3. :func:`build_model`, :func:`initial_variables` (a new head on ported weights starts at zero,
   so a fine-tune's first loss is ln C), :func:`build_training` (task, optimizer, steps, state).
4. :func:`fit_run`: the loop with the config's intervals, TensorBoard, and files in ``out_dir``.
5. :func:`load_run`: ``(model, variables, config)`` back from any run folder or checkpoint the
   kit wrote, for ``predict``, notebooks and users.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from . import checkpoint, runtime
from .config import ConfigError, TrainConfig, flag_of

__all__ = ["Plan", "RunData", "Training", "build_model", "build_training", "fit_run", "initial_variables",
           "load_run", "open_data", "resolve", "sample_or_folder"]

SAMPLE_IMAGE_SIZE = 32
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
SCRATCH_LR, FINETUNE_LR = 1e-2, 2e-3  # AdamW peak per 256 images


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class RunData:
    root: Path
    splits: dict[str, list[str]]  # train / val / test -> TFRecord files (test may be empty)
    stored_size: int  # image side in the records
    num_train: int
    max_label: int
    description: str  # where the data came from, for config.json


SAMPLE = "sample:digits"  # the data_dir of a run on the embedded sample, as config.json records it


@contextlib.contextmanager
def sample_or_folder(config: TrainConfig) -> Iterator[Path]:
    """The data folder of ``config``: its ``data_dir``, or the digits sample written to a temporary folder."""
    if config.data.data_dir not in (None, SAMPLE):
        yield Path(config.data.data_dir)
        return
    from .data import make_sample_dataset

    size = config.model.image_size or SAMPLE_IMAGE_SIZE
    with tempfile.TemporaryDirectory(prefix="kaggle_utils_sample_") as tmp:
        if jax.process_index() == 0:
            print(f"no --data-dir: training on the embedded digits sample ({size}x{size}) in {tmp}")
        make_sample_dataset(tmp, source="digits", image_size=size)
        yield Path(tmp)


def find_splits(data_dir: str | Path, *, need_labels: bool = True) -> dict[str, list[str]]:
    """``{split: files}`` of ``data_dir``; train/val required for training, test for predicting."""
    from .data import list_tfrecords

    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise ConfigError(f"--data-dir {data_dir} is not a folder")
    splits = {}
    for split in ("train", "val", "test"):
        folder = data_dir / split
        required = split != "test" if need_labels else split == "test"
        try:
            splits[split] = list_tfrecords(folder) if folder.is_dir() else []
        except FileNotFoundError:
            splits[split] = []
        if required and not splits[split]:
            raise ConfigError(f"--data-dir {data_dir} has no {split}/ split: expected TFRecords in {folder}/ "
                              f"(the competition layout: {data_dir}/{{train,val,test}}/*.tfrec)")
    return splits


_SIZE_IN_NAME = re.compile(r"-(\d+)x(\d+)-")


def infer_image_size(files: list[str]) -> int | None:
    """The ``SxS`` of Kaggle's file names (``00-512x512-798.tfrec`` -> 512), if they carry one."""
    sizes = {m.group(1) for m in map(_SIZE_IN_NAME.search, (Path(f).name for f in files)) if m}
    return int(sizes.pop()) if len(sizes) == 1 else None


def scan_labels(files: list[str], image_size: int, *, skip_errors: bool = False) -> np.ndarray:
    """Every label of ``files`` (reads the split once; also proves the records decode at this size)."""
    from .data import load_dataset

    labels = [b["label"][b["mask"]] for b in load_dataset(files, labeled=True, image_size=image_size,
                                                             batch_size=256, ordered=True, process_index=0,
                                                             process_count=1, skip_errors=skip_errors)]
    return np.concatenate(labels) if labels else np.zeros(0, np.int32)


def scan_test_ids(files: list[str]) -> list[str]:
    """The test split's ids in order, parsed without decoding images; checked as a submission needs them."""
    from .data import count_data_items, tensorflow_on_host

    tf = tensorflow_on_host()
    feature = {"id": tf.io.FixedLenFeature([], tf.string, default_value="\x00missing")}
    ids = []
    for name in files:
        for index, record in enumerate(tf.data.TFRecordDataset(name)):
            value = tf.io.parse_single_example(record, feature)["id"].numpy()
            if value == b"\x00missing":
                raise ConfigError(f"{name}, record {index}: the test split has no 'id' feature; submission.csv "
                                  "needs one id per test image")
            ids.append(value.decode("utf-8"))
    expected = count_data_items(files)
    if len(ids) != expected:
        raise ConfigError(f"the test split holds {len(ids)} records but its file names promise {expected}: "
                          "a submission would miss or repeat images")
    seen: set[str] = set()
    repeated = [i for i in ids if i in seen or seen.add(i)]
    if repeated:
        raise ConfigError(f"test ids repeat ({len(repeated)} duplicates, e.g. {sorted(set(repeated))[:5]}): "
                          "refusing to train for an ambiguous submission")
    return ids


def open_data(config: TrainConfig, root: str | Path) -> RunData:
    """The run's data in ``root``, checked: splits, stored size, labels in range, test ids usable."""
    from .data import count_data_items

    root = Path(root)
    splits = find_splits(root)
    stored = infer_image_size(splits["train"]) or config.model.image_size
    if stored is None:
        raise ConfigError(f"--image-size is needed: the file names in {root}/train carry no SxS size")
    seen = {split: scan_labels(splits[split], stored, skip_errors=config.data.skip_errors) for split in ("train", "val")}
    for split, labels in seen.items():
        if labels.size and labels.min() < 0:
            raise ConfigError(f"the {split} split holds label {int(labels.min())}: labels must be in [0, classes)")
    top = max(int(v.max()) for v in seen.values() if v.size)
    if config.model.num_classes is not None and config.model.num_classes <= top:
        where = next(s for s, v in seen.items() if v.size and v.max() == top)
        raise ConfigError(f"--num-classes {config.model.num_classes} is too small: the {where} split holds label "
                          f"{top} (needs at least {top + 1})")
    if splits["test"]:
        scan_test_ids(splits["test"])
    return RunData(root=root, splits=splits, stored_size=stored, num_train=count_data_items(splits["train"]),
                   max_label=top,
                   description=SAMPLE if config.data.data_dir in (None, SAMPLE) else str(root.resolve()))


# --------------------------------------------------------------------------- resolution


@dataclasses.dataclass(frozen=True)
class Plan:
    """The numbers a resolved config implies on this machine; printed at start, kept in config.json."""

    device_count: int
    global_batch: int
    per_device_batch: int
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    peak_lr: float
    head_width: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def describe(self, config: TrainConfig) -> str:
        return (f"global batch {self.global_batch} = {self.per_device_batch} per device x {self.device_count} "
                f"device(s); peak learning rate {self.peak_lr:.3g} ({config.optim.lr:g} per 256 images); "
                f"{self.total_steps} steps ({self.steps_per_epoch} per epoch, warmup {self.warmup_steps}); "
                f"{config.model.name} at {config.model.image_size}px, {config.model.num_classes} classes, "
                f"{config.model.dtype}")


def _global_batch(config: TrainConfig) -> int:
    n = jax.device_count()
    data = config.data
    if data.batch_size is not None and data.batch_per_device is not None:
        raise ConfigError("--batch-size (global) and --batch-per-device exclude each other: give one")
    size = data.batch_per_device * n if data.batch_per_device is not None else data.batch_size
    size = runtime.global_batch(n) if size is None else size
    flag = "--batch-per-device" if data.batch_per_device is not None else "--batch-size"
    if size < 1 or size % n or size % jax.process_count():
        raise ConfigError(f"{flag} gives a global batch of {size}, which must be a positive multiple of the {n} "
                          f"devices ({jax.local_device_count()} per process x {jax.process_count()} process(es)), "
                          f"e.g. {runtime.global_batch(n)}")
    return size


def _check_values(config: TrainConfig) -> None:
    """Values no run can use, named by flag; ``None`` always means "the default", never a given 0."""
    positive = {"epochs": config.loop.epochs, "steps": config.loop.steps,
                "steps_per_epoch": config.loop.steps_per_epoch, "eval_every": config.loop.eval_every,
                "checkpoint_every": config.loop.checkpoint_every, "keep_checkpoints": config.loop.keep_checkpoints,
                "log_every": config.loop.log_every, "patience": config.loop.patience,
                "num_classes": config.model.num_classes, "image_size": config.model.image_size,
                "head_multiple": config.model.head_multiple}
    for name, value in positive.items():
        if value is not None and value < 1:
            raise ConfigError(f"{flag_of(name)} {value}: must be at least 1")
    for name, value in {"lr": config.optim.lr, "clip_norm": config.optim.clip_norm}.items():
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ConfigError(f"{flag_of(name)} {value}: must be a finite number > 0")
    for name, value, low, high in (("label_smoothing", config.task.label_smoothing, 0, 1),
                                   ("drop_rate", config.model.drop_rate, 0, 1),
                                   ("drop_path_rate", config.model.drop_path_rate, 0, 1),
                                   ("ema_decay", config.optim.ema_decay, 0, 1),
                                   ("warmup_max_fraction", config.optim.warmup_max_fraction, 0, 1)):
        if not low <= value < high:
            raise ConfigError(f"{flag_of(name)} {value}: must be in [{low}, {high})")
    if config.optim.weight_decay < 0 or config.optim.warmup_epochs < 0:
        raise ConfigError("--weight-decay and --warmup-epochs must be >= 0")
    if config.model.freeze and not config.model.weights:
        raise ConfigError("--freeze needs --weights (freezing a randomly initialised network is a mistake)")
    if config.model.weights and not Path(config.model.weights).is_file():
        raise ConfigError(f"--weights {config.model.weights} does not exist")
    from .efficientnet import resolve_name

    try:
        resolve_name(config.model.name)
    except ValueError as err:
        raise ConfigError(f"--model: {err}") from None


def check_config(config: TrainConfig) -> None:
    """Every check that needs no data: values, model name, monitor against the task's metrics."""
    from .train import history_columns

    _check_values(config)
    columns = history_columns(make_task(config))
    if config.loop.monitor not in columns:
        raise ConfigError(f"--monitor {config.loop.monitor!r} is not a metric of --task {config.task.task}; "
                          f"choose one of {', '.join(c for c in columns[2:] if c not in ('img_per_s', 'seconds'))}")


def resolve(config: TrainConfig, data: RunData) -> tuple[TrainConfig, Plan]:
    """``config`` with nothing left open for this machine and data, and the numbers it implies."""
    from .efficientnet import pretrained_cfg
    from .surgery import padded_width

    check_config(config)
    image_size = config.model.image_size or data.stored_size
    if image_size != data.stored_size:
        raise ConfigError(f"--image-size {image_size} differs from the records' {data.stored_size}x"
                          f"{data.stored_size}; train at the stored size or convert the data to that size")
    platform = runtime.current_platform()
    config = config.replace(
        data_dir=data.description, num_classes=config.model.num_classes or data.max_label + 1, image_size=image_size,
        dtype=config.model.dtype or runtime.default_dtype(platform), batch_size=_global_batch(config),
        batch_per_device=None, lr=config.optim.lr or (FINETUNE_LR if config.model.weights else SCRATCH_LR),
        head_multiple=config.model.head_multiple or (128 if platform == "tpu" else 1),
        weights=str(Path(config.model.weights).resolve()) if config.model.weights else None)
    batch = config.data.batch_size
    steps_per_epoch = config.loop.steps_per_epoch or data.num_train // batch
    if steps_per_epoch < 1:
        raise ConfigError(f"--batch-size {batch} is larger than the {data.num_train} training examples")
    total = config.loop.steps or config.loop.epochs * steps_per_epoch
    warmup = min(round(config.optim.warmup_epochs * steps_per_epoch), int(config.optim.warmup_max_fraction * total))
    cfg = pretrained_cfg(config.model.name)
    from .train import scaled_lr

    plan = Plan(device_count=jax.device_count(), global_batch=batch, per_device_batch=batch // jax.device_count(),
                steps_per_epoch=steps_per_epoch, total_steps=total, warmup_steps=warmup,
                peak_lr=scaled_lr(config.optim.lr, batch),
                head_width=padded_width(config.model.num_classes, config.model.head_multiple),
                mean=tuple(cfg["mean"]), std=tuple(cfg["std"]))
    return config, plan


# --------------------------------------------------------------------------- model and training


def make_task(config: TrainConfig):
    from .train import make_task as make

    return make(config.task.task, label_smoothing=config.task.label_smoothing, focal_gamma=config.task.focal_gamma)


def build_model(config: TrainConfig):
    """The module a run trains: the variant with a classifier of ``head_width`` outputs."""
    from .efficientnet import create_model
    from .surgery import padded_width
    from .train import AXIS

    model = config.model
    return create_model(model.name, num_classes=padded_width(model.num_classes, model.head_multiple or 1),
                        dtype=DTYPES[model.dtype], drop_rate=model.drop_rate, drop_path_rate=model.drop_path_rate,
                        bn_axis_name=AXIS if model.sync_bn else None)


def initial_variables(config: TrainConfig, model) -> dict:
    """Random init, or ported weights for the backbone with a zero classifier.

    A zero head outputs equal logits, so the first loss is ln C and the first gradients reach
    the head only: timm's U(±1/sqrt(fan_out)) init, sized for 1000 outputs, gives a few
    classes large random logits that the pretrained features then spend steps unlearning.
    """
    from .train import init_variables

    variables = init_variables(model, config.model.image_size, seed=config.seed)
    if config.model.weights is None:
        return variables
    from . import surgery
    from .efficientnet import efficientnet_v2_pretrained

    _, ported = efficientnet_v2_pretrained(config.model.name, config.model.weights,
                                           input_size=config.model.image_size)
    variables, report = surgery.inherit(ported, variables)
    params = dict(variables["params"])
    params["classifier"] = jax.tree.map(jnp.zeros_like, params["classifier"])
    if jax.process_index() == 0:
        print(f"--weights {Path(config.model.weights).name}: {report}; classifier starts at zero")
    return {**variables, "params": params}


class Training(NamedTuple):
    model: object
    steps: object  # kaggle_utils.train.Steps
    state: object  # host TrainState
    schedule: object


def build_training(config: TrainConfig, plan: Plan, model, variables, *, mesh=None) -> Training:
    """Task, optimizer (frozen parts), compiled steps and the initial state of a resolved config."""
    from . import surgery
    from .train import StepConfig, create_train_state, make_optimizer, make_steps, warmup_cosine

    schedule = warmup_cosine(plan.peak_lr, plan.total_steps, warmup_steps=plan.warmup_steps)
    frozen = None
    if config.model.freeze:
        try:
            frozen = surgery.freeze_mask(variables["params"], list(config.model.freeze))
        except surgery.SurgeryError as err:
            raise ConfigError(f"--freeze: {err}") from None
    tx = make_optimizer(schedule, weight_decay=config.optim.weight_decay, clip_norm=config.optim.clip_norm,
                        frozen=frozen)
    step_config = StepConfig(num_classes=config.model.num_classes, mean=plan.mean, std=plan.std,
                             task=make_task(config), ema_decay=config.optim.ema_decay or 0.999,
                             tta_flip=config.task.tta)
    trained = surgery.freeze_batchnorm(model, list(config.model.freeze)) if config.model.freeze else model
    steps = make_steps(trained, tx, step_config, mode=config.loop.mode, mesh=mesh)
    state = jax.device_get(create_train_state(variables, tx, seed=config.seed, ema=config.optim.ema_decay > 0))
    return Training(model, steps, state, schedule)


# --------------------------------------------------------------------------- the run


def run_manifest(config: TrainConfig, plan: Plan) -> dict:
    """What every checkpoint of a run carries: enough for :func:`load_run` to rebuild its model."""
    return {"kind": "kaggle_utils run", "config": config.to_dict(), "plan": dataclasses.asdict(plan)}


def fit_run(config: TrainConfig, plan: Plan, data: RunData, training: Training, out_dir: str | Path | None, *,
            resume: bool = False, progress: bool = True, hooks=(), writers=()):
    """The loop over ``data`` with the config's intervals, monitor and writers (TensorBoard in ``out_dir``)."""
    from .data import load_dataset
    from .train import TensorBoardWriter, fit

    per_process = plan.global_batch // jax.process_count()

    def train_batches(epoch):
        dataset = load_dataset(data.splits["train"], labeled=True, image_size=config.model.image_size,
                               batch_size=per_process, augment=None if config.data.augment == "none" else
                               config.data.augment, drop_remainder=True, repeat=True,
                               seed=config.seed * 100_003 + epoch, skip_errors=config.data.skip_errors)
        try:
            yield from dataset
        finally:
            dataset.close()

    val_dataset = load_dataset(data.splits["val"], labeled=True, image_size=config.model.image_size,
                               batch_size=plan.global_batch, ordered=True, process_index=0, process_count=1,
                               skip_errors=config.data.skip_errors)
    writers = list(writers)
    if out_dir is not None and config.loop.tensorboard and jax.process_index() == 0:
        writers.append(TensorBoardWriter(Path(out_dir) / "tensorboard"))
    loop = config.loop
    return fit(training.steps, training.state, train_batches, steps_per_epoch=plan.steps_per_epoch,
               total_steps=plan.total_steps, val_batches=lambda: iter(val_dataset), out_dir=out_dir,
               monitor=loop.monitor, monitor_mode=loop.monitor_mode, min_delta=loop.min_delta,
               patience=loop.patience, log_every=loop.log_every, eval_every=loop.eval_every,
               checkpoint_every=loop.checkpoint_every, keep=loop.keep_checkpoints, lr_schedule=training.schedule,
               hooks=hooks, writers=writers, resume=resume, manifest=run_manifest(config, plan), progress=progress)


def _checkpoint_file(path: Path) -> Path:
    if path.is_dir():
        for name in ("best.msgpack", "last.msgpack"):
            if (path / name).is_file():
                return path / name
        raise checkpoint.CheckpointError(f"{path} holds no best.msgpack or last.msgpack: not a run folder of the kit")
    if not path.is_file():
        raise checkpoint.CheckpointError(f"{path} does not exist")
    return path


def load_run(path: str | Path) -> tuple[object, dict, TrainConfig]:
    """``(model, variables, config)`` of a run folder (its best checkpoint) or of one of its checkpoints.

    ``variables`` are the evaluation variables (the EMA weights when the run kept them), checked
    leaf by leaf against the model the config builds.
    """
    from .variable_trees import abstract_variables

    file = _checkpoint_file(Path(path))
    manifest_file = checkpoint.manifest_path(file)
    if not manifest_file.is_file():
        raise checkpoint.CheckpointError(f"{file} has no manifest {manifest_file.name} beside it: cannot tell which "
                                         "run wrote it")
    manifest = json.loads(manifest_file.read_text())
    if "config" not in manifest:
        what = manifest.get("model") if isinstance(manifest.get("model"), str) else None
        raise checkpoint.CheckpointError(
            f"{file} is not a checkpoint of a training run" + (f": it holds ported {what} weights (weights_port); "
                                                               f"fine-tune them with train --weights {file}"
                                                               if what else " (its manifest has no 'config')"))
    config = TrainConfig.from_dict(manifest["config"], where=f"{manifest_file} config")
    model = build_model(config)
    raw = checkpoint.load(file)
    if "state" in raw:  # last.msgpack / ckpt-*.msgpack: the whole training state
        state = raw["state"]
        params = state.get("ema_params") or state["params"]
        raw = {"params": params, "batch_stats": state.get("batch_stats", {})}
    variables = {k: raw[k] for k in ("params", "batch_stats") if k in raw}
    size = config.model.image_size
    template = abstract_variables(model, jax.ShapeDtypeStruct((1, size, size, 3), jnp.float32))
    checkpoint.check_tree(variables, template, what=f"checkpoint {file} for {config.model.name} with "
                                                   f"{config.model.num_classes} classes")
    return model, jax.tree.map(lambda v, t: np.asarray(v, t.dtype), variables, template), config
