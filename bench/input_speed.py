"""The training input pipeline alone, on real photographs at 512 px, per route, at 1 and 2 host cores.

    python bench/input_speed.py                                   # the table of bench/README.md (~30 min on 2 cores)
    python bench/input_speed.py --images 64 --seconds 2 --warmup-seconds 2 --rounds 1     # a quick look

Records: TFRecords in the competition's layout (``train/NN-512x512-COUNT.tfrec``, JPEG quality 95 from
TensorFlow's libjpeg, as the converter writes them) made from scikit-image's colour photographs, each cut into
many distinct pictures (random crops of 45-100% of the short side, half of them mirrored, resized to 512 x 512):
photos decode far slower than the digits or synthetic shapes.

Each measurement is a fresh process pinned to N cores (``os.sched_setaffinity`` before TensorFlow starts its
thread pools; the pipeline sizes its pool, and the imgaug route its worker processes, by that affinity) that
reads ``load_dataset(..., training=True)`` as the job's ``train_dataset`` does for the route, warms up past
the first epoch (the corrupt-JPEG check, where simplejpeg is installed, then only looks records up), and counts
images over ``--seconds``. Routes, by the job's flags:

* ``none``: ``--augment none --train-crop none``, the job's default; also ``randaugment-device``'s host part
  (that route augments inside the jitted step: its host pipeline is this one);
* ``random-resized crop``: ``--train-crop random-resized`` (timm's crop + flip, back to 512);
* ``TF RandAugment``: ``--augment randaugment`` (TF ops per image, XLA);
* ``imgaug, workers``: ``--augment imgaug`` (worker processes that decode and augment, one per core).

"old default": the same pipeline in a process with TensorFlow's op determinism on, which the job turned on
for exact resume until this round (its maps then run one element at a time). "ceiling": bare tf.data,
``TFRecordDataset(num_parallel_reads=AUTOTUNE)`` -> parse -> decode (the resize to the stored size is a reshape)
-> batch, AUTOTUNE, no order kept, no checks: what the default route could reach. Configurations are interleaved over
``--rounds`` rounds (this machine is shared) and the median reported; results are appended to ``--out`` as
they come. "cores for a v5e-8": the host cores a route needs at its 2-core rate per core to deliver
``--chips-rate`` images/s (2,700: EfficientNetV2-M at 512 px at 30% of the eight chips' bf16 peak, issue 31's
figures: 177 GFLOPs per trained image).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's kit, not another
ROUTES = ("none", "random-resized crop", "TF RandAugment", "imgaug, workers")
PHOTOS = ("astronaut", "chelsea", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field", "retina",
          "motorcycle left", "motorcycle right")


def photographs(count: int, size: int, seed: int = 0):
    """``count`` distinct ``size`` x ``size`` uint8 pictures cut from scikit-image's colour photographs."""
    import numpy as np
    from PIL import Image
    from skimage import data

    left, right, _ = data.stereo_motorcycle()
    sources = [getattr(data, name)() for name in PHOTOS[:-2]] + [left, right]
    rng = np.random.default_rng(seed)
    out = np.empty((count, size, size, 3), np.uint8)
    for k in range(count):
        photo = sources[k % len(sources)]
        side = int(min(photo.shape[:2]) * rng.uniform(0.45, 1.0))
        top, left_ = rng.integers(0, photo.shape[0] - side + 1), rng.integers(0, photo.shape[1] - side + 1)
        crop = photo[top:top + side, left_:left_ + side]
        crop = crop[:, ::-1] if rng.random() < 0.5 else crop
        out[k] = np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((size, size), Image.BICUBIC))
    return out


def write_records(folder: str, count: int, size: int) -> None:
    import kaggle_utils.data as kd

    kd.write_split(os.path.join(folder, "train"), photographs(count, size), labels=[k % 104 for k in range(count)],
                   num_files=16, quality=95)


# ------------------------------------------------------------------------------------------ one measurement
def child(spec: dict) -> None:
    os.sched_setaffinity(0, set(spec["cpus"]))  # before TensorFlow starts its thread pools
    import kaggle_utils.data as kd

    tf = kd.tensorflow_on_host()
    if spec["old_default"]:
        tf.config.experimental.enable_op_determinism()
    files, size, batch = kd.list_tfrecords(os.path.join(spec["data"], "train")), spec["size"], spec["batch"]
    if spec["route"] == "ceiling":
        def parse(record):
            image = tf.io.parse_single_example(record, {"image": tf.io.FixedLenFeature([], tf.string)})["image"]
            return tf.reshape(tf.io.decode_jpeg(image, channels=3, dct_method="INTEGER_ACCURATE"), [size, size, 3])

        dataset = (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE).repeat()
                   .map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False).batch(batch)
                   .prefetch(tf.data.AUTOTUNE))
        batches = ({"image": b} for b in dataset.as_numpy_iterator())
    else:
        crop = kd.RandomResizedCrop(size) if spec["route"] == "random-resized crop" else None
        augment = {"TF RandAugment": "randaugment", "imgaug, workers": "imgaug"}.get(spec["route"])
        dataset = kd.load_dataset(files, image_size=size, batch_size=batch, training=True, seed=0, crop=crop,
                                  augment=augment)
        batches = dataset
    rate = measure(batches, spec["seconds"], spec["warmup_seconds"])
    print(json.dumps({**spec, "images_per_s": rate}), flush=True)
    os._exit(0)  # the rate is out: no waiting for the pipeline's threads to wind down (its workers follow)


