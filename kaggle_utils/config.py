"""``TrainConfig``: everything that defines a training run, written once, with the recipe as defaults.

The notebook builds one (``TrainConfig().replace(lr=3e-3, epochs=5)``), the job builds one from its
flags, and both hand it to :mod:`kaggle_utils.run`. A field's type, default and ``help`` become its flag
(``lr`` -> ``--lr``, unless the metadata names another: ``flag="model"``), so a field added here appears in
``--help`` and ``config.json`` with no other edit. The values a field may take sit beside it (``valid``, or
``choices``: a :mod:`~kaggle_utils.registry` where the code that dispatches on the name registers it) and a
section's rules in its ``_rules``: :meth:`TrainConfig.check` refuses the others, naming the flag, before a run
writes anything. Each component is built from its own section (``make_task(config.task)``, ``make_optimizer(...,
config.optim)``, ``fit(..., config.loop)``), so a value has one home and one hop. ``--resume`` compares
``config.json`` field by field (:func:`differences`).

Size: one concern, the config. Half of it is the fields of its six sections, each with its help text and valid
values (the flags' ``--help``), the other half the machinery that turns those fields into flags, checks and JSON;
the two change together (a field's metadata is what the machinery reads), so they stay in one module. The
default batch rule (:meth:`DataConfig.global_batch`) sits beside the batch fields it reads, so the notebook's
defaults and the job's have one home; splitting the sections from the machinery would leave each half unreadable
without the other.
"""
import argparse
import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any

from .registry import INTERPOLATIONS, OPTIMIZERS, SCHEDULES, TASKS, TRAIN_CROPS, Registry


class ConfigError(ValueError):
    """A config value that cannot run; the message names the flag."""


def int_in(low: int, high: int | None = None):
    """An argparse ``type`` for an integer in ``[low, high]``: a value no command can use is a usage error naming
    the flag, not a traceback from deep inside the work."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{value} is not in [{low}, {high if high is not None else 'inf'}]")
        return value

    parse.__name__ = "integer"  # argparse names the type in its message
    return parse


def _or_word(parse, word: str, value, name: str | None = None):
    """A flag type that also takes ``word`` as ``value``: ``none`` for a field whose default is None, ``auto`` where
    the kit chooses (metadata ``parse``: the annotation cannot say)."""
    def parse_or_word(text: str):
        return value if text.strip().lower() == word else parse(text)
    parse_or_word.__name__ = name or parse.__name__  # argparse names the type in its message
    return parse_or_word


def learning_rate(text: str) -> float:
    """``--lr``'s number: > 0, per 256 images."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text} is not a learning rate: it must be a finite number > 0 (per 256 "
                                         "images, e.g. 0.01) or auto")
    return value


# what a field may hold: (test, the words of the refusal "--flag VALUE: words")
AT_LEAST_1 = (lambda v: v >= 1, "must be at least 1")
POSITIVE = (lambda v: v > 0 and math.isfinite(v), "must be a finite number > 0")
NOT_NEGATIVE = (lambda v: v >= 0 and math.isfinite(v), "must be >= 0 (0: off)")
RANDAUGMENT_ROUTES = ("randaugment", "imgaug", "randaugment-device")  # the --augment choices that read the magnitude


def within(interval: str, why: str = ""):
    """Values in ``interval``, written as the refusal shows it: ``"[0, 1)"``, ``"(0, 1]"``."""
    low, high = (float(end) for end in interval[1:-1].split(","))
    closed_low, closed_high = interval[0] == "[", interval[-1] == "]"
    return (lambda v: (v >= low if closed_low else v > low) and (v <= high if closed_high else v < high),
            f"must be in {interval}" + (f" ({why})" if why else ""))


def _auto_or_number(name: str, value) -> None:
    """Refuses a string other than ``auto`` in a field whose flag takes a number or auto (the Python API's way in)."""
    if isinstance(value, bool) or isinstance(value, str) and value != "auto":
        raise ConfigError(f"{flag_of(name)} {value!r}: must be a number or auto")


def _field(default, help: str, **metadata):
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable defaults are not allowed in a frozen config")
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


