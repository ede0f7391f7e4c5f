"""Defaults from what the kit knows about the data: each ``auto`` crop and multi-label field settled, with its reason.

What is known before a step runs: the side the images are stored at against the training size, and, for a
``--source`` the kit converted, the photos' own side (``class_names.json``: 32 px CIFAR photos stored at 96 px hold
32 px of detail); single- or multi-label, and whether every training image has a class; the model's pretrained
``crop_pct``. The rules, each measured in bench/README.md ("Fine-tuning real photos"):

* training crop: a random-resized crop (+ flip) where the stored photo holds more real pixels than the training
  size, its smallest area ``(image size / real side)^2`` so that the smallest crop still holds the training size in
  real pixels (at least timm's 0.08); else a flip of the whole image (a crop would only re-enlarge pixels); nothing
  on the embedded digits sample (a mirrored digit is not a digit);
* evaluation: after random-resized crops, the model's pretrained ``crop_pct`` centre crop (the crops enlarged what
  they kept, so evaluation enlarges the centre as timm does); after whole images, the whole image;
* multi-label: a threshold per class, learnt on the validation split after training
  (:mod:`kaggle_utils.run.thresholds`), and at least one class per row where every training image has one.

The number of images and epochs choose nothing yet: no bench measured a rule on them.
"""
from .. import models
from ..config import ConfigError, TrainConfig
from .data import SAMPLE, RunData

MIN_CROP_SCALE = 0.08  # timm's RandomResizedCrop's smallest area


def settled(config: TrainConfig, name: str):
    """``config.data``'s ``name``, refused while ``auto``: :func:`~kaggle_utils.run.resolve` chooses it from the data."""
    if (value := getattr(config.data, name)) == "auto":
        raise ConfigError(f"--{name.replace('_', '-')} auto is chosen from the data by run.resolve: resolve first")
    return value


def real_side(data: RunData) -> int:
    """The side of real detail in the stored images: the stored side, or the photos' own where they were smaller
    (enlarged by the conversion)."""
    return min(data.stored_size, data.source_side) if data.source_side else data.stored_size


def describe_data(data: RunData, size: int) -> str:
    """The stored images against the training ``size``, as the plan line says it."""
    if data.description == SAMPLE:
        return "the embedded digits sample"
    real = real_side(data)
    if real < data.stored_size:
        return f"{real} px photos enlarged to {data.stored_size} px: {real / size:.2f}x the training size in detail"
    return f"images stored at {real / size:.2f}x the training size, {real} px for {size}"


def settle_data_defaults(config: TrainConfig, data: RunData) -> tuple[TrainConfig, tuple[str, ...]]:
    """``config`` with its ``auto`` crop, storage and multi-label fields chosen for ``data`` (image size resolved),
    and the plan line's words for each choice and its reason."""
    d, size = config.data, config.model.image_size
    real, facts = real_side(data), describe_data(data, size)
    changes, reasons = {"store_size": data.stored_size}, []
    crop, scale = d.train_crop, d.crop_scale
    if crop == "random-resized" and scale == "auto" or crop == "auto":
        if crop == "auto":
            crop = ("random-resized" if scale != "auto" or real > size else
                    "none" if data.description == SAMPLE else "flip")
        if crop == "random-resized" and scale == "auto":
            scale = changes["crop_scale"] = round(min(1.0, max(MIN_CROP_SCALE, (size / real) ** 2)), 2)
        changes["train_crop"] = crop
        why = {"none": "a mirrored digit is no digit", "flip": "no more detail than the training size to crop",
               "random-resized": f"--crop-scale {scale:g} given" if d.crop_scale != "auto" else
               f"the smallest crop keeps {size} px of real detail"}[crop]
        shown = f"random-resized {scale:g}-1 + flip" if crop == "random-resized" else crop
        reasons.append(f"train crop: {shown} ({facts}: {why})")
    if d.crop_pct == "auto":
        pct = models.registered(config.model.name).crop_pct if crop == "random-resized" else None
        changes["crop_pct"] = pct
        reasons.append(f"evaluation: centre crop {pct:g} (the model's pretrained crop_pct, after random-resized "
                       "crops)" if pct else "evaluation: the whole image (as trained)")
    task = config.task
    if task.task == "multilabel":
        if task.threshold == "auto":
            reasons.append("thresholds: one per class, the F1-best on the validation split after training (0.5 "
                           "while training)")
        if task.min_labels == "auto":
            least = 0 if data.unlabelled else 1
            changes["min_labels"] = least
            reasons.append(f"at least {least} class per row ({data.unlabelled} training image(s) without a class)"
                           if least == 0 else "at least 1 class per row (every training image has one)")
    return config.replace(**changes), tuple(reasons)
