"""Where a training step's time goes: each stage's forward + backward, Flax vs timm, interleaved.

    python bench/stage_speed.py                       # tf_efficientnetv2_s, 224, batch 8, fp32, CPU
    python bench/stage_speed.py --model tf_efficientnetv2_b0 --size 128 --batch 16
    python bench/stage_speed.py --torch-compile default   # timm's pieces under torch.compile (inductor)

``bench/model_speed.py`` says how a whole training step compares; this script says where the
difference lives. The network is cut where timm cuts it (the stem, each ``blocks[i]`` stage, the
head) and each piece runs on its own, at the shape it sees inside the network, as one jitted
``grad`` of ``sum(output)`` in Flax (the kit's blocks, BN in training mode) and as
``piece(x).backward(ones)`` in timm (``model.train()``, NCHW as in model_speed's training step; with
``--torch-compile MODE`` each piece under ``torch.compile``, so the peer is inductor's code, not eager timm's).
Both take the gradient of the piece's parameters and, except for the stem (the image needs none), of
its input, as inside a real step. The optimizer and the loss are left out, so the pieces do not sum
to the step exactly. Rounds are interleaved piece by piece (other processes may share the machine);
the table gives medians, timm/Flax per piece (above 1: Flax is faster), the milliseconds Flax
spends beyond timm, and each side's system CPU time and minor page faults per call (XLA:CPU
takes a program's scratch memory afresh on every call; the kernel's zeroing of it shows there).
Figures: bench/README.md.
"""
from __future__ import annotations

import argparse
import os
import statistics

import torch  # noqa: E402  (before anything that could pull tensorflow in: see tests/conftest.py)

from model_speed import timed_run  # a sibling script: bench/ is on sys.path when a script there runs


def timm_pieces(model) -> dict:
    """``{name: module}`` in forward order: the stem (conv + BN + act), each stage, the head."""
    pieces = {"stem": torch.nn.Sequential(model.conv_stem, model.bn1)}
    pieces.update({f"stage {i}": stage for i, stage in enumerate(model.blocks)})
    pieces["head"] = torch.nn.Sequential(model.conv_head, model.bn2)
    return pieces


def flax_piece(model, name: str):
    """The same piece built from the kit's modules, as a Flax module of one input."""
    from flax import linen as nn

    from kaggle_utils.efficientnet.blocks import BLOCKS
    from kaggle_utils.efficientnet.layers import BatchNorm, Conv2d

    cfg = model.layer_cfg

    class Piece(nn.Module):
        @nn.compact
        def __call__(self, x):
            if name == "stem":
                return cfg.act_fn(BatchNorm(cfg)(Conv2d(model.spec.stem_chs, 3, cfg, stride=2)(x), True))
            if name == "head":
                return cfg.act_fn(BatchNorm(cfg)(Conv2d(model.num_features, 1, cfg)(x), True))
            for block in model.stages[int(name.split()[1])]:
                x = BLOCKS[block.block_type](block, cfg)(x, True)
            return x

    return Piece()