class _Section:
    """A section's :meth:`check`: each field's ``valid`` values and ``choices``, then the section's rules across
    fields."""

    def check(self) -> None:
        for field in dataclasses.fields(self):
            value, flag = getattr(self, field.name), flag_of(field.metadata.get("flag", field.name))
            test, words = field.metadata.get("valid", (None, ""))
            if test is not None and isinstance(value, (int, float)) and not test(value):
                raise ConfigError(f"{flag} {value}: {words}")
            choices = field.metadata.get("choices")
            if choices is not None and value not in choices:
                raise ConfigError(f"{flag} {value!r}: choose one of {', '.join(choices)}")
        self._rules()

    def _rules(self) -> None:
        """Refusals that read several fields of the section."""

    def _unread(self, *chosen: tuple[str, Registry]) -> None:
        """Refuses an option field given (not its default) that the choices made (``(field, its registry)``) would
        not read: ``--momentum`` with ``--optimizer adamw`` is a mistake, not a setting."""
        default = type(self)()
        read = {option for name, registry in chosen for option in registry[getattr(self, name)].reads}
        unread = [flag_of(option) for _, registry in chosen for option in registry.option_fields()
                  if option not in read and getattr(self, option) != getattr(default, option)]
        if unread:
            choices = " ".join(f"{flag_of(name)} {getattr(self, name)}" for name, _ in chosen)
            raise ConfigError(f"{' / '.join(unread)} would not be read by {choices}: drop it, or choose what reads it")


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    name: str = _field("tf_efficientnetv2_b0", "a registered model: an EfficientNet (timm's name) or your own "
                                               "(kaggle_utils.models.register_model)", flag="model")
    weights: str | None = _field(None, "ported weights (.msgpack from weights_port) to fine-tune; a new zero head")
    zero_head: bool = _field(True, "with --weights: the new classifier starts at zero (first loss ln C); "
                                   "--no-zero-head: at the model's random init, timm's")
    init_from: str | None = _field(None, "a finished run folder (its best checkpoint) or one of its checkpoints: "
                                         "start from its weights, classifier included (same --model and classes); "
                                         "unlike --weights (a new head) and --resume (the same run)")
    freeze: tuple[str, ...] = _field((), "with --weights or --init-from: regex of parameter paths to keep frozen "
                                         "(repeatable)")
    num_classes: int | None = _field(None, "number of classes (default: from the data)", valid=AT_LEAST_1)
    image_size: int | None = _field(None, "image side the model sees (default: the data's stored size)",
                                    valid=AT_LEAST_1)
    precision: str = _field("auto", "compute precision: auto (bf16 on TPU and GPUs of compute capability 8.0+, fp16 "
                                    "+ loss scaling on older GPUs such as the T4, fp32 on CPU) | fp32 | bf16 | fp16; "
                                    "weights, optimizer state and BatchNorm statistics stay fp32",
                            choices=("auto", "fp32", "bf16", "fp16"))
    drop_rate: float = _field(0.2, "dropout before the classifier", valid=within("[0, 1)"))
    drop_path_rate: float = _field(0.1, "stochastic depth rate", valid=within("[0, 1)"))
    sync_bn: bool = _field(True, "BatchNorm statistics over the global batch")
    remat: str = _field("none", "none | blocks: recompute each block's activations in the backward pass (less "
                                "memory, more compute)", choices=("none", "blocks"))
    head_multiple: int | None = _field(None, "pad the classifier's outputs to a multiple of this, masked out "
                                             "(default 128 on TPU, 1 elsewhere)", valid=AT_LEAST_1)

    def _rules(self):
        if self.weights and self.init_from:
            raise ConfigError("--weights (a new head) and --init-from (a run's weights, head included) exclude each "
                              "other")
        if self.freeze and not (self.weights or self.init_from):
            raise ConfigError("--freeze needs --weights or --init-from (freezing a randomly initialised network is a "
                              "mistake)")
        if not self.zero_head and not self.weights:
            raise ConfigError("--no-zero-head needs --weights: only a new head on ported weights starts at zero")