def measure(batches, seconds: float, warmup_seconds: float) -> float:
    """Steady-state images per second of an iterable of batches: ``warmup_seconds`` untimed (a fresh pipeline
    takes seconds to reach its rate), then the images of ``seconds``."""
    batches = iter(batches)
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_seconds:
        next(batches)
    images, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        images += len(next(batches)["image"])
    return images / (time.perf_counter() - start)


def run_child(spec: dict) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{spec['route']} on {len(spec['cpus'])} core(s) failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


# ------------------------------------------------------------------------------------------ the table
def report(results: list[dict], chips_rate: float) -> None:
    def rate(route, cores, old):
        found = [r["images_per_s"] for r in results if r["route"] == route and len(r["cpus"]) == cores
                 and r["old_default"] == old]
        return statistics.median(found) if found else float("nan")

    first = results[0]
    print(f"\n{first['size']} px, batch {first['batch']}, {first['images']} photographs; median of "
          f"{max(sum(1 for r in results if r['route'] == 'none' and not r['old_default'] and len(r['cpus']) == 1), 1)}"
          f" round(s); loadavg {min(r['load'] for r in results):.1f}-{max(r['load'] for r in results):.1f}\n")
    print("| route | pipeline | 1 core img/s | 2 cores img/s | 2-core / 1-core | per core (2 cores) | x ceiling "
          f"(2 cores) | cores for {chips_rate:,.0f} img/s |")
    print("|---|---|---|---|---|---|---|---|")
    for route in ROUTES + ("ceiling",):
        for old in ((False, True) if route != "ceiling" else (False,)):
            one, two = rate(route, 1, old), rate(route, 2, old)
            if math.isnan(one) and math.isnan(two):  # not measured (--routes, --no-old-default)
                continue
            label = "bare tf.data" if route == "ceiling" else "old default (op determinism)" if old else "new"
            print(f"| {route} | {label} | {one:.0f} | {two:.0f} | {two / one:.2f}x | {two / 2:.0f} | "
                  f"{two / rate('ceiling', 2, False):.2f} | "
                  f"{math.ceil(chips_rate / (two / 2)) if two > 0 else '-'} |")
    none1, none2, ceiling2 = rate("none", 1, False), rate("none", 2, False), rate("ceiling", 2, False)
    print(f"\ndefault route: 2-core / 1-core {none2 / none1:.2f}x (target >= 1.8x), {none2 / ceiling2:.2f}x the "
          "ceiling at 2 cores (target >= 0.9x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=384, help="distinct photographs written (16 files)")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64, help="per-host batch")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed seconds per measurement")
    parser.add_argument("--warmup-seconds", type=float, default=10.0, help="untimed seconds first (past epoch 1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES)
    parser.add_argument("--no-old-default", action="store_true", help="skip the op-determinism rows")
    parser.add_argument("--chips-rate", type=float, default=2700.0, help="images/s the v5e-8 takes (see above)")
    parser.add_argument("--data", help="a folder to write the records to (kept; reused when present)")
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "input_speed.jsonl"),
                        help="results appended here as they come")
    parser.add_argument("--report", metavar="JSONL", help="print the table of results saved earlier, measure nothing")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))
    if args.report:
        with open(args.report) as f:
            return report([json.loads(line) for line in f], args.chips_rate)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs 2 cores it may run on")
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or tmp
        if not os.path.isdir(os.path.join(data, "train")):
            write_records(data, args.images, args.size)
        configs = [(route, cores, old) for cores in (1, 2) for route in args.routes
                   for old in ((False,) if args.no_old_default else (False, True))]
        configs += [("ceiling", cores, False) for cores in (1, 2)]
        results = []
        print(f"cpus {cpus}, {len(configs)} configurations x {args.rounds} rounds, results -> {args.out}", flush=True)
        for round_ in range(args.rounds):
            for route, cores, old in configs[round_ % len(configs):] + configs[:round_ % len(configs)]:
                spec = dict(route=route, cpus=cpus[:cores], old_default=old, data=data, size=args.size,
                            batch=args.batch, seconds=args.seconds, warmup_seconds=args.warmup_seconds,
                            images=args.images, round=round_, load=os.getloadavg()[0], date=time.strftime("%Y-%m-%d"))
                result = run_child(spec)
                results.append(result)
                with open(args.out, "a") as f:
                    f.write(json.dumps(result) + "\n")
                print(f"round {round_}: {route}, {cores} core(s){', old default' if old else ''}: "
                      f"{result['images_per_s']:.0f} images/s (load {spec['load']:.1f})", flush=True)
    report(results, args.chips_rate)


if __name__ == "__main__":
    main()
