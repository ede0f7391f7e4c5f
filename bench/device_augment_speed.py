"""RandAugment on the device vs TF RandAugment on the host, around one training step, in one run.

    python bench/device_augment_speed.py    # tf_efficientnetv2_b0, 64 px, batch 16: 17 min on 2 busy cores
    python bench/device_augment_speed.py --size 224 --batch 64 --steps 20   # on a GPU

Cases, each timed as ``--steps`` back-to-back training steps (blocking on the last):

* step alone                       - the kit's jitted train step on one fixed device batch
* step + device RandAugment        - a jitted function: ``rand_augment_batch`` (vmap) on the uint8
                                     batch, then the same train step, compiled as one program
* step + device RandAugment (lax.map) - the same with ``RandAugmentConfig(sequential=True)``
* device RandAugment alone         - the jitted batch augmentation without the step
* tf.data -> step                  - uint8 images from memory through tf.data (batch, prefetch) into
                                     the step: the host feed without augmentation
* tf.data + TF RandAugment -> step - the same pipeline with ``kaggle_utils.data.RandAugment(2, 15)``
                                     mapped per image (XLA-compiled, parallel map): host augmentation
* tf.data -> step + device RandAugment - the first pipeline feeding the composed step

Every case starts fresh each round (a new iterator, ``--warmup`` untimed steps); rounds are
interleaved (A, B, C, ... A, B, C, ...) and the median per case is reported, since other
processes share the CPUs; the load average is printed at the start and the end. Images are
crops of scikit-image's photos. RandAugment is RandAugment(2, 15) on both sides.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def make_train_step(model_name: str, size: int, num_classes: int):
    """``(state, train(state, device_batch) -> (state, metrics), put_batch)``: the one coupling to the train API."""
    import jax

    from kaggle_utils.parallel import make_mesh
    from kaggle_utils.efficientnet import create_model
    from kaggle_utils.train import StepConfig, create_train_state, init_variables, make_optimizer, make_steps

    model = create_model(model_name, num_classes=num_classes)
    tx = make_optimizer(1e-3)
    steps = make_steps(model, tx, StepConfig(num_classes=num_classes), mode="jit", mesh=make_mesh(jax.devices()[:1]))
    state = steps.put_state(create_train_state(init_variables(model, size), tx))
    return state, steps.train, steps.put_batch


def photo_crops(count: int, size: int, seed: int = 0) -> np.ndarray:
    """uint8 [count, size, size, 3]: random crops (and flips) of scikit-image's colour photos."""
    from skimage import data

    photos = [data.astronaut(), data.chelsea(), data.coffee(), data.rocket()]
    if size > min(min(p.shape[:2]) for p in photos):
        raise ValueError(f"--size {size}: the photos are 300 px on their short side; use a size up to 300")
    rng = np.random.default_rng(seed)
    crops = []
    for i in range(count):
        photo = photos[i % len(photos)]
        scale = max(1, min(photo.shape[0], photo.shape[1]) // (2 * size))
        photo = photo[::scale, ::scale]
        y, x = (rng.integers(0, photo.shape[k] - size + 1) for k in (0, 1))
        crop = photo[y:y + size, x:x + size]
        crops.append(crop[:, ::-1] if rng.random() < 0.5 else crop)
    return np.ascontiguousarray(np.stack(crops))


def host_pipeline(images: np.ndarray, labels: np.ndarray, batch_size: int, augment):
    """tf.data: in-memory uint8 images -> (optionally TF RandAugment per image) -> batches, prefetched."""
    import kaggle_utils.data as kd

    tf = kd.tensorflow_on_host()
    data = tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
    if augment is not None:
        seeds = tf.data.Dataset.counter().map(lambda i: tf.stack([i, tf.constant(0, tf.int64)]))
        data = tf.data.Dataset.zip((data, seeds)).map(lambda pair, seed: (augment(pair[0], seed), pair[1]),
                                                       num_parallel_calls=tf.data.AUTOTUNE)
    data = data.batch(batch_size, drop_remainder=True).map(
        lambda x, y: {"image": x, "label": y, "mask": tf.ones_like(y, tf.bool)})
    return data.prefetch(2)


def build_cases(args) -> dict:
    """Each case: a function ``(steps, warmup) -> seconds`` for ``steps`` timed training steps."""
    import jax

    import kaggle_utils.data as kd
    from kaggle_utils.device_augment import RandAugmentConfig, rand_augment_batch

    num_classes = 10
    state, train, put_batch = make_train_step(args.model, args.size, num_classes)
    images = photo_crops(args.images, args.size)
    labels = (np.arange(args.images) % num_classes).astype(np.int32)
    fixed = put_batch({"image": images[:args.batch], "label": labels[:args.batch],
                       "mask": np.ones(args.batch, bool)})
    holder = [state]  # the state is donated by every step

    def with_device_augment(config):
        @functools.partial(jax.jit, donate_argnums=0)
        def step(state, batch):
            key = jax.random.fold_in(jax.random.key(0), state.step)
            return train(state, {**batch, "image": rand_augment_batch(key, batch["image"], config)})
        return step

    augment_only = jax.jit(lambda key, x: rand_augment_batch(key, x, RandAugmentConfig()))
    steps = {"step alone": train, "step + device RandAugment": with_device_augment(RandAugmentConfig()),
             "step + device RandAugment (lax.map)": with_device_augment(RandAugmentConfig(sequential=True))}

    def timed_fixed(step):
        def run(count, warmup):
            for i in range(warmup + count):
                if i == warmup:
                    start = time.perf_counter()
                holder[0], metrics = step(holder[0], fixed)
            jax.block_until_ready(metrics)
            return time.perf_counter() - start
        return run

    def timed_augment_only(count, warmup):
        for i in range(warmup + count):
            if i == warmup:
                start = time.perf_counter()
            out = augment_only(jax.random.key(i), fixed["image"])
        jax.block_until_ready(out)
        return time.perf_counter() - start

    def timed_pipeline(dataset, step):
        def run(count, warmup):
            iterator = dataset.as_numpy_iterator()
            for i in range(warmup + count):
                if i == warmup:
                    start = time.perf_counter()
                holder[0], metrics = step(holder[0], put_batch(next(iterator)))
            jax.block_until_ready(metrics)
            elapsed = time.perf_counter() - start
            del iterator
            return elapsed
        return run

    plain = host_pipeline(images, labels, args.batch, None)
    augmented = host_pipeline(images, labels, args.batch, kd.RandAugment(2, 15))
    cases = {name: timed_fixed(step) for name, step in steps.items()}
    cases["device RandAugment alone"] = timed_augment_only
    cases["tf.data -> step"] = timed_pipeline(plain, train)
    cases["tf.data + TF RandAugment -> step"] = timed_pipeline(augmented, train)
    cases["tf.data -> step + device RandAugment"] = timed_pipeline(plain, steps["step + device RandAugment"])
    return cases


def run(args) -> None:
    import kaggle_utils  # noqa: F401  (before JAX starts: it sets the kit's XLA:CPU option)
    import jax

    print(f"cpus={os.cpu_count()} backend={jax.default_backend()} model={args.model} size={args.size} "
          f"batch={args.batch} steps/run={args.steps} warmup={args.warmup} rounds={args.rounds} "
          f"loadavg(start)={os.getloadavg()[0]:.2f}", flush=True)
    start = time.perf_counter()
    cases = build_cases(args)
    for name, case in cases.items():  # compile everything before the first timed round
        case(1, 1)
    print(f"compiled and warmed up in {time.perf_counter() - start:.0f} s", flush=True)
    runs = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, case in cases.items():
            runs[name].append(case(args.steps, args.warmup) / args.steps * 1000)
    report(runs, args)


def report(runs: dict, args) -> None:
    medians = {name: statistics.median(v) for name, v in runs.items()}
    base, fed = medians["step alone"], medians["tf.data -> step"]
    print(f"loadavg(end)={os.getloadavg()[0]:.2f}\n")
    print("| case | ms per step (median) | runs | vs step alone | vs tf.data -> step |")
    print("|---|---|---|---|---|")
    for name, value in medians.items():
        runs_text = " ".join(f"{v:.0f}" for v in runs[name])
        print(f"| {name} | {value:.1f} | {runs_text} | {value / base:.2f}x | {value / fed:.2f}x |")
    print()
    def change(case, reference):
        return f"{(medians[case] - medians[reference]) / medians[reference]:+.1%}"

    per_round = [(a - b) / b for a, b in zip(runs["step + device RandAugment"], runs["step alone"])]
    print(f"device RandAugment inside the step costs {change('step + device RandAugment', 'step alone')} of the "
          f"step (per round: {' '.join(f'{r:+.0%}' for r in per_round)}); with lax.map "
          f"{change('step + device RandAugment (lax.map)', 'step alone')}")
    print(f"fed by tf.data: TF RandAugment on the host "
          f"{change('tf.data + TF RandAugment -> step', 'tf.data -> step')}, device RandAugment "
          f"{change('tf.data -> step + device RandAugment', 'tf.data -> step')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tf_efficientnetv2_b0")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--images", type=int, default=256, help="distinct images the tf.data routes cycle through")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per case and round")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before each timed run")
    parser.add_argument("--rounds", type=int, default=5)
    run(parser.parse_args())


if __name__ == "__main__":
    main()