@dataclasses.dataclass(frozen=True)
class DataConfig(_Section):
    data_dir: str | None = _field(None, "folder of train/, val/ and optionally test/ TFRecords (default: the "
                                        "embedded digits sample)")
    source: str | None = _field(None, "instead of --data-dir: class folders DIR/<class>/*.jpg, a CSV of id + label "
                                      "(images in --image-dir), or tfds:NAME[:SPLIT]; converted once into OUT/data")
    test_source: str | None = _field(None, "with --source: unlabeled test images (a folder or a CSV of ids)")
    image_dir: str | None = _field(None, "with a CSV source: the images' folder (default: the CSV's folder)")
    test_image_dir: str | None = _field(None, "with a CSV --test-source: its images' folder (default: --image-dir)")
    tfds_data_dir: str | None = _field(None, "with a tfds:NAME source: the folder it is prepared in (default: tfds's)")
    id_column: str | None = _field(None, "the CSV's and the submission's id column (default: the records' own, "
                                         "else id)")
    label_column: str | None = _field(None, "the CSV's and the submission's label column (default: the records' "
                                            "own, else label)")
    val_fraction: float = _field(0.15, "with --source: stratified share of each class held out for validation",
                                 valid=within("(0, 1)"))
    class_names: tuple[str, ...] = _field((), "submission labels by class index (default: the records' own; empty: "
                                              "the index itself)")
    batch_size: int | None = _field(None, "GLOBAL batch over all devices (default 16 per device, at least 64)",
                                    valid=AT_LEAST_1)
    batch_per_device: int | str | None = _field(None, "batch per device instead of --batch-size; auto: the largest "
                                                      "whose compiled train step fits the device, less a margin",
                                                parse=_or_word(int, "auto", "auto", "integer or auto"),
                                                valid=AT_LEAST_1)
    memory_budget: float | None = _field(None, "with --batch-per-device auto: GiB a device may use (default: what "
                                               "a GPU or TPU reports; a CPU needs it)", resume_may_change=True,
                                         valid=POSITIVE)
    augment: str = _field("none", "none | randaugment (TF, host) | imgaug (worker processes) | randaugment-device "
                                  "(JAX, in the jitted step) | color-jitter (timm's default brightness, contrast and "
                                  "saturation jitter; TF, host)",
                          choices=("none", *RANDAUGMENT_ROUTES, "color-jitter"))
    randaugment_magnitude: float = _field(15.0, "RandAugment's magnitude on imgaug's 0-30 scale, every RandAugment "
                                                "route (with --progressive-stages: the last stage's)",
                                          valid=within("[0, 30]", "imgaug's scale"))
    color_jitter: float = _field(0.4, "with --augment color-jitter: the strength of each of brightness, contrast and "
                                      "saturation (factors in [1 - s, 1 + s]; timm's --color-jitter)",
                                 valid=within("(0, 1]"))
    mixup_alpha: float = _field(0.0, "Mixup's Beta(alpha, alpha) (0: off); on the device", valid=NOT_NEGATIVE)
    cutmix_alpha: float = _field(0.0, "CutMix's Beta(alpha, alpha) (0: off)", valid=NOT_NEGATIVE)
    mix_prob: float = _field(1.0, "probability of mixing a batch", valid=within("[0, 1]"))
    mix_switch_prob: float = _field(0.5, "probability of CutMix instead of Mixup when both are on",
                                    valid=within("[0, 1]"))
    train_crop: str = _field("auto", "training crop", choices=TRAIN_CROPS)
    crop_scale: float | str = _field("auto", "with --train-crop random-resized: the smallest share of the image's "
                                             "area a crop takes (timm's 0.08); auto: (image size / stored size)^2, so "
                                             "the smallest crop keeps the training size in real pixels, within "
                                             "[0.08, 1]", parse=_or_word(float, "auto", "auto", "number or auto"),
                                     valid=within("(0, 1]"))
    interpolation: str = _field("bilinear", "the resize filter of the training crops and the evaluation resize "
                                            "(antialiased where it shrinks, as PIL): bilinear, or bicubic, timm's for "
                                            "most pretrained weights", choices=INTERPOLATIONS)
    eval_image_size: int | None = _field(None, "image side for evaluation and prediction (FixRes; default "
                                               "--image-size)", valid=AT_LEAST_1)
    crop_pct: float | str | None = _field("auto", "evaluation center crop: resize to size / crop_pct, crop the "
                                                  "center (timm's rule, e.g. 0.875); none or 1: a plain resize; auto: "
                                                  "the model's pretrained crop_pct after random-resized training "
                                                  "crops, else a plain resize",
                                          parse=_or_word(float, "auto", "auto", "number or auto"),
                                          valid=within("(0, 1]"))
    store_size: int | str = _field("auto", "with --source: the side images are stored at, shorter side resized then "
                                           "the centre square (aspect ratio kept); auto: their own (median shorter) "
                                           "side, at least the image size, at most twice it",
                                   parse=_or_word(int, "auto", "auto", "integer or auto"), valid=AT_LEAST_1)
    skip_errors: bool = _field(False, "skip unreadable records (counted and reported) instead of stopping")
    deterministic: bool = _field(True, "the same batches in the same order for a seed, on any number of cores, so "
                                       "--resume continues exactly; --no-deterministic: images as they are ready "
                                       "(a little faster, order varies)")

    def _rules(self):
        if self.source is not None and self.data_dir is not None:
            raise ConfigError("--source and --data-dir exclude each other: give the records folder or the source")
        if self.source is None and (self.test_source is not None or self.test_image_dir is not None):
            raise ConfigError("--test-source and --test-image-dir need --source (the training images); with "
                              "--data-dir the test split is DIR/test/")
        if self.source is None and self.tfds_data_dir is not None:
            raise ConfigError(f"--tfds-data-dir {self.tfds_data_dir} goes with --source tfds:NAME (it says where that "
                              "dataset is prepared); with --data-dir it reads nothing")
        repeated = sorted({name for name in self.class_names if self.class_names.count(name) > 1})
        if repeated:
            raise ConfigError(f"--class-names repeats {', '.join(map(repr, repeated))}: the submission could not "
                              "tell those classes apart; give each class its own name")
        if self.augment not in RANDAUGMENT_ROUTES and self.randaugment_magnitude != DataConfig.randaugment_magnitude:
            raise ConfigError("--randaugment-magnitude needs --augment randaugment, imgaug or randaugment-device: "
                              f"with --augment {self.augment} nothing would use it")
        if self.augment != "color-jitter" and self.color_jitter != DataConfig.color_jitter:
            raise ConfigError(f"--color-jitter needs --augment color-jitter: with --augment {self.augment} nothing "
                              "would use it")
        if self.batch_size is not None and self.batch_per_device is not None:
            raise ConfigError("--batch-size (global) and --batch-per-device exclude each other: give one")
        if isinstance(self.batch_per_device, str) and self.batch_per_device != "auto":
            raise ConfigError(f"--batch-per-device {self.batch_per_device!r}: must be a number or auto")
        for name in ("crop_scale", "crop_pct", "store_size"):
            _auto_or_number(name, getattr(self, name))
        if self.crop_scale != "auto" and self.train_crop not in TRAIN_CROPS.settled \
                and "crop_scale" not in TRAIN_CROPS[self.train_crop].reads:
            readers = [name for name in TRAIN_CROPS.built() if "crop_scale" in TRAIN_CROPS[name].reads]
            raise ConfigError(f"--crop-scale {self.crop_scale:g} is read by --train-crop {' or '.join(readers)} (or "
                              f"auto), not --train-crop {self.train_crop}: drop it, or choose {' or '.join(readers)}")
        if self.memory_budget is not None and self.batch_per_device != "auto":
            raise ConfigError(f"--memory-budget {self.memory_budget:g} is read only with --batch-per-device auto: "
                              "give both, or neither")

    def global_batch(self, devices: int) -> int:
        """Images per step on ``devices``: ``--batch-per-device`` on each, ``--batch-size``, or the default: 16 per
        device, raised to the smallest multiple of ``devices`` that is at least 64 (BatchNorm statistics and the LR
        scale want some examples per step): 128 on 8 devices, 64 on 1, 66 on 3."""
        if self.batch_per_device == "auto":
            raise ConfigError("--batch-per-device auto is chosen by run.resolve (it compiles the train step); "
                              "global_batch needs a number")
        if self.batch_per_device is not None:
            return self.batch_per_device * devices
        return self.batch_size if self.batch_size is not None else max(16 * devices, -(-64 // devices) * devices)


@dataclasses.dataclass(frozen=True)
class OptimConfig(_Section):
    optimizer: str = _field("adamw", "the optimizer (optax), each with its own default --lr and --weight-decay",
                            choices=OPTIMIZERS)
    lr: float | str | None = _field(None, "peak learning rate per 256 images (scaled to the global batch), or auto: an "
                                          "LR range test picks it before the run (default: the optimizer's, as "
                                          "--optimizer lists them)",
                                    parse=_or_word(learning_rate, "auto", "auto", "learning rate"), valid=POSITIVE)
    lr_find_steps: int | None = _field(None, "with --lr auto: steps of the range test (default: 100, fewer for a "
                                             "shorter run, at least 40)", resume_may_change=True,
                                       valid=(lambda v: v >= 10, "must be at least 10 (the range test's curve)"))
    schedule: str = _field("cosine", "the learning rate after the warmup", choices=SCHEDULES)
    end_lr_factor: float = _field(0.0, "cosine and linear schedules: the last rate as a fraction of the peak",
                                  valid=within("[0, 1]"))
    decay_epochs: float | None = _field(None, "step schedule: epochs between drops (default: a third of the steps "
                                              "after the warmup)", valid=POSITIVE)
    decay_rate: float = _field(0.1, "step schedule: each drop multiplies the rate by this", valid=within("(0, 1]"))
    warmup_epochs: float = _field(1.0, "linear warmup in epochs (at most --warmup-max-fraction of the run)",
                                  valid=NOT_NEGATIVE)
    warmup_max_fraction: float = _field(0.2, "the largest share of the run's steps the warmup takes",
                                        valid=within("[0, 1)"))
    weight_decay: float | None = _field(None, "weight decay of matrices and kernels (default: the optimizer's, as "
                                              "--optimizer lists them; sgd's as L2 on the gradient)",
                                        valid=NOT_NEGATIVE)
    momentum: float = _field(0.9, "sgd's momentum (0: none)", valid=within("[0, 1)"))
    nesterov: bool = _field(False, "sgd: Nesterov momentum")
    b1: float | None = _field(None, "adamw, lamb, lion: the first moment's decay (default 0.9)", valid=within("[0, 1)"))
    b2: float | None = _field(None, "adamw, lamb, lion: the second moment's decay (default 0.999; lion 0.99)",
                              valid=within("[0, 1)"))
    clip_norm: float | None = _field(1.0, "clip gradients to this global norm (none: no clipping)", valid=POSITIVE)
    ema_decay: float = _field(0.0, "EMA of the weights for evaluation (0: off)", valid=within("[0, 1)"))
    accumulate_steps: int = _field(1, "micro-batches per optimizer step: the memory of a K times smaller batch (each "
                                      "normalised by BatchNorm on its own)", valid=AT_LEAST_1)
    layer_decay: float | None = _field(None, "lr x D^(depth from the head) for the stem and each stage, timm's "
                                             "--layer-decay per stage (none: off)",
                                       valid=within("(0, 1]", "above 1 the early layers would learn fastest"))
    head_lr_mult: float = _field(1.0, "the classifier's lr x M (to keep it fixed: --freeze classifier)",
                                 valid=POSITIVE)

    def _rules(self):
        if isinstance(self.lr, bool) or isinstance(self.lr, str) and self.lr != "auto":
            raise ConfigError(f"--lr {self.lr!r}: must be a finite number > 0 (per 256 images) or 'auto'")
        self._unread(("optimizer", OPTIMIZERS), ("schedule", SCHEDULES))
        if self.nesterov and not self.momentum:
            raise ConfigError("--nesterov needs --momentum > 0")


@dataclasses.dataclass(frozen=True)
class TaskConfig(_Section):
    task: str = _field("softmax", "loss and metrics", choices=TASKS)
    label_smoothing: float = _field(0.1, "label smoothing of the training targets", valid=within("[0, 1)"))
    focal_gamma: float = _field(2.0, "focal loss gamma (task focal)", valid=NOT_NEGATIVE)
    threshold: float | str = _field("auto", "task multilabel: a class is predicted above this probability; auto: a "
                                            "threshold per class, the one maximising its F1 on the validation split "
                                            "(OUT/thresholds.json; 0.5 during training)",
                                    parse=_or_word(float, "auto", "auto", "number or auto"), valid=within("(0, 1)"))
    min_labels: int | str = _field("auto", "task multilabel: a row with fewer classes above the threshold gets the "
                                           "most probable ones up to this many; auto: 1 where every training image "
                                           "has a class, else 0 (rows may be empty)",
                                   parse=_or_word(int, "auto", "auto", "integer or auto"), valid=NOT_NEGATIVE)
    tta: bool = _field(False, "average predictions with horizontally flipped images")

    def _rules(self):
        for name in ("threshold", "min_labels"):
            _auto_or_number(name, getattr(self, name))


@dataclasses.dataclass(frozen=True)
class LoopConfig(_Section):
    epochs: int = _field(10, "epochs to train (of --steps-per-epoch steps)", valid=AT_LEAST_1)
    steps: int | None = _field(None, "total steps instead of --epochs", valid=AT_LEAST_1)
    steps_per_epoch: int | None = _field(None, "default: training examples // global batch", valid=AT_LEAST_1)
    eval_every: int | None = _field(None, "evaluate every N steps (default: at each epoch end)", valid=AT_LEAST_1)
    checkpoint_every: int | None = _field(None, "write last.msgpack every N steps too (default: at each evaluation)",
                                          valid=AT_LEAST_1)
    keep_checkpoints: int = _field(1, "checkpoints kept besides best.msgpack: last.msgpack + K-1 older ckpt-STEP",
                                   valid=AT_LEAST_1)
    log_every: int = _field(20, "steps between metric pulls (progress bar, TensorBoard)", resume_may_change=True,
                            valid=AT_LEAST_1)
    monitor: str = _field("val_f1", "history column that picks best.msgpack (e.g. val_loss, val_acc, train_loss)")
    monitor_mode: str = _field("auto", "min | max | auto (the metric's own direction: min for a loss)",
                               choices=("auto", "min", "max"))
    min_delta: float = _field(0.0, "an improvement must beat the best by more than this", valid=NOT_NEGATIVE)
    patience: int | None = _field(None, "stop after this many evaluations without improvement", valid=AT_LEAST_1)
    tensorboard: bool = _field(True, "TensorBoard event files in OUT/tensorboard", resume_may_change=True)
    wandb: str | None = _field(None, "log the run to this Weights & Biases project (--wandb alone: kaggle-utils); "
                                     "offline in OUT/wandb where W&B is out of reach (no API key or no internet): "
                                     "`wandb sync` uploads it later", nargs="?", const="kaggle-utils",
                               resume_may_change=True)
    wandb_artifact: bool = _field(False, "with --wandb: upload best.msgpack as a model artifact",
                                  resume_may_change=True)
    mode: str = _field("jit", "jit (jit + shard_map) or pmap", choices=("jit", "pmap"), resume_may_change=True)
    compile_cache: str | None = _field(None, "JAX's persistent compilation cache, kept between sessions (default: "
                                             "OUT/jax_cache)", resume_may_change=True)
    progressive_stages: int = _field(0, "EfficientNetV2's progressive learning in N stages of whole epochs (0: off): "
                                        "size from --progressive-min-size, RandAugment from 5, Mixup / CutMix from 0 "
                                        "to their flags' values", valid=NOT_NEGATIVE)
    progressive_min_size: int | None = _field(None, "with --progressive-stages: the size the stages grow from (default "
                                                    "128, at most half --image-size)")
    progressive_rule: str = _field("official", "with --progressive-stages: stage sizes by official (google/automl's "
                                               "code: stage i of N at min + (size - min)(i + 1)/N, none at the "
                                               "minimum) | paper (Algorithm 1: min + (size - min) i/(N - 1), the first "
                                               "at the minimum)", choices=("official", "paper"))
    progressive_dropout: bool = _field(False, "with --progressive-stages: grow the dropout too, from 0.1")

    def total_steps(self, steps_per_epoch: int) -> int:
        """The run's length: ``--steps``, else ``--epochs`` of ``steps_per_epoch`` (the last epoch may be shorter)."""
        return self.steps or self.epochs * steps_per_epoch

    def _rules(self):
        n = self.progressive_stages
        if n == 0:
            given = [flag for flag, value in (("--progressive-min-size", self.progressive_min_size is not None),
                                              ("--progressive-dropout", self.progressive_dropout),
                                              ("--progressive-rule", self.progressive_rule != "official")) if value]
            if given:
                raise ConfigError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --progressive-stages "
                                  "N (N >= 2): without stages nothing would use them")
        elif n == 1:
            raise ConfigError("--progressive-stages 1: one stage is a fixed-size run; give 2 or more (the paper: 4), "
                              "or 0 (off)")
        elif self.steps is not None:
            raise ConfigError(f"--progressive-stages {n} needs --epochs, not --steps: each stage is a whole number of "
                              "epochs")
        elif self.epochs < n:
            raise ConfigError(f"--epochs {self.epochs} cannot make --progressive-stages {n}: each stage is a whole "
                              f"number of epochs; give at least {n} epochs, or fewer stages")


@dataclasses.dataclass(frozen=True)
class DistillConfig(_Section):
    teacher: str | None = _field(None, "learn from a finished run's probabilities: a CV folder (its out-of-fold "
                                       "oof.csv: every labelled record predicted by a model that did not train on "
                                       "it), a run or predict folder, or a probabilities CSV (id, a column per class)")
    distill_alpha: float = _field(0.5, "with --teacher: the teacher's share of each target, alpha x teacher + "
                                       "(1 - alpha) x label", valid=within("(0, 1]"))
    distill_temperature: float = _field(1.0, "with --teacher: both sides' logits / T, the teacher term x T^2 "
                                             "(Hinton et al.; a teacher's logits are its log-probabilities)",
                                        valid=POSITIVE)
    pseudo_labels: str | None = _field(None, "train on the test images a teacher is sure of: a CV folder (its "
                                             "test_probabilities.csv), a run or predict folder (probabilities.csv), "
                                             "or a CSV; never in validation or a fold's held-out part")
    pseudo_threshold: float = _field(0.9, "with --pseudo-labels: a test image joins when the teacher's top "
                                          "probability is at least P (multilabel: each class's within 1 - P of 0 "
                                          "or 1)", valid=within("(0, 1]"))
    pseudo_targets: str = _field("soft", "with --pseudo-labels: soft (the teacher's probabilities) | hard (its top "
                                         "class; multilabel: the classes above --threshold)", choices=("soft", "hard"))

    def _rules(self):
        default = DistillConfig()
        for path, flags in (("teacher", ("distill_alpha", "distill_temperature")),
                            ("pseudo_labels", ("pseudo_threshold", "pseudo_targets"))):
            given = [flag_of(f) for f in flags if getattr(self, f) != getattr(default, f)]
            if getattr(self, path) is None and given:
                raise ConfigError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} {flag_of(path)}: "
                                  "without it nothing would read them")


