"""Which learning rate should a short fine-tune with ``--weights`` get: the default, ``--lr auto``, or a fixed one?

    python bench/lr_defaults.py                   # ~25 min on 2 loaded CPU cores (pretraining included)
    python bench/lr_defaults.py --lrs default auto 0.01 --seeds 0 1

No download: a tiny EfficientNet (``test_efficientnet``, 32 px) is pretrained from scratch on the
kit's synthetic shapes (104 classes), saved by the kit's own save path as a ``--weights`` file
(``checkpoint.save`` + a manifest naming the model, as ``weights_port`` writes them), then
fine-tuned through :func:`kaggle_utils.run.train` on sets of other domains, sizes and lengths,
built from installed packages:

* ``digits``: scikit-learn's 1797 handwritten digits (the kit's sample: 1258 to train), 2 epochs;
* ``digits-few``: 640 of them to train, 4 epochs;
* ``textures``: 32 px patches of 10 grey scikit-image pictures (brick, grass, gravel, camera, coins,
  moon, text, page, cell, clock), a class per picture, 1200 to train, 2 epochs;
* ``photos``: 32 px patches of 9 colour scikit-image photos (astronaut, coffee, chelsea, rocket,
  hubble_deep_field, immunohistochemistry, retina, colorwheel, logo), 1080 to train, 2 epochs.

Every fine-tune is ``STEPS`` steps of a batch of 64 with a 10-way head (the photos leave one class
unused), so the training step of an arm is the same program on every set and compiles once (the
rate is a constant of the compiled schedule: compiling, not training, is most of this script's time).

Training and validation patches come from disjoint parts of each picture (the top 70% and the
bottom 30%), so a patch seen in training is never scored. Every set is fine-tuned with each
``--lrs`` arm (``default``: the kit's default, ``auto``: the range test, or a number per 256
images; 0.002 was the ``--weights`` default this bench replaced), interleaved set by set in one process; the table gives the validation accuracy after the
last epoch (not the best epoch's, which the validation set itself chose) and, for ``auto``, the
rate it found. Figures: bench/README.md.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MODEL, SIZE, BATCH, CLASSES, STEPS = "test_efficientnet", 32, 64, 10, 40


def patches(pictures: dict, per_class: int, rng, *, size: int = SIZE, train_share: float = 0.7):
    """``{split: (images, labels)}`` of random ``size`` crops, train from the top of each picture, val from below."""
    out = {"train": ([], []), "val": ([], [])}
    for label, picture in enumerate(pictures.values()):
        picture = np.asarray(picture)
        if picture.ndim == 2:
            picture = np.repeat(picture[..., None], 3, axis=-1)
        picture = picture[..., :3].astype(np.uint8)
        cut = int(picture.shape[0] * train_share)
        for split, part, count in (("train", picture[:cut], per_class), ("val", picture[cut:], per_class // 3)):
            for _ in range(count):
                y = rng.integers(0, part.shape[0] - size + 1)
                x = rng.integers(0, part.shape[1] - size + 1)
                crop = np.rot90(part[y:y + size, x:x + size], k=int(rng.integers(4)))
                out[split][0].append(crop[:, ::-1] if rng.random() < 0.5 else crop)
                out[split][1].append(label)
    return {split: (np.stack(images), np.asarray(labels)) for split, (images, labels) in out.items()}


def write_set(root: Path, splits: dict) -> Path:
    from kaggle_utils.data import write_split

    for split, (images, labels) in splits.items():
        order = np.random.default_rng(0).permutation(len(labels))
        write_split(root / split, np.ascontiguousarray(images[order]), labels=labels[order].tolist(), num_files=2)
    return root


def digits_subset(sample_root: Path, root: Path, count: int) -> Path:
    """The first ``count`` training digits of the sample and its whole validation split, as a set of their own."""
    from kaggle_utils.data import load_dataset

    splits = {}
    for split, keep in (("train", count), ("val", None)):
        images, labels = [], []
        for batch in load_dataset(str(sample_root / split), labeled=True, image_size=SIZE, batch_size=256,
                                  ordered=True):
            real = np.asarray(batch["mask"]).astype(bool)
            images.append(np.asarray(batch["image"])[real])
            labels.append(np.asarray(batch["label"])[real])
        images, labels = np.concatenate(images), np.concatenate(labels)
        splits[split] = (images[:keep], labels[:keep])
    return write_set(root, splits)


def build_sets(work: Path) -> dict:
    """``{name: data folder}`` of the fine-tune sets, and the pretraining set under ``"pretrain"``."""
    import skimage.data as pictures
    from kaggle_utils.data import make_sample_dataset

    rng = np.random.default_rng(0)
    grey = {n: getattr(pictures, n)() for n in ("brick", "grass", "gravel", "camera", "coins", "moon", "text", "page",
                                                 "cell", "clock")}
    colour = {n: getattr(pictures, n)() for n in ("astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field",
                                                   "immunohistochemistry", "retina", "colorwheel", "logo")}
    digits = make_sample_dataset(work / "digits", image_size=SIZE)
    shapes = make_sample_dataset(work / "shapes", "synthetic", image_size=SIZE, num_examples=104 * 20)
    return {"pretrain": Path(shapes.root),
            "digits": Path(digits.root),
            "digits-few": digits_subset(Path(digits.root), work / "digits_few", 640),
            "textures": write_set(work / "textures", patches(grey, 120, rng)),
            "photos": write_set(work / "photos", patches(colour, 120, rng))}


def config_for(data: Path, lr, seed: int, cache: Path, weights: str | None = None, **changes):
    """One run's config; every run shares one compilation cache (the evaluation steps do not depend on the lr)."""
    from kaggle_utils.config import TrainConfig

    return TrainConfig().replace(data_dir=str(data), model=MODEL, image_size=SIZE, batch_size=BATCH,
                                 lr=TrainConfig().optim.lr if lr == "default" else lr, weights=weights, seed=seed,
                                 tensorboard=False, monitor="val_acc", compile_cache=str(cache), **changes)


