"""Flax EfficientNet vs timm on this machine: eval forward and one training step, interleaved.

    python bench/model_speed.py                      # tf_efficientnetv2_s, 224, batch 8, fp32: ~6 min on 2 cores
    python bench/model_speed.py --quick              # fewer rounds: ~2 min, a rough figure
    python bench/model_speed.py --model tf_efficientnetv2_b0 --size 128 --batch 16 --conv-impl xla

Cases, each timed as ``--iters`` back-to-back calls on a batch of random images:

* eval forward: Flax ``model.apply`` (jit) vs timm ``model.eval()`` under ``torch.no_grad()``,
  timm both in NCHW (contiguous) and ``channels_last``;
* training step (forward + backward + AdamW): Flax ``jax.jit`` step with ``value_and_grad``,
  BN in train mode (``mutable=["batch_stats"]``) and ``optax.adamw``, state donated; timm
  ``model.train()``, ``loss.backward()``, ``torch.optim.AdamW``. Same loss (softmax cross
  entropy), learning rate and weight decay; dropout and drop path are off on both sides.

Both models hold the same weights (timm's random init ported with ``weights_port``), and the
eval logits are compared once as a sanity check (not the exactness measure: timm's random init
with default BN statistics gives logits of ~600 whose fp32 rounding alone is ~1e-4 of that scale;
tests/test_efficientnet_parity.py is the exactness test). Other processes share the CPUs, so rounds
are interleaved (Flax, timm, timm-CL, Flax-train, timm-train, then again) after a warm-up,
and the median per case is reported with every round's Flax/timm ratio. timm runs with
``torch.set_num_threads(--threads)``; XLA uses its default thread pool (every core).
Targets (issue 2, 2-core CPU, tf_efficientnetv2_s 224, batch 8, fp32): eval ratio >= 1.0,
training-step ratio >= 0.8.
"""
from __future__ import annotations

import argparse
import copy
import os
import resource
import statistics
import time

import torch  # before anything that could pull tensorflow in (see tests/conftest.py)

LR, WEIGHT_DECAY = 1e-3, 0.05


def flax_cases(name: str, timm_model, images, labels, conv_impl: str) -> dict:
    """``{"eval": fn, "train": fn, "logits": eval logits}``; each fn runs one batch and blocks on the result."""
    import jax
    import jax.numpy as jnp
    import optax

    from kaggle_utils.efficientnet import create_model
    from weights_port.convert import convert_timm

    model = create_model(name, num_classes=timm_model.num_classes, conv_impl=conv_impl)
    variables = jax.tree.map(jnp.asarray, convert_timm(timm_model, name))
    x = jnp.asarray(images.transpose(0, 2, 3, 1))
    y = jnp.asarray(labels)
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)

    evaluate = jax.jit(model.apply)

    def loss_fn(params, batch_stats):
        logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, x, mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        return loss, updates["batch_stats"]

    def train_step(state):
        params, batch_stats, opt_state = state
        (loss, batch_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats)
        updates, opt_state = tx.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), batch_stats, opt_state), loss

    train_step = jax.jit(train_step, donate_argnums=0)
    params, batch_stats = jax.tree.map(jnp.copy, (variables["params"], variables["batch_stats"]))
    state = [(params, batch_stats, tx.init(params))]  # donated each step: a copy, eval keeps `variables`

    def run_train():
        state[0], loss = train_step(state[0])
        loss.block_until_ready()

    logits = evaluate(variables, x).block_until_ready()
    return {"eval": lambda: evaluate(variables, x).block_until_ready(), "train": run_train, "logits": logits}