def _from_dict(cls, data: dict, where: str = "config"):
    """A config (or section) from its :meth:`TrainConfig.to_dict` form; unknown keys are an error naming them."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"{where} has fields this version of {cls.__name__} does not know: {', '.join(unknown)}")
    values = {}
    for name, value in data.items():
        if dataclasses.is_dataclass(hints[name]):
            value = _from_dict(hints[name], value, f"{where}.{name}")
        values[name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    task: TaskConfig = TaskConfig()
    loop: LoopConfig = LoopConfig()
    distill: DistillConfig = DistillConfig()
    seed: int = _field(0, "seed of the initialisation, data order, dropout and augmentation")

    def check(self) -> "TrainConfig":
        """Refuses a value no run can use, naming its flag (each section's fields and rules); returns the config."""
        for field in dataclasses.fields(self):
            if isinstance(getattr(self, field.name), _Section):
                getattr(self, field.name).check()
        return self

    def replace(self, **changes) -> "TrainConfig":
        """A copy with fields changed by flag name: ``config.replace(lr=1e-3, epochs=3)``; lists become tuples."""
        fields = _flag_table(type(self))
        sections: dict[str, dict] = {}
        top: dict[str, Any] = {}
        for name, value in changes.items():
            key = name.replace("-", "_")
            if key not in fields:
                raise ConfigError(f"{type(self).__name__} has no field {name!r}; fields: {', '.join(sorted(fields))}")
            section, field = fields[key]
            (sections.setdefault(section, {}) if section else top)[field.name] = \
                tuple(value) if isinstance(value, list) else value
        for section, values in sections.items():
            top[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **top)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def flat(self) -> dict[str, Any]:
        """``{flag name: value}`` of every field: the config as W&B and TensorBoard's HParams list it."""
        return {name: getattr(getattr(self, section) if section else self, field.name)
                for name, (section, field) in _flag_table(type(self)).items()}

    from_dict = classmethod(_from_dict)


# --------------------------------------------------------------------------- fields and flags


def _leaves(cls) -> list[tuple[str | None, type, dataclasses.Field]]:
    """(section attribute or None, its class, field) of every leaf field: the sections' fields, then the top level's."""
    hints = typing.get_type_hints(cls)
    nested = [(f.name, hints[f.name]) for f in dataclasses.fields(cls) if dataclasses.is_dataclass(hints[f.name])]
    return [(section, kind, field) for section, kind in [*nested, (None, cls)] for field in dataclasses.fields(kind)
            if not dataclasses.is_dataclass(typing.get_type_hints(kind)[field.name])]


def _flag_table(cls) -> dict[str, tuple[str | None, dataclasses.Field]]:
    """``flag name -> (section, field)``; a name used twice is a programming error, found here."""
    table: dict[str, tuple[str | None, dataclasses.Field]] = {}
    for section, _, field in _leaves(cls):
        name = field.metadata.get("flag", field.name)
        if name in table:
            raise TypeError(f"flag --{name} is defined twice ({table[name][0]} and {section}): rename one field")
        table[name] = (section, field)
    return table


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_flags(parser: argparse.ArgumentParser, cls: type = TrainConfig) -> None:
    """One flag per leaf field of ``cls``, in argument groups by section."""
    defaults, groups = cls().flat(), {}
    for section, kind, field in _leaves(cls):
        if section not in groups:
            groups[section] = parser.add_argument_group(f"{section or 'run'} ({kind.__name__})")
        annotation = typing.get_type_hints(kind)[field.name]
        union = typing.get_origin(annotation) in (typing.Union, types.UnionType)  # int | None: int, optional
        optional = union and type(None) in typing.get_args(annotation)
        scalar = next(a for a in typing.get_args(annotation) if a is not type(None)) if union else annotation
        name, help_text = field.metadata.get("flag", field.name), field.metadata.get("help", "")
        if isinstance(field.metadata.get("choices"), Registry):  # its choices, each with its own words
            help_text += ": " + field.metadata["choices"].describe()
        help_text += "" if "default" in help_text else f" (default: {defaults[name]!r})"
        options: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text.replace("%", "%%")}
        if scalar is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(scalar) is tuple:
            options.update(action="append", metavar=typing.get_args(scalar)[0].__name__.upper())
        else:
            parse = field.metadata.get("parse", scalar)
            options.update(type=_or_word(parse, "none", None) if optional else parse,
                           choices=field.metadata.get("choices"))
            options.update({k: field.metadata[k] for k in ("nargs", "const") if k in field.metadata})
        groups[section].add_argument(flag_of(name), **options)