def cases(args) -> list[tuple[str, tuple, callable, callable]]:
    """``(piece, NCHW input shape, flax call, timm call)`` per piece; each call runs fwd + bwd once."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import timm

    from kaggle_utils.efficientnet import create_model

    timm_model = timm.create_model(args.model, pretrained=False).train()
    model = create_model(args.model, conv_impl=args.conv_impl)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((args.batch, 3, args.size, args.size), dtype=np.float32))
    built = []
    for name, piece in timm_pieces(timm_model).items():
        with torch.no_grad():
            out_shape = tuple(piece(x).shape)
        t_in = x.clone().requires_grad_(name != "stem")
        ones = torch.ones(out_shape)
        if args.torch_compile:
            piece = torch.compile(piece, mode=args.torch_compile)

        def timm_call(piece=piece, t_in=t_in, ones=ones):
            piece(t_in).backward(ones)

        f_piece = flax_piece(model, name)
        f_in = jnp.asarray(x.numpy().transpose(0, 2, 3, 1))
        variables = f_piece.init(jax.random.key(0), f_in)
        f_out = jax.eval_shape(lambda v, a: f_piece.apply(v, a, mutable=["batch_stats"])[0], variables, f_in)
        if f_out.shape != (out_shape[0], *out_shape[2:], out_shape[1]):
            raise SystemExit(f"{name}: Flax output {f_out.shape} is not timm's {out_shape} (NCHW)")

        def loss(params, inputs, f_piece=f_piece, stats=variables["batch_stats"]):
            out, _ = f_piece.apply({"params": params, "batch_stats": stats}, inputs, mutable=["batch_stats"])
            return out.sum()

        grad = jax.jit(jax.grad(loss, argnums=0 if name == "stem" else (0, 1)))
        flax_call = lambda grad=grad, p=variables["params"], a=f_in: jax.block_until_ready(grad(p, a))  # noqa: E731
        built.append((name, tuple(x.shape), flax_call, timm_call))
        x = torch.randn(out_shape)
    return built


def run(args) -> list[dict]:
    """Per piece: its input shape and, per side, one ``timed_run`` result per round (``ms`` per call)."""
    from kaggle_utils import xla_cpu

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    xla_cpu.keep_scratch_memory()  # as the kit's CPU steps have it (make_steps); process-wide: timm's too
    built = cases(args)
    for _, _, flax_call, timm_call in built:  # compile, allocate, settle caches
        for _ in range(args.warmup):
            flax_call(), timm_call()
    rows = [{"piece": name, "shape": shape, "flax": [], "timm": []} for name, shape, _, _ in built]
    for _ in range(args.rounds):
        for row, (_, _, flax_call, timm_call) in zip(rows, built):
            row["flax"].append(timed_run(flax_call, args.batch, args.iters))
            row["timm"].append(timed_run(timm_call, args.batch, args.iters))
    return rows


def report(rows: list[dict], args, load_start: float) -> None:
    from kaggle_utils import xla_cpu

    peer = f"timm + torch.compile {args.torch_compile}" if args.torch_compile else "eager timm"
    print(f"\n{args.model} {args.size}x{args.size} batch {args.batch}, fp32, conv_impl={args.conv_impl}, timm side: "
          f"{peer}, torch threads {args.threads}; {args.rounds} rounds x {args.iters} calls after {args.warmup}; "
          f"loadavg {load_start:.1f} -> {os.getloadavg()[0]:.1f}\n{xla_cpu.describe()}\n")
    print("| piece | input (NCHW) | Flax ms | timm ms | timm / Flax | Flax - timm ms | per-round timm / Flax "
          "| system ms Flax / timm | page faults Flax / timm |")
    print("|---|---|---|---|---|---|---|---|---|")
    total = {"flax": 0.0, "timm": 0.0}
    for row in rows:
        med = {side: {k: statistics.median(r[k] for r in row[side]) for k in row[side][0]} for side in total}
        f, t = med["flax"]["ms"], med["timm"]["ms"]
        total = {"flax": total["flax"] + f, "timm": total["timm"] + t}
        per_round = " ".join(f"{b['ms'] / a['ms']:.2f}" for a, b in zip(row["flax"], row["timm"]))
        print(f"| {row['piece']} | {'x'.join(map(str, row['shape']))} | {f:.1f} | {t:.1f} | **{t / f:.2f}** | "
              f"{f - t:+.1f} | {per_round} | {med['flax']['sys ms']:.0f} / {med['timm']['sys ms']:.0f} | "
              f"{med['flax']['minor faults']:.0f} / {med['timm']['minor faults']:.0f} |")
    f, t = total["flax"], total["timm"]
    print(f"| all pieces | | {f:.1f} | {t:.1f} | **{t / f:.2f}** | {f - t:+.1f} | | | |")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tf_efficientnetv2_s", help="timm name of a registered variant")
    parser.add_argument("--size", type=int, default=224, help="input height = width")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--iters", type=int, default=3, help="calls per timed run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls per piece first")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads for timm")
    parser.add_argument("--conv-impl", default="auto", choices=("auto", "cpu", "xla"),
                        help="Flax convolution path (layers.conv2d impl)")
    parser.add_argument("--torch-compile", default=None, choices=("default", "reduce-overhead", "max-autotune"),
                        help="timm's pieces under torch.compile in this mode (inductor); default: eager timm")
    args = parser.parse_args(argv)
    bad = [f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
           if k in ("batch", "rounds", "iters", "warmup", "threads") and v < 1]
    if bad or args.size < 8:
        parser.error(f"{', '.join(bad + ([f'--size {args.size}'] if args.size < 8 else []))}: "
                     "--batch, --rounds, --iters, --warmup and --threads must be >= 1, --size >= 8")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    load_start = os.getloadavg()[0]
    import kaggle_utils  # noqa: F401  (before JAX starts: the kit's XLA:CPU option)

    report(run(args), args, load_start)


if __name__ == "__main__":
    main()
