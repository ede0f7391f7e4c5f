"""Input pipeline throughput: decode-only vs augmentation routes, at 224 and 512, in one run.

    python bench/pipeline_speed.py            # ~11 minutes on 2 cores
    python bench/pipeline_speed.py --sizes 512 --seconds 5 --rounds 5

Routes (all through ``load_dataset``, uint8 host batches, shuffled, repeated):

* decode-only                  - parse + JPEG decode + batch: the ceiling for any augmentation
* tf-randaugment               - ``augment="randaugment"``: TF-native RandAugment(2, 15), per image
* imgaug py_function, in-thread - imgaug RandAugment(2, 15) per batch inside tf.py_function, as the
                                 seed tutorial does (GIL-bound)
* imgaug py_function, 1 worker  - the same callable in one worker process, via shared memory; the
                                 worker also decodes the JPEGs (the default, ``decode_jpegs=True``)
* imgaug py_function, 2 workers - ... two worker processes
* ... (tf.data decodes)         - the same with ``decode_jpegs=False``: tf.data decodes, the workers
                                 only augment

Images are synthetic 104-class JPEGs (``make_sample_dataset(source="synthetic")``) written to a
temp dir. Rounds are interleaved (A, B, C, ... A, B, C, ...) and the median per route is
reported, because other processes share the CPUs; the load average is printed to show how
busy the machine was. Targets (2-core machine, 512x512): tf-randaugment >= 0.35x decode-only,
2 workers >= 1.6x 1 worker.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def measure(dataset, seconds: float, warmup_seconds: float) -> float:
    """Steady-state images per second over about ``seconds``; a fresh pipeline each time.

    The warm-up is timed, not counted in batches: a fresh pipeline needs a few seconds to
    reach its steady rate (2 workers at 512x512, images/s in 2-second windows from the
    start: 143 190 215 214), and a training run lives in the steady state.
    """
    iterator = iter(dataset)
    start = time.perf_counter()
    while time.perf_counter() - start < warmup_seconds:
        next(iterator)
    images, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        images += len(next(iterator)["image"])
    elapsed = time.perf_counter() - start
    del iterator  # waits for the batches its workers are on, outside the timed span
    return images / elapsed


def run(args) -> None:
    import kaggle_utils.data as kd

    pools = {(workers, decode): kd.ProcessPoolAugmenter(kd.ImgaugRandAugment(n=2, m=15), workers, seed=0,
                                                         decode_jpegs=decode)
             for decode in (True, False) for workers in (1, 2)}
    routes = {
        "decode-only": None,
        "tf-randaugment": kd.RandAugment(2, 15),
        "imgaug py_function, in-thread": kd.ImgaugRandAugment(n=2, m=15),
        "imgaug py_function, 1 worker": pools[1, True],
        "imgaug py_function, 2 workers": pools[2, True],
        "imgaug py_function, 1 worker (tf.data decodes)": pools[1, False],
        "imgaug py_function, 2 workers (tf.data decodes)": pools[2, False],
    }
    print(f"cpus={os.cpu_count()} batch={args.batch_size} seconds/run={args.seconds} "
          f"warmup={args.warmup_seconds} rounds={args.rounds} "
          f"loadavg(start)={os.getloadavg()[0]:.2f}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes:
            sample = kd.make_sample_dataset(os.path.join(tmp, str(size)), "synthetic", image_size=size,
                                            num_examples=args.images, num_files=(8, 1, 1), quality=90)
            files = kd.list_tfrecords(sample.split_dirs["train"])
            jpeg_kb = sum(os.path.getsize(f) for f in files) / sample.counts["train"] / 1024
            datasets = {
                name: kd.load_dataset(files, labeled=True, image_size=size, batch_size=args.batch_size,
                                      augment=augment, augment_workers=0, repeat=True, seed=0,
                                      shuffle_buffer_size=256, process_index=0, process_count=1)
                for name, augment in routes.items()}
            runs = {name: [] for name in routes}
            for _ in range(args.rounds):
                for name, dataset in datasets.items():
                    runs[name].append(measure(dataset, args.seconds, args.warmup_seconds))
            results[size] = ({name: statistics.median(v) for name, v in runs.items()}, runs, jpeg_kb)
    for pool in pools.values():
        pool.close()
    report(results, args)


def report(results, args) -> None:
    print(f"loadavg(end)={os.getloadavg()[0]:.2f}\n")
    print("| size | route | images/s (median) | runs | x decode-only |")
    print("|---|---|---|---|---|")
    for size, (medians, runs, jpeg_kb) in results.items():
        for name, value in medians.items():
            runs_text = " ".join(f"{v:.0f}" for v in runs[name])
            print(f"| {size} | {name} | {value:.0f} | {runs_text} | {value / medians['decode-only']:.2f} |")
    print()
    comparisons = {  # (numerator, denominator, target at 512)
        "tf-randaugment / decode-only": ("tf-randaugment", "decode-only", 0.35),
        "2 workers / 1 worker": ("imgaug py_function, 2 workers", "imgaug py_function, 1 worker", 1.6),
        "2 workers / 1 worker, tf.data decodes": ("imgaug py_function, 2 workers (tf.data decodes)",
                                                  "imgaug py_function, 1 worker (tf.data decodes)", None),
        "1 worker / in-thread": ("imgaug py_function, 1 worker", "imgaug py_function, in-thread", None),
    }
    print("Ratios: of the medians, and the median of the per-round ratios (each round runs every route")
    print("back to back, so a per-round ratio is less exposed to the machine's drift between rounds).")
    for size, (medians, runs, jpeg_kb) in results.items():
        print(f"{size}x{size} (JPEG {jpeg_kb:.0f} kB):")
        for label, (top, bottom, target) in comparisons.items():
            per_round = [a / b for a, b in zip(runs[top], runs[bottom])]
            target_text = f" (target >= {target} at 512)" if target else ""
            print(f"  {label} = {medians[top] / medians[bottom]:.2f}, per round "
                  f"{' '.join(f'{r:.2f}' for r in per_round)} (median {statistics.median(per_round):.2f})"
                  f"{target_text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 512])
    parser.add_argument("--images", type=int, default=320, help="synthetic images per size (train gets 70%%)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=4.0, help="timed seconds per run")
    parser.add_argument("--warmup-seconds", type=float, default=3.0, help="untimed seconds before each run")
    parser.add_argument("--rounds", type=int, default=5)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