def config_from_args(args: argparse.Namespace, cls: type = TrainConfig, *, base: TrainConfig | None = None
                     ) -> TrainConfig:
    """The config the command line asks for: ``base`` (default: the defaults), changed by the flags that were given."""
    return (base or cls()).replace(**{name: getattr(args, name) for name in _flag_table(cls) if hasattr(args, name)})


def config_from_file(path, cls: type = TrainConfig) -> TrainConfig:
    """``--config FILE``: a run's ``config.json`` (the flags it was given), ``tune``'s ``best_config.json`` (the
    same), or a :meth:`TrainConfig.to_dict` JSON."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(f"--config {path}: cannot read it as JSON ({err})") from None
    if isinstance(data, dict) and isinstance(data.get("given"), dict):
        try:
            return cls().replace(**data["given"])
        except ConfigError as err:
            raise ConfigError(f"--config {path}: {err}") from None
    return _from_dict(cls, data, f"--config {path}")


def overrides(config: TrainConfig) -> dict[str, Any]:
    """``{flag name: value}`` of the fields that differ from the defaults: what a run changed."""
    return {name: new for name, _, new in differences(type(config)(), config)}


def differences(before: TrainConfig, after: TrainConfig) -> list[tuple[str, Any, Any]]:
    """``(flag name, before, after)`` for every field that differs, in declaration order."""
    old, new = before.flat(), after.flat()
    return [(name, old[name], value) for name, value in new.items() if old[name] != value]


def resume_may_change(name: str, cls: type = TrainConfig) -> bool:
    return bool(_flag_table(cls)[name][1].metadata.get("resume_may_change"))
