"""Inference as a code competition runs it: the whole ``predict`` command against the timm script a user would
write, over 1,000 test JPEGs on this machine's CPU, each a process timed from start to its submission.csv.

    python bench/predict_speed.py --out /tmp/predict_speed                  # V2-S at 224, 3 interleaved rounds
    python bench/predict_speed.py --out /tmp/predict_speed --table          # the table of what results.jsonl holds

Set up once in ``--out``: ``--images`` JPEGs at ``--size`` px made from the photos of
``../shared/data/intel-scenes-mini`` (150-px scenes enlarged, so every file is a real photo at the size a code
competition's test set is read at), and a kit run folder of the model (random init, trained one step on a few of
those photos: a real run folder with its config, checkpoint and manifest). Each round then runs, in turn:

* kit: ``python -m kaggle_utils predict --checkpoint RUN --test-source IMAGES`` with JAX's persistent compilation
  cache empty ("cold", as a notebook's first run) and filled by the run before ("warm": the cache kept in a
  dataset or the working folder, as a second submission reads it); flip TTA off and on;
* timm: :data:`TIMM_SCRIPT`, what a timm user writes for the same job: ``timm.create_model``, its eval transform
  at the size, a ``DataLoader`` with workers, ``channels_last``, ``torch.compile`` (inductor) and
  ``torch.inference_mode``, softmax (with TTA: of the image and its mirror, averaged), a submission.csv; its
  inductor cache empty ("cold") and kept ("warm"), as the kit's.

Both sides read the same files and write one row per image (checked). Figures: bench/README.md.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PHOTOS = ROOT.parent / "shared/data/intel-scenes-mini"

TIMM_SCRIPT = r'''
import csv, sys, time
from pathlib import Path
import timm, torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

model_name, size, images, out, batch, workers, tta = sys.argv[1:8]
size, batch, workers, tta = int(size), int(batch), int(workers), tta == "tta"
model = timm.create_model(model_name, num_classes=6).eval().to(memory_format=torch.channels_last)
transform = create_transform(**resolve_data_config({"input_size": (3, size, size)}, model=model))
files = sorted(Path(images).glob("*.jpg"))

class Images(torch.utils.data.Dataset):
    def __len__(self):
        return len(files)

    def __getitem__(self, i):
        return transform(Image.open(files[i]).convert("RGB"))

loader = torch.utils.data.DataLoader(Images(), batch_size=batch, num_workers=workers)
compiled = torch.compile(model)
rows = []
with torch.inference_mode():
    for x in loader:
        x = x.contiguous(memory_format=torch.channels_last)
        probs = compiled(x).softmax(-1)
        if tta:
            probs = (probs + compiled(x.flip(3)).softmax(-1)) / 2
        rows += probs.argmax(-1).tolist()
with open(Path(out) / "submission.csv", "w", newline="") as f:
    csv.writer(f).writerows([("id", "label"), *((p.stem, r) for p, r in zip(files, rows))])
'''


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="work folder: images, run folder, caches, results.jsonl")
    p.add_argument("--model", default="tf_efficientnetv2_s")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--images", type=int, default=1000)
    p.add_argument("--batch", type=int, default=32, help="images per call, both sides")
    p.add_argument("--workers", type=int, default=2, help="the timm script's DataLoader workers")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cases", nargs="+", default=list(CASES), help="a subset of: " + ", ".join(CASES))
    p.add_argument("--table", action="store_true", help="print the table of results.jsonl and stop")
    return p.parse_args(argv)


def make_images(args, folder: Path) -> None:
    """``--images`` JPEGs at ``--size`` px from the intel-scenes photos (train and test, in name order)."""
    from PIL import Image

    if folder.is_dir() and len(list(folder.glob("*.jpg"))) == args.images:
        return
    photos = sorted(PHOTOS.glob("test/*.jpg")) + sorted(PHOTOS.glob("train/*/*.jpg"))
    if len(photos) < args.images:
        raise SystemExit(f"{PHOTOS} holds {len(photos)} photos, fewer than --images {args.images}")
    staging = folder.with_name(folder.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for i, photo in enumerate(photos[:args.images]):
        Image.open(photo).convert("RGB").resize((args.size, args.size), Image.BICUBIC).save(
            staging / f"test_{i:04d}.jpg", quality=90)
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)


def make_run(args, work: Path) -> Path:
    """A kit run folder of ``--model``: one training step on 4 photos per class of intel-scenes-mini's train split."""
    run = work / "run"
    if (run / "best.msgpack").is_file():
        return run
    source = work / "train-source"
    if not source.is_dir():
        for folder in sorted(PHOTOS.glob("train/*")):
            (source / folder.name).mkdir(parents=True)
            for photo in sorted(folder.glob("*.jpg"))[:4]:
                (source / folder.name / photo.name).symlink_to(photo.resolve())
    subprocess.run([sys.executable, "-m", "kaggle_utils", "train", "--source", str(source), "--model", args.model,
                    "--image-size", str(args.size), "--steps", "1", "--batch-size", "8", "--val-fraction", "0.25",
                    "--out", str(run), "--overwrite", "--no-progress"], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return run


CASES = ("kit cold", "kit warm", "kit warm tta", "timm cold", "timm warm", "timm warm tta")


def command(args, case: str, work: Path, run: Path, images: Path, out: Path) -> tuple[list[str], dict]:
    """The case's command line and environment: its compile cache empty (cold) or the one kept (warm)."""
    side, warmth = case.split()[:2]
    cache = work / (f"{side}-cache-cold" if warmth == "cold" else f"{side}-cache")
    if warmth == "cold":
        shutil.rmtree(cache, ignore_errors=True)
    if side == "kit":
        return ([sys.executable, "-m", "kaggle_utils", "predict", "--checkpoint", str(run), "--test-source",
                 str(images), "--out", str(out), "--batch-size", str(args.batch), "--no-progress",
                 "--tta" if case.endswith("tta") else "--no-tta"],
                {"PYTHONPATH": str(ROOT), "JAX_COMPILATION_CACHE_DIR": str(cache)})
    return ([sys.executable, "-c", TIMM_SCRIPT, args.model, str(args.size), str(images), str(out), str(args.batch),
             str(args.workers), "tta" if case.endswith("tta") else "plain"],
            {"TORCHINDUCTOR_CACHE_DIR": str(cache)})


def rows_of(submission: Path) -> int:
    return len(submission.read_text().splitlines()) - 1


def main(argv=None) -> None:
    args = parse_args(argv)
    work = Path(args.out)
    results = work / "results.jsonl"
    if not args.table:
        work.mkdir(parents=True, exist_ok=True)
        images = work / f"images-{args.size}"
        make_images(args, images)
        run = make_run(args, work)
        for case in args.cases:  # the warm caches exist before the first timed round
            if "warm" in case and not (work / f"{case.split()[0]}-cache").is_dir():
                cmd, env = command(args, case, work, run, images, work / "out")
                (work / "out").mkdir(exist_ok=True)
                subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, **env}, capture_output=True)
        for round_ in range(args.rounds):
            for case in args.cases:
                out = work / "out"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                cmd, env = command(args, case, work, run, images, out)
                load = os.getloadavg()[0]
                started = time.perf_counter()
                done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True)
                wall = time.perf_counter() - started
                if done.returncode:
                    raise SystemExit(f"{case} failed ({done.returncode}): {done.stderr[-2000:]}")
                if rows_of(out / "submission.csv") != args.images:
                    raise SystemExit(f"{case} wrote {rows_of(out / 'submission.csv')} rows, not {args.images}")
                entry = {"case": case, "round": round_, "model": args.model, "size": args.size,
                         "images": args.images, "batch": args.batch, "workers": args.workers, "wall_s": wall,
                         "load": [load, os.getloadavg()[0]], "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                 time.gmtime())}
                with open(results, "a") as f:
                    f.write(json.dumps(entry) + "\n")
                print(f"round {round_ + 1} {case}: {wall:.1f} s", flush=True)
    print(table(results))


def table(results: Path) -> str:
    """Median whole-command seconds per case (min-max), images/s of the median, and kit/timm per warmth and TTA."""
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    by_case = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r["wall_s"])
    images = rows[0]["images"] if rows else 0
    lines = ["| case | runs | seconds, median (min-max) | images/s | timm / kit (medians) |", "|---|---|---|---|---|"]
    for case in CASES:
        if case not in by_case:
            continue
        walls = by_case[case]
        median = statistics.median(walls)
        peer = by_case.get(case.replace("kit", "timm"))
        ratio = f"**{statistics.median(peer) / median:.2f}**" if case.startswith("kit") and peer else ""
        lines.append(f"| {case} | {len(walls)} | {median:.1f} ({min(walls):.1f}-{max(walls):.1f}) | "
                     f"{images / median:.1f} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