def timm_cases(timm_model, images, labels) -> dict:
    eval_model = timm_model.eval()
    x = torch.from_numpy(images)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    eval_cl = copy.deepcopy(timm_model).to(memory_format=torch.channels_last).eval()
    train_model = copy.deepcopy(timm_model).train()
    optimizer = torch.optim.AdamW(train_model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    y = torch.from_numpy(labels).long()

    def run_eval(model, inp):
        with torch.no_grad():
            model(inp)

    def run_train():
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(train_model(x), y)
        loss.backward()
        optimizer.step()

    with torch.no_grad():
        logits = eval_model(x).numpy()
    return {"eval": lambda: run_eval(eval_model, x), "eval_cl": lambda: run_eval(eval_cl, x_cl),
            "train": run_train, "logits": logits}


def timed_run(fn, batch: int, iters: int) -> dict:
    """Images/s over ``iters`` calls, and the process's CPU time and minor page faults per call.

    CPU time is split into user and system: on CPU, XLA allocates a training step's scratch
    memory (~1.2 GB for EfficientNetV2-S at batch 8) afresh on every call, and the kernel's
    page faulting of it shows up as system time, apart from the compute.
    """
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(iters):
        fn()
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return {"img/s": batch * iters / wall, "user ms": 1e3 * (after.ru_utime - before.ru_utime) / iters,
            "sys ms": 1e3 * (after.ru_stime - before.ru_stime) / iters,
            "minor faults": (after.ru_minflt - before.ru_minflt) / iters}


def run(args) -> dict:
    import numpy as np
    import timm

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    timm_model = timm.create_model(args.model, pretrained=False, drop_rate=0.0, drop_path_rate=0.0)
    rng = np.random.default_rng(0)
    images = rng.standard_normal((args.batch, 3, args.size, args.size), dtype=np.float32)
    labels = rng.integers(0, timm_model.num_classes, args.batch).astype(np.int32)

    start = time.perf_counter()
    flax = flax_cases(args.model, timm_model, images, labels, args.conv_impl)
    ref = timm_cases(timm_model, images, labels)
    diff = float(np.abs(np.asarray(flax["logits"]) - ref["logits"]).max() / np.abs(ref["logits"]).max())
    cases = {"flax eval": flax["eval"], "timm eval": ref["eval"], "timm eval CL": ref["eval_cl"],
             "flax train": flax["train"], "timm train": ref["train"]}
    for fn in cases.values():  # compile / allocate, then one more call to settle caches
        fn()
        fn()
    setup_s = time.perf_counter() - start
    runs = {case: [] for case in cases}
    for _ in range(args.rounds):
        for case, fn in cases.items():
            runs[case].append(timed_run(fn, args.batch, args.iters))
    return {"runs": runs, "logit_diff": diff, "setup_s": setup_s}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _ratio_row(label: str, runs: dict, flax: str, timm_case: str) -> str:
    f, t = _median(runs[flax], "img/s"), _median(runs[timm_case], "img/s")
    per_round = " ".join(f"{a['img/s'] / b['img/s']:.2f}" for a, b in zip(runs[flax], runs[timm_case]))
    return f"| {label} | {f:.2f} | {t:.2f} | **{f / t:.2f}** | {per_round} |"


def report(result: dict, args) -> None:
    import jax
    import timm

    runs = result["runs"]
    print(f"\n{args.model} {args.size}x{args.size} batch {args.batch} fp32, conv_impl={args.conv_impl}; "
          f"jax {jax.__version__} ({jax.default_backend()}), torch {torch.__version__} ({args.threads} threads), "
          f"timm {timm.__version__}; cpus={os.cpu_count()}; {args.rounds} rounds x {args.iters} iters; "
          f"setup {result['setup_s']:.0f} s; loadavg {result['load_start']:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; "
          f"eval logits max |Flax - timm| / max |timm| = {result['logit_diff']:.1e}\n")
    print("| case | Flax img/s | timm img/s | Flax/timm (medians) | per-round Flax/timm |")
    print("|---|---|---|---|---|")
    print(_ratio_row("eval forward (timm NCHW)", runs, "flax eval", "timm eval"))
    print(_ratio_row("eval forward (timm channels_last)", runs, "flax eval", "timm eval CL"))
    print(_ratio_row("train step: fwd + bwd + AdamW", runs, "flax train", "timm train"))
    print("\nraw images/s per round: "
          + "; ".join(f"{c}: " + " ".join(f"{r['img/s']:.2f}" for r in rs) for c, rs in runs.items()))
    print("\n| case | CPU user ms / call | CPU system ms / call | minor page faults / call |  (medians)")
    print("|---|---|---|---|")
    for case, rs in runs.items():
        print(f"| {case} | {_median(rs, 'user ms'):.0f} | {_median(rs, 'sys ms'):.0f} | {_median(rs, 'minor faults'):.0f} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tf_efficientnetv2_s", help="timm name of a registered variant")
    parser.add_argument("--size", type=int, default=224, help="input height = width")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7, --quick 3)")
    parser.add_argument("--iters", type=int, default=None, help="calls per timed run (default 3, --quick 2)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for timm")
    parser.add_argument("--conv-impl", default="auto", choices=("auto", "cpu", "xla"),
                        help="Flax convolution path (layers.conv2d impl)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations")
    args = parser.parse_args(argv)
    args.rounds = args.rounds or (3 if args.quick else 7)
    args.iters = args.iters or (2 if args.quick else 3)
    if args.rounds < 1 or args.iters < 1 or args.batch < 1 or args.size < 8:
        parser.error("--rounds, --iters and --batch must be >= 1 and --size >= 8")
    load_start = os.getloadavg()[0]
    result = run(args)
    result["load_start"] = load_start
    report(result, args)


if __name__ == "__main__":
    main()
