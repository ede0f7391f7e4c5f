"""Does the input starve the step? The training job's images/s next to its train step alone, per augmentation route.

    python bench/job_speed.py                        # tf_efficientnetv2_b0, digits sample at 64 px, batch 16
    python bench/job_speed.py --routes none randaugment --steps 10 --rounds 3
    python bench/job_speed.py --size 224 --batch 128 --precision fp16 --steps 20   # on a T4
    python bench/job_speed.py --data-dir /kaggle/input/tpu-getting-started/tfrecords-jpeg-512x512
    python bench/job_speed.py --size 300 --batch 64 --host-cores 4 --steps 20   # can a T4 x2's 4 vCPUs feed a GPU?

For each ``--data.augment`` route (``none``, ``randaugment`` TF on the host, ``imgaug`` in worker
processes, ``randaugment-device`` inside the jitted step) it runs the job's own pieces
(:mod:`kaggle_utils.run`: ``open_data``, ``resolve``, ``build_model``, ``build_training``,
``fit_run``) and times two things:

* job: ``fit_run`` as the job calls it, the input pipeline feeding the step through the loop's
  device prefetch; the figure is the loop's own ``train/img_per_s`` of each log window of
  ``--steps`` steps, the first window (pipeline start, compilation) left out;
* step alone: the same compiled step on a few batches of the same pipeline already on the
  device, ``--steps`` back-to-back calls blocked on the last;
* host feed: the route's input pipeline alone (``train_dataset``), ``--steps`` batches per window,
  no device: what the host can deliver.

A job/step ratio below ``--threshold`` means the input (or, on a CPU, the input's share of the
same cores) holds the step back: "input-bound"; otherwise the step is "fed". ``--host-cores N``
asks the question for a machine with N cores (Kaggle's T4 x2 has 4 vCPUs): the process is pinned
to N of its cores (``os.sched_setaffinity``, inherited by the imgaug worker processes, whose
default count follows it) before TensorFlow and JAX size their thread pools, and TensorFlow's
inter- and intra-op pools are set to N. The GPU's own work needs no host core, but JAX's dispatch
and the transfer to the device share the N cores with the input, as they would on that machine. Routes share a compiled step where their steps
are equal (all but ``randaugment-device``). Rounds are interleaved (every route's job and step,
then again) and medians are reported, since other processes may share the machine. The
evaluation ``fit_run`` ends with runs after the timed windows, on one validation file only.
Without ``--data-dir`` the data is the kit's digits sample written at ``--size``. Figures:
bench/README.md.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

ROUTES = ("none", "randaugment", "imgaug", "randaugment-device")
DEVICE_BATCHES = 4  # distinct device batches the step-alone runs cycle through


def job_config(args, route: str):
    """The job's config for one route: one epoch of warm-up + timed log windows, no files written."""
    from kaggle_utils.config import TrainConfig

    total = args.steps * (args.windows + 1)
    return TrainConfig().replace(model=args.model, image_size=args.size, batch_size=args.batch, precision=args.precision,
                                 data_dir=args.data_dir, augment=route, steps=total, steps_per_epoch=total,
                                 log_every=args.steps, tensorboard=False, deterministic=not args.nondeterministic)


def verdict(ratio: float, threshold: float) -> str:
    return "input-bound" if ratio < threshold else "fed"


def restrict_host(cores: int | None) -> str:
    """Pins this process to the first ``cores`` of the cores it may use (its children inherit it); how the
    report names the host. Call it before TensorFlow or JAX start: they size their thread pools then."""
    allowed = sorted(os.sched_getaffinity(0))
    if cores is None:
        return f"{len(allowed)} host cores"
    os.sched_setaffinity(0, allowed[:cores])
    return f"{cores} of {len(allowed)} host cores (pinned)"


def limit_tensorflow_threads(cores: int | None) -> None:
    """TensorFlow's inter- and intra-op thread pools at ``cores`` threads (tf.data's own pool follows the
    pinned cores); before TensorFlow's first op, which fixes them."""
    from kaggle_utils.data import tensorflow_on_host

    if cores is not None:
        tf = tensorflow_on_host()
        tf.config.threading.set_inter_op_parallelism_threads(cores)
        tf.config.threading.set_intra_op_parallelism_threads(cores)