def pretrain(data: Path, work: Path, epochs: int = 6) -> str:
    """A backbone trained from scratch on ``data``, saved as a ``--weights`` file the way ported weights are."""
    from kaggle_utils import checkpoint, run

    path = work / "pretrained.msgpack"
    if path.is_file():  # a --work folder of an earlier call: the same pretraining, already done
        print(f"reusing {path}", flush=True)
        return str(path)
    result = run.train(config_for(data, 1e-2, 0, work / "jax_cache", epochs=epochs), work / "pretrain_run",
                       progress=False)
    _, variables, _ = run.load_run(work / "pretrain_run")
    checkpoint.save(path, variables, manifest={"model": MODEL})
    print(f"pretrained on shapes: val_acc {result.history[-1]['val_acc']:.3f}", flush=True)
    return str(path)


def fine_tune(data: Path, lr, seed: int, weights: str, out: Path) -> dict:
    import json

    from kaggle_utils import run

    started = time.perf_counter()
    config = config_for(data, lr, seed, out.parent.parent / "jax_cache", weights, steps=STEPS, num_classes=CLASSES)
    result = run.train(config, out, progress=False, overwrite=True)
    record = json.loads((out / "config.json").read_text())
    return {"acc": result.history[-1]["val_acc"], "lr": result.config.optim.lr, "epochs": result.history[-1]["epoch"],
            "found": record.get("lr_find", {}).get("found"), "seconds": time.perf_counter() - started}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lrs", nargs="+", default=["0.002", "auto", "0.01", "0.03"],
                        help="rates per 256 images, auto, or default (the kit's; 0.002 is its --weights default "
                             "before this bench, 0.01 after)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--sets", nargs="+", default=["digits", "digits-few", "textures", "photos"])
    parser.add_argument("--work", help="folder for the sets and runs (default: a temporary one)")
    args = parser.parse_args(argv)
    arms = [a if a in ("default", "auto") else float(a) for a in args.lrs]
    print(f"load average at start: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="lr_defaults_") as tmp:
        work = Path(args.work or tmp)
        sets = build_sets(work)
        weights = pretrain(sets["pretrain"], work)
        results = {}
        for name in args.sets:
            for seed in args.seeds:
                for arm in arms:
                    row = fine_tune(sets[name], arm, seed, weights, work / "runs" / f"{name}_{arm}_{seed}")
                    results.setdefault((name, arm), []).append(row)
                    print(f"{name} ({row['epochs']} ep) lr {arm}: val_acc {row['acc']:.3f} at lr {row['lr']:.3g} "
                          f"({row['seconds']:.0f} s)", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print(table(results, args.sets, arms))


def table(results: dict, sets, arms) -> str:
    head = "| set | " + " | ".join(f"lr {a}" for a in arms) + " |"
    lines = [head, "|---" * (len(arms) + 1) + "|"]
    for name in sets:
        cells = []
        for arm in arms:
            rows = results.get((name, arm), [])
            if not rows:
                cells.append("")
                continue
            acc = statistics.mean(r["acc"] for r in rows)
            found = "/".join(format(r["lr"], ".2g") for r in rows)
            extra = f" (found {found})" if arm == "auto" else ""
            cells.append(f"{acc:.3f}{extra}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
