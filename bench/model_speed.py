"""Flax EfficientNet vs timm on this machine: eval forward and one training step, interleaved.

    python bench/model_speed.py                      # CPU: tf_efficientnetv2_s, 224, batch 8, fp32
    python bench/model_speed.py --quick              # CPU, fewer rounds: a rough figure
    python bench/model_speed.py --model tf_efficientnetv2_b0 --size 128 --batch 16 --conv-impl xla
    python bench/model_speed.py --mode gpu           # GPU: fp16, bf16 and strict fp32, batch 64
    python bench/model_speed.py --mode gpu-fp16      # a T4: Flax fp16 + loss scaling vs timm AMP fp16
    python bench/model_speed.py --mode gpu-bf16 --batch 128 --size 300
    python bench/model_speed.py --torch-compile default      # beside eager timm, timm + torch.compile (inductor)

Modes (``--mode``):

* ``cpu`` (default): fp32 on the CPU. timm eval both in NCHW (contiguous) and ``channels_last``;
  timm runs with ``torch.set_num_threads(--threads)``, XLA with its default thread pool. The kit's
  CPU settings hold as in its own steps (``kaggle_utils.xla_cpu``, printed in the header); glibc's is
  process-wide, so timm's allocations in this process are kept and reused as well.
* ``gpu-bf16``: each side's mixed precision, as one would train on a GPU. Flax computes in
  bfloat16 with fp32 parameters and statistics (``create_model(dtype=bfloat16)``, the kit's
  recipe); timm runs under ``torch.autocast("cuda", bfloat16)`` in ``channels_last``.
* ``gpu-fp16``: the T4 comparison. Flax computes in float16 with fp32 parameters and dynamic
  loss scaling (the kit's ``LossScale``: scaled loss, unscaled gradients, a finite check, a
  skipped update on overflow, as ``--precision fp16`` trains); timm runs timm's own default,
  ``torch.autocast("cuda", float16)`` with a ``GradScaler``, in ``channels_last``.
* ``gpu-fp32``: true fp32 on both sides, TF32 off: JAX under
  ``jax.default_matmul_precision("highest")`` (convolutions and dots), torch with
  ``torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False``;
  timm in ``channels_last``. The eval logits' difference printed for this mode is the check
  that neither side fell back to TF32 (TF32 rounding is ~1e-3 relative, fp32 ~1e-6).
* ``gpu``: all three, interleaved in one run: the one command for a lent GPU. bf16 on a GPU
  without bf16 hardware (compute capability below 8.0) measures XLA's and torch's fallbacks.

Each GPU report line also gives the fraction of the card's dense peak FLOP/s (a table of
known cards, fp32 / fp16 / bf16) that the training step reached, from the model's FLOPs as
XLA counts them for one forward (``surgery.count_flops``), times 3 for forward + backward.

The GPU modes set ``torch.backends.cudnn.benchmark = True`` (timm's own training scripts do)
and turn JAX's GPU memory preallocation off, since both frameworks share one device. Without
a GPU visible to both torch and JAX they stop with a one-line message.

Cases, each timed as ``--iters`` back-to-back calls on a batch of random images after
``--warmup`` untimed calls (compilation, cuDNN autotuning). On the CPU each Flax call blocks
on its result; on a GPU the calls are queued and the run ends with
``jax.block_until_ready`` / ``torch.cuda.synchronize()``, so host dispatch overlaps the device
work on both sides:

* eval forward: Flax ``model.apply`` (jit) vs timm ``model.eval()`` under ``torch.no_grad()``;
* training step (forward + backward + AdamW): Flax ``jax.jit`` step with ``value_and_grad``,
  BN in train mode (``mutable=["batch_stats"]``) and ``optax.adamw``, state donated; timm
  ``model.train()``, ``loss.backward()``, ``torch.optim.AdamW``. Same loss (softmax cross
  entropy in fp32), learning rate and weight decay; dropout and drop path are off on both sides.

Both models hold the same weights (timm's random init ported with ``weights_port``), and the
eval logits are compared once as a sanity check (not the exactness measure: timm's random init
with default BN statistics gives large logits whose fp32 rounding alone shows;
tests/test_efficientnet_parity.py is the exactness test). Other processes may share the
machine, so rounds are interleaved (every case once, then again) and the median per case is
reported with every round's Flax/timm ratio. Figures and targets: bench/README.md.

Size: one concern, one measurement: the two sides' cases (built to run the same work), the interleaved timing and
the report of their ratios are read together to trust a figure, and a user runs them as one script copied onto a
lent machine. What other benches share with it lives beside it (``flops.py``: FLOP counts and card peaks).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import importlib.metadata
import os
import platform
import resource
import statistics
import time

# Both frameworks share one GPU in the GPU modes: JAX must not take 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import torch  # noqa: E402  (before anything that could pull tensorflow in: see tests/conftest.py)
from flops import peak_tflops, train_flops_per_image  # noqa: E402  (bench/, beside this script)

LR, WEIGHT_DECAY = 1e-3, 0.05
MODES = {"cpu": ("fp32",), "gpu": ("fp16", "bf16", "fp32"), "gpu-fp16": ("fp16",), "gpu-bf16": ("bf16",),
         "gpu-fp32": ("fp32",)}
DEFAULTS = {  # (batch, rounds, iters, warmup) per kind of mode; --quick: (rounds, iters)
    "cpu": {"batch": 8, "rounds": 7, "iters": 3, "warmup": 2, "quick": (3, 2)},
    "gpu": {"batch": 64, "rounds": 5, "iters": 20, "warmup": 5, "quick": (3, 10)},
}
VERSIONED = ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda13-plugin", "flax", "optax", "torch", "timm",
             "nvidia-cudnn-cu12", "nvidia-cudnn-cu13")


def flax_cases(name: str, timm_model, images, labels, conv_impl: str, precision: str = "fp32") -> dict:
    """``{"eval": fn, "train": fn, "logits": eval logits}``; each fn queues one batch and returns its output.

    ``precision``: ``"fp32"`` (on a GPU with every conv and dot at ``"highest"`` precision, no
    TF32), ``"bf16"`` (bfloat16 compute, fp32 parameters and BN statistics) or ``"fp16"`` (float16
    compute with the kit's dynamic loss scale).
    """
    import jax
    import jax.numpy as jnp
    import optax

    from kaggle_utils.efficientnet import create_model
    from kaggle_utils.precision import LossScale, Precision, all_finite
    from weights_port.convert import convert_timm

    dtype = Precision(precision).compute_dtype
    model = create_model(name, num_classes=timm_model.num_classes, conv_impl=conv_impl, dtype=dtype)
    variables = jax.tree.map(jnp.asarray, convert_timm(timm_model, name))
    x = jnp.asarray(images.transpose(0, 2, 3, 1))
    y = jnp.asarray(labels)
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    strict = precision == "fp32" and jax.default_backend() != "cpu"

    def exact():  # the config is part of jit's cache key: one compilation per setting
        return jax.default_matmul_precision("highest") if strict else contextlib.nullcontext()

    evaluate = jax.jit(model.apply)

    def loss_fn(params, batch_stats, factor, images, labels):
        logits, updates = model.apply({"params": params, "batch_stats": batch_stats}, images,
                                      mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels).mean()
        return loss * factor, (loss, updates["batch_stats"])

    def train_step(state, images, labels):  # the batch is an argument: closed over, XLA folds it as a constant
        params, batch_stats, opt_state, loss_scale = state
        factor = 1.0 if loss_scale is None else loss_scale.scale
        (_, (loss, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch_stats, factor,
                                                                                images, labels)
        grads = jax.tree.map(lambda g: g / factor, grads)
        updates, new_opt = tx.update(grads, opt_state, params)
        new = (optax.apply_updates(params, updates), new_stats, new_opt)
        if loss_scale is not None:  # an overflowing step changes nothing but the scale
            finite = all_finite(grads)
            new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, (params, batch_stats, opt_state))
            loss_scale = loss_scale.update(finite)
        return (*new, loss_scale), loss

    train_step = jax.jit(train_step, donate_argnums=0)
    params, batch_stats = jax.tree.map(jnp.copy, (variables["params"], variables["batch_stats"]))
    loss_scale = LossScale.create() if Precision(precision).loss_scaling else None
    state = [(params, batch_stats, tx.init(params), loss_scale)]  # donated each step: eval keeps `variables`

    def run_eval():
        with exact():
            return evaluate(variables, x)

    def run_train():
        with exact():
            state[0], loss = train_step(state[0], x, y)
        return loss

    logits = run_eval().astype(jnp.float32).block_until_ready()
    return {"eval": run_eval, "train": run_train, "logits": logits}


def timm_cases(timm_model, images, labels, *, device: str = "cpu", precision: str = "fp32",
               train_layout=torch.contiguous_format, compile_mode: str | None = None) -> dict:
    """``{"eval": NCHW fn, "eval_cl": channels_last fn, "train": fn, "logits"}`` on ``device``.

    On CUDA ``precision`` is ``"bf16"`` (autocast), ``"fp16"`` (autocast + ``GradScaler``, timm's
    default AMP) or ``"fp32"`` (TF32 off, set on every call: the flags are global and the cases
    of all precisions are interleaved). ``compile_mode``: the models under ``torch.compile`` in that mode
    (inductor), as timm's train.py ``--torch-compile`` compiles the model and leaves the optimizer eager; the first
    calls (the warm-up's seconds) are the compiles.
    """
    cuda = device == "cuda"
    x = torch.from_numpy(images).to(device)
    x_cl = x.contiguous(memory_format=torch.channels_last)
    y = torch.from_numpy(labels).long().to(device)
    eval_model = copy.deepcopy(timm_model).to(device).eval()
    eval_cl = copy.deepcopy(timm_model).to(device, memory_format=torch.channels_last).eval()
    train_model = copy.deepcopy(timm_model).to(device, memory_format=train_layout).train()
    optimizer = torch.optim.AdamW(train_model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    if compile_mode is not None:
        eval_model, eval_cl, train_model = (torch.compile(m, mode=compile_mode)
                                            for m in (eval_model, eval_cl, train_model))
    scaler = torch.amp.GradScaler("cuda", enabled=cuda and precision == "fp16")
    x_train = x.contiguous(memory_format=train_layout)

    def precision_of_call():
        if not cuda:
            return contextlib.nullcontext()
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision != "fp32"
        half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        return torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None)

    def run_eval(model, inp):
        with torch.no_grad(), precision_of_call():
            return model(inp)

    def run_train():
        optimizer.zero_grad(set_to_none=True)
        with precision_of_call():
            logits = train_model(x_train)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        scaler.scale(loss).backward()  # a pass-through when the scaler is disabled
        scaler.step(optimizer)
        scaler.update()
        return loss

    logits = run_eval(eval_cl if cuda else eval_model, x_cl if cuda else x).float().cpu().numpy()
    return {"eval": lambda: run_eval(eval_model, x), "eval_cl": lambda: run_eval(eval_cl, x_cl),
            "train": run_train, "logits": logits}


def timed_run(fn, batch: int, iters: int, finish=None) -> dict:
    """Images/s over ``iters`` calls (then ``finish(last output)``); wall ms, CPU time and minor page faults per call.

    CPU time is split into user and system: on CPU, XLA allocates a training step's scratch
    memory afresh on every call, and the kernel's page faulting of it shows up as system
    time, apart from the compute.
    """
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(iters):
        out = fn()
    if finish is not None:
        finish(out)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return {"img/s": batch * iters / wall, "ms": 1e3 * wall / iters,
            "user ms": 1e3 * (after.ru_utime - before.ru_utime) / iters,
            "sys ms": 1e3 * (after.ru_stime - before.ru_stime) / iters,
            "minor faults": (after.ru_minflt - before.ru_minflt) / iters}


def _logit_diff(flax_logits, timm_logits) -> float:
    import numpy as np

    return float(np.abs(np.asarray(flax_logits) - timm_logits).max() / np.abs(timm_logits).max())


def cpu_cases(args, timm_model, images, labels):
    """(cases, pairs, logit diffs) of the CPU mode: each case a ``(fn, finish)``; Flax calls block."""
    import jax

    from kaggle_utils import xla_cpu

    xla_cpu.keep_scratch_memory()  # as the kit's CPU steps have it (make_steps); process-wide: timm's too
    flax = flax_cases(args.model, timm_model, images, labels, args.conv_impl)
    ref = timm_cases(timm_model, images, labels)
    blocking = {k: (lambda f=flax[k]: jax.block_until_ready(f())) for k in ("eval", "train")}
    cases = {"flax eval": (blocking["eval"], None), "timm eval": (ref["eval"], None),
             "timm eval CL": (ref["eval_cl"], None), "flax train": (blocking["train"], None),
             "timm train": (ref["train"], None)}
    pairs = [("eval forward (timm NCHW)", "flax eval", "timm eval"),
             ("eval forward (timm channels_last)", "flax eval", "timm eval CL"),
             ("train step: fwd + bwd + AdamW", "flax train", "timm train")]
    for mode in args.torch_compile:  # the compiled peer: channels_last eval, the train step as timm's --torch-compile
        compiled = timm_cases(timm_model, images, labels, compile_mode=mode)
        cases[f"timm eval CL compiled-{mode}"] = (compiled["eval_cl"], None)
        cases[f"timm train compiled-{mode}"] = (compiled["train"], None)
        pairs += [(f"eval forward (timm channels_last + torch.compile {mode})", "flax eval",
                   f"timm eval CL compiled-{mode}"),
                  (f"train step (timm + torch.compile {mode})", "flax train", f"timm train compiled-{mode}")]
    return cases, pairs, {"fp32": _logit_diff(flax["logits"], ref["logits"])}


def gpu_cases(args, timm_model, images, labels):
    """(cases, pairs, logit diffs) of a GPU mode: per precision, eval and train on both sides, timm channels_last."""
    import jax

    torch.backends.cudnn.benchmark = True
    cases, pairs, diffs = {}, [], {}
    synchronize = lambda _: torch.cuda.synchronize()  # noqa: E731
    for precision in MODES[args.mode]:
        flax = flax_cases(args.model, timm_model, images, labels, args.conv_impl, precision)
        ref = timm_cases(timm_model, images, labels, device="cuda", precision=precision,
                         train_layout=torch.channels_last)
        diffs[precision] = _logit_diff(flax["logits"], ref["logits"])
        for kind, timm_kind, label in (("eval", "eval_cl", "eval forward"), ("train", "train", "train step")):
            cases[f"flax {precision} {kind}"] = (flax[kind], jax.block_until_ready)
            cases[f"timm {precision} {kind}"] = (ref[timm_kind], synchronize)
            pairs.append((f"{precision} {label}", f"flax {precision} {kind}", f"timm {precision} {kind}"))
        for mode in args.torch_compile:  # the compiled peer, same precision and layout
            compiled = timm_cases(timm_model, images, labels, device="cuda", precision=precision,
                                  train_layout=torch.channels_last, compile_mode=mode)
            for kind, timm_kind, label in (("eval", "eval_cl", "eval forward"), ("train", "train", "train step")):
                cases[f"timm {precision} {kind} compiled-{mode}"] = (compiled[timm_kind], synchronize)
                pairs.append((f"{precision} {label} vs timm + torch.compile {mode}", f"flax {precision} {kind}",
                              f"timm {precision} {kind} compiled-{mode}"))
    return cases, pairs, diffs


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
    build = cpu_cases if args.mode == "cpu" else gpu_cases
    cases, pairs, diffs = build(args, timm_model, images, labels)
    for case, (fn, finish) in cases.items():  # compile / allocate / autotune, then settle caches
        case_start = time.perf_counter()
        timed_run(fn, args.batch, args.warmup, finish)
        print(f"warm-up {case}: {time.perf_counter() - case_start:.1f} s", flush=True)
    setup_s = time.perf_counter() - start
    runs = {case: [] for case in cases}
    for round_ in range(args.rounds):  # each round printed as it ends: a run cut short still reports
        for case, (fn, finish) in cases.items():
            runs[case].append(timed_run(fn, args.batch, args.iters, finish))
        print(f"round {round_ + 1} images/s: " + "; ".join(f"{c} {r[-1]['img/s']:.1f}" for c, r in runs.items()),
              flush=True)
    flops = None if args.mode == "cpu" else train_flops_per_image(args.model, timm_model, args.size)
    return {"runs": runs, "pairs": pairs, "logit_diffs": diffs, "setup_s": setup_s, "train_flops": flops}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _ratio_row(label: str, runs: dict, flax: str, timm_case: str) -> str:
    f, t = _median(runs[flax], "img/s"), _median(runs[timm_case], "img/s")
    per_round = " ".join(f"{a['img/s'] / b['img/s']:.2f}" for a, b in zip(runs[flax], runs[timm_case]))
    return f"| {label} | {f:.2f} | {t:.2f} | **{f / t:.2f}** | {per_round} |"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def device_description(mode: str) -> str:
    """The device the cases ran on, as both frameworks name it."""
    if mode == "cpu":
        return f"CPU {_cpu_name()}, {os.cpu_count()} cores"
    import jax

    device = jax.devices()[0]
    runtime = getattr(device.client, "platform_version", "").strip()  # e.g. the CUDA runtime JAX loaded
    capability = ".".join(map(str, torch.cuda.get_device_capability(0)))
    return (f"GPU {torch.cuda.get_device_name(0)}, compute capability {capability} (torch) / {device.device_kind} "
            f"(jax; {runtime})")


def versions() -> str:
    """Installed versions of the packages that decide the figures, and torch's CUDA / cuDNN."""
    found = []
    for name in VERSIONED:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    if torch.cuda.is_available():
        found.append(f"torch CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    return ", ".join(found)


def report(result: dict, args) -> None:
    from kaggle_utils import xla_cpu

    runs = result["runs"]
    diffs = "; ".join(f"{p}: {d:.1e}" for p, d in result["logit_diffs"].items())
    print(f"\n{args.model} {args.size}x{args.size} batch {args.batch}, mode {args.mode} "
          f"({' + '.join(MODES[args.mode])}), conv_impl={args.conv_impl}\n"
          f"device: {device_description(args.mode)}\nversions: {versions()}\n"
          f"torch threads {args.threads}; {args.rounds} rounds x {args.iters} iters after {args.warmup} warm-up "
          f"calls; setup {result['setup_s']:.0f} s; loadavg {result['load_start']:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"{xla_cpu.describe()}\n"
          f"eval logits max |Flax - timm| / max |timm|: {diffs}\n")
    print("| case | Flax img/s | timm img/s | Flax/timm (medians) | per-round Flax/timm |")
    print("|---|---|---|---|---|")
    for label, flax, timm_case in result["pairs"]:
        print(_ratio_row(label, runs, flax, timm_case))
    flops = result["train_flops"]
    if flops:
        import jax

        kind = jax.devices()[0].device_kind
        for label, flax, timm_case in result["pairs"]:
            precision = label.split()[0]
            peak = peak_tflops(kind, precision)
            if "train" in label and peak:
                reached = {side: _median(runs[case], "img/s") * flops / 1e12 / peak
                           for side, case in (("Flax", flax), ("timm", timm_case))}
                print(f"{label}: {flops / 1e9:.1f} GFLOPs per image; of {kind}'s {peak:g} TFLOP/s {precision} peak: "
                      + ", ".join(f"{side} {share:.1%}" for side, share in reached.items()))
    print("\nraw images/s per round: "
          + "; ".join(f"{c}: " + " ".join(f"{r['img/s']:.2f}" for r in rs) for c, rs in runs.items()))
    print("\n| case | CPU user ms / call | CPU system ms / call | minor page faults / call |  (medians)")
    print("|---|---|---|---|")
    for case, rs in runs.items():
        print(f"| {case} | {_median(rs, 'user ms'):.0f} | {_median(rs, 'sys ms'):.0f} | {_median(rs, 'minor faults'):.0f} |")


def gpu_problem() -> str | None:
    """Why the GPU modes cannot run here (None: torch and JAX both see a CUDA GPU)."""
    if not torch.cuda.is_available():
        return (f"no CUDA GPU visible to torch (torch {torch.__version__}, built for CUDA {torch.version.cuda}: "
                "torch.cuda.is_available() is False)")
    importlib.import_module("kaggle_utils")  # before JAX starts: the kit's XLA options
    import jax

    try:
        jax.devices("gpu")
    except RuntimeError:
        return f"no GPU visible to JAX (backend {jax.default_backend()}; a CUDA jaxlib, e.g. jax[cuda12], is needed)"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="modes:\n"
                                            "  cpu       fp32 on the CPU; timm in NCHW and in channels_last\n"
                                            "  gpu-bf16  Flax bf16 compute (fp32 params) vs timm AMP bf16 + "
                                            "channels_last\n"
                                            "  gpu-fp32  fp32 with TF32 off on both sides (JAX precision "
                                            "'highest'; torch allow_tf32 False)\n"
                                            "  gpu-fp16  Flax fp16 + loss scaling vs timm AMP fp16 + GradScaler + "
                                            "channels_last (the T4 comparison)\n"
                                            "  gpu       gpu-fp16, gpu-bf16 and gpu-fp32 interleaved in one run")
    parser.add_argument("--mode", default="cpu", choices=tuple(MODES),
                        help="cpu | gpu (fp16, bf16 and fp32) | gpu-fp16 | gpu-bf16 | gpu-fp32 (default: cpu)")
    parser.add_argument("--model", default="tf_efficientnetv2_s", help="timm name of a registered variant")
    parser.add_argument("--size", type=int, default=224, help="input height = width")
    parser.add_argument("--batch", type=int, default=None, help="images per call (default 8 on cpu, 64 on gpu)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default cpu 7, gpu 5; "
                                                                   "--quick 3)")
    parser.add_argument("--iters", type=int, default=None, help="calls per timed run (default cpu 3, gpu 20; "
                                                                  "--quick 2 / 10)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed calls per case before the rounds "
                                                                   "(default cpu 2, gpu 5)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for timm")
    parser.add_argument("--conv-impl", default="auto", choices=("auto", "cpu", "xla"),
                        help="Flax convolution path (layers.conv2d impl)")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and iterations")
    parser.add_argument("--torch-compile", nargs="*", default=[], choices=("default", "reduce-overhead",
                                                                           "max-autotune"), metavar="MODE",
                        help="also time timm under torch.compile in these modes (inductor; the warm-up's seconds "
                             "are its compiles): the compiled peer beside eager timm")
    return parser


def parse_args(argv=None) -> argparse.Namespace:
    """The flags with the mode's defaults filled in; bad values stop with a message naming the flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    defaults = DEFAULTS["cpu" if args.mode == "cpu" else "gpu"]
    quick_rounds, quick_iters = defaults["quick"]
    given = {"batch": defaults["batch"], "warmup": defaults["warmup"],
             "rounds": quick_rounds if args.quick else defaults["rounds"],
             "iters": quick_iters if args.quick else defaults["iters"]}
    for name, default in given.items():  # None: not given (a given 0 is refused below)
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.rounds < 1 or args.iters < 1 or args.batch < 1 or args.size < 8 or args.warmup < 1:
        bad = [f"--{k} {v}" for k, v in vars(args).items() if k in ("rounds", "iters", "warmup", "batch") and v < 1]
        parser.error(f"{', '.join(bad + ([f'--size {args.size}'] if args.size < 8 else []))}: "
                     "--rounds, --iters, --warmup and --batch must be >= 1, --size >= 8")
    if args.mode != "cpu":
        problem = gpu_problem()
        if problem:
            parser.exit(2, f"{parser.prog}: error: --mode {args.mode} needs a GPU: {problem}\n")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    load_start = os.getloadavg()[0]
    result = run(args)
    result["load_start"] = load_start
    report(result, args)


if __name__ == "__main__":
    main()