class _WindowRates:
    """A fit hook keeping the loop's images/s of each log window."""

    def __init__(self):
        self.rates: list[float] = []

    def on_log(self, step: int, scalars) -> None:
        self.rates.append(scalars["train/img_per_s"])


class Route:
    """One augmentation route: its resolved config, compiled training, and device batches for the step alone."""

    def __init__(self, config, plan, data, training):
        from kaggle_utils import run

        self.config, self.plan, self.data, self.training = config, plan, data, training
        dataset = run.train_dataset(config, plan, data, epoch=1)
        try:
            batches = [b for _, b in zip(range(DEVICE_BATCHES), dataset)]
        finally:
            dataset.close()
        self.device_batches = [training.steps.put_batch(b) for b in batches]
        self.state = training.steps.put_state(training.state)

    def feed_rates(self, steps: int, windows: int) -> list[float]:
        """Images/s of the route's input pipeline alone, ``windows`` windows of ``steps`` batches (one more first,
        untimed: the pipeline's start)."""
        from kaggle_utils import run

        dataset = run.train_dataset(self.config, self.plan, self.data, epoch=2)
        rates = []
        try:
            batches = iter(dataset)
            for window in range(-1, windows):
                start = time.perf_counter()
                images = sum(len(next(batches)["image"]) for _ in range(steps))
                if window >= 0:
                    rates.append(images / (time.perf_counter() - start))
        finally:
            dataset.close()
        return rates

    def job_rates(self) -> list[float]:
        """Images/s of the job's timed log windows (the first window left out)."""
        from kaggle_utils import run

        windows = _WindowRates()
        with contextlib.redirect_stdout(io.StringIO()):  # the evaluation row fit prints at the end
            run.fit_run(self.config, self.plan, self.data, self.training, None, progress=False, hooks=[windows])
        return windows.rates[1:]

    def step_rates(self, steps: int, windows: int) -> list[float]:
        """Images/s of ``windows`` runs of ``steps`` train steps on batches already on the device."""
        import jax

        train = self.training.steps.train
        rates = []
        for window in range(-1, windows):  # window -1: untimed
            start = time.perf_counter()
            for i in range(steps):
                self.state, metrics = train(self.state, self.device_batches[i % len(self.device_batches)])
            jax.block_until_ready(metrics)
            if window >= 0:
                rates.append(steps * self.plan.global_batch / (time.perf_counter() - start))
        return rates


def build_routes(args, data) -> dict[str, Route]:
    """Every route's pieces, the kit's way; routes whose steps are equal share one compiled training."""
    from kaggle_utils import run

    compiled = {}
    routes = {}
    for name in args.routes:
        config, plan = run.resolve(job_config(args, name), data)
        key = tuple(sorted(run.device_augmentation(config)))  # what changes the compiled step
        if key not in compiled:
            model = run.build_model(config)
            compiled[key] = run.build_training(config, plan, model, run.initial_variables(config, model))
        routes[name] = Route(config, plan, data, compiled[key])
    return routes


def measure(args) -> dict:
    from kaggle_utils import run

    base = job_config(args, "none")
    run.check_config(base)
    with run.data_root(base, out_dir=None) as root:  # --data-dir or the sample (no --source here)
        data = run.open_data(base, root)
        data = dataclasses.replace(data, splits={**data.splits, "val": data.splits["val"][:1]})
        start = time.perf_counter()
        routes = build_routes(args, data)
        runs = {name: {"feed": [], "job": [], "step": []} for name in routes}
        for round_index in range(args.rounds):
            for name, route in routes.items():
                runs[name]["feed"].append(route.feed_rates(args.steps, args.windows))
                runs[name]["job"].append(route.job_rates())
                runs[name]["step"].append(route.step_rates(args.steps, args.windows))
            print(f"round {round_index + 1}/{args.rounds} done at {time.perf_counter() - start:.0f} s, "
                  f"loadavg {os.getloadavg()[0]:.1f}", flush=True)
        first = next(iter(routes.values()))
        return {"runs": runs, "seconds": time.perf_counter() - start, "config": first.config,
                "stored_size": data.stored_size}


def report(result: dict, args, load_start: float, host: str) -> None:
    import jax

    from kaggle_utils.data import default_worker_count, tensorflow_on_host

    config = result["config"]
    print(f"\n{config.model.name} at {config.model.image_size}px (stored {result['stored_size']}), "
          f"{config.model.precision}, global batch {config.data.batch_size}, "
          f"{'deterministic' if config.data.deterministic else 'nondeterministic'} input; "
          f"{args.rounds} rounds x {args.windows} windows x {args.steps} steps; jax {jax.__version__} ({jax.default_backend()}: "
          f"{jax.device_count()} x {jax.devices()[0].device_kind}), tensorflow {tensorflow_on_host().__version__}; "
          f"{host}, {default_worker_count()} imgaug workers; loadavg {load_start:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{result['seconds']:.0f} s\n")
    print("| route | host feeds img/s | step-alone img/s | job img/s | job / step | per-round job / step | verdict |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in result["runs"].items():
        feed, job, step = (statistics.median(r for rates in runs[part] for r in rates)
                           for part in ("feed", "job", "step"))
        per_round = " ".join(f"{statistics.median(j) / statistics.median(s):.2f}"
                             for j, s in zip(runs["job"], runs["step"]))
        print(f"| {name} | {feed:.1f} | {step:.1f} | {job:.1f} | **{job / step:.2f}** | {per_round} | "
              f"{verdict(job / step, args.threshold)} |")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=ROUTES, metavar="ROUTE",
                        help=f"augmentation routes to time: {' '.join(ROUTES)}")
    parser.add_argument("--model", default="tf_efficientnetv2_b0")
    parser.add_argument("--size", type=int, default=None,
                        help="image side (default: 64 on the digits sample, the stored size with --data-dir)")
    parser.add_argument("--batch", type=int, default=16, help="global batch")
    parser.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                        help="the job's --precision (auto: bf16 on TPU and Ampere+, fp16 on older GPUs, fp32 on CPU)")
    parser.add_argument("--data-dir", default=None, help="TFRecords in the competition layout (default: the sample)")
    parser.add_argument("--steps", type=int, default=6, help="steps per timed window (the job's log interval)")
    parser.add_argument("--windows", type=int, default=2, help="timed windows per route and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="the job's --no-deterministic: tf.data hands out elements as they are ready, the "
                             "input order is not reproducible")
    parser.add_argument("--threshold", type=float, default=0.9, help="job/step below this: input-bound")
    parser.add_argument("--host-cores", type=int, default=None,
                        help="run on this many of the host's cores (Kaggle's T4 x2: 4), threads and imgaug workers "
                             "included (default: all this process may use)")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.size is None and args.data_dir is None:
        args.size = 64
    bad = [f"--{name} {value}" for name, value in (("steps", args.steps), ("windows", args.windows),
                                                    ("rounds", args.rounds), ("batch", args.batch)) if value < 1]
    if bad:
        parser.error(f"{', '.join(bad)}: must be >= 1")
    if args.size is not None and args.size < 8:
        parser.error(f"--size {args.size}: must be >= 8")
    if not 0 < args.threshold <= 1:
        parser.error(f"--threshold {args.threshold}: must be in (0, 1]")
    allowed = len(os.sched_getaffinity(0))
    if args.host_cores is not None and not 1 <= args.host_cores <= allowed:
        parser.error(f"--host-cores {args.host_cores}: must be in [1, {allowed}] (the cores this process may use)")
    args.routes = list(dict.fromkeys(args.routes))  # each route once, in the order given
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    host = restrict_host(args.host_cores)  # before TensorFlow and JAX start their thread pools
    from kaggle_utils.config import ConfigError
    from kaggle_utils.data import DataError

    limit_tensorflow_threads(args.host_cores)
    load_start = os.getloadavg()[0]
    try:
        result = measure(args)
    except (ConfigError, DataError) as err:
        raise SystemExit(f"job_speed.py: error: {err}") from None
    report(result, args, load_start, host)


if __name__ == "__main__":
    main()
