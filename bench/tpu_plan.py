"""The flagship configurations on Kaggle's TPU v5e-8, measured by the TPU compiler on any machine (libtpu installed).

For each model at its size, without and with ``--remat blocks``: the run's jit train step compiled
for the v5e:2x4 mesh in bf16 (the plan command's config: a head padded to 128, 104 classes) at 16,
8 and 32 images per chip (bytes per chip, fits or not, train GFLOPs per image, compile seconds), the
eval step's GFLOPs per image, and the largest per-chip batch ``--batch-per-device auto`` would choose
there (the same search, against the chip's 15.75 GiB less the 10% margin); the cheapest answers
first (see ``main``).

Compiles are slow on a small machine (minutes each): every result goes to ``--out`` (JSON) as soon
as it is measured and a rerun skips what is there, so the bench can be killed and resumed::

    nice -n 10 python bench/tpu_plan.py --out bench/tpu_plan.json   # then: --table prints bench/README.md's table
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from kaggle_utils.run import target_plan

target_plan.quiet_libtpu()  # before JAX loads libtpu (no TPU here: no search for TPU hosts)

from kaggle_utils import run  # noqa: E402
from kaggle_utils.config import TrainConfig  # noqa: E402
from kaggle_utils.parallel import make_mesh  # noqa: E402
from kaggle_utils.run import memory_plan  # noqa: E402

CONFIGS = [("tf_efficientnetv2_b0", 224), ("tf_efficientnetv2_s", 384), ("tf_efficientnetv2_m", 512),
           ("tf_efficientnetv2_l", 480)]
BATCHES = (8, 16, 32)
TARGET = "tpu-v5e-8"
TRAIN_IMAGES = 12_753  # the flower competition's train split


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, results: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1, sort_keys=True))
    os.replace(tmp, path)


def measure(model: str, size: int, remat: str, results: dict, path: Path, devices, *, batches=BATCHES,
            search: bool = False, evaluate: bool = False) -> None:
    config = target_plan.target_config(TrainConfig().replace(model=model, image_size=size, num_classes=104,
                                                             remat=remat, batch_per_device=8), TARGET)
    resolved, plan = run.resolve(config, target_plan.no_data(config, TRAIN_IMAGES))
    compiled = memory_plan.step_compiler(resolved, plan, mesh=make_mesh(devices), mode="jit")
    prefix = f"{model}/{size}/{remat}"

    def step(name: str, per_chip: int) -> memory_plan.StepMemory:
        key = f"{prefix}/{name}/{per_chip}"
        if key not in results:
            load_avg = os.getloadavg()[0]
            results[key] = {**dataclasses.asdict(compiled(name, per_chip)), "load_avg": round(load_avg, 2),
                            "date": time.strftime("%Y-%m-%d %H:%M")}
            save(path, results)
            r = results[key]
            print(f"{key}: {r['refused'] or f'{(r_bytes(r)) / 2 ** 30:.2f} GiB'}, {r['seconds']:.0f} s compile "
                  f"(load {load_avg:.1f})", flush=True)
        fields = {f.name for f in dataclasses.fields(memory_plan.StepMemory)}
        return memory_plan.StepMemory(**{k: v for k, v in results[key].items() if k in fields})

    for per_chip in batches:
        step("train", per_chip)
    if search and f"{prefix}/largest" not in results:
        hbm = target_plan.TARGETS[TARGET].hbm
        fit = memory_plan.fit_batch(resolved, plan, per_device_limit=TRAIN_IMAGES // len(devices),
                                    budget=(hbm, "v5e HBM"), compile_step=step)
        results[f"{prefix}/largest"] = {"per_chip": fit.per_device, "bytes": fit.needed}
        save(path, results)
        print(f"{prefix}: largest per chip {fit.per_device} ({fit.needed / 2 ** 30:.2f} GiB)", flush=True)
    if evaluate:
        step("eval", 32)


def r_bytes(r: dict) -> int:
    return max(r["arguments"] + r["outputs"] + r["temporaries"] - r["aliased"] + r["code"], r["peak"])


def table(results: dict) -> str:
    """bench/README.md's table: per model, size and remat, each batch's bytes per chip and compile seconds."""
    lines = ["| model | size | remat | 8 / chip | 16 / chip | 32 / chip | largest / chip | train GFLOPs / image | "
             "eval GFLOPs / image |", "|---" * 9 + "|"]
    usable = 0.9 * target_plan.TARGETS[TARGET].hbm
    for model, size in CONFIGS:
        for remat in ("none", "blocks"):
            prefix, cells, flops = f"{model}/{size}/{remat}", [], "…"
            for b in BATCHES:
                r = results.get(f"{prefix}/train/{b}")
                if r is None:
                    cells.append("…")
                    continue
                fit = "refused (> HBM)" if r["refused"] else f"{r_bytes(r) / 2 ** 30:.2f} GiB" + (
                    "" if r_bytes(r) <= usable else " ✗")
                cells.append(f"{fit} ({r['seconds']:.0f} s)")
                flops = f"{r['flops'] / b / 1e9:.1f}" if not r["refused"] and flops == "…" else flops
            largest = results.get(f"{prefix}/largest")
            ev = results.get(f"{model}/{size}/none/eval/32")
            eval_flops = f"{ev['flops'] / 32 / 1e9:.1f}" if ev and not ev["refused"] else "…"
            lines.append(f"| {model.removeprefix('tf_efficientnetv2_')} | {size} | {remat} | {' | '.join(cells)} | "
                         f"{largest['per_chip'] if largest else '…'} | {flops} | {eval_flops} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("tpu_plan.json"))
    parser.add_argument("--models", nargs="*", help="only these (e.g. tf_efficientnetv2_b0)")
    parser.add_argument("--table", action="store_true", help="print the markdown table of what --out holds, and exit")
    args = parser.parse_args(argv)
    results = load(args.out)
    if args.table:
        print(table(results))
        return 0
    try:
        devices = target_plan.target_devices(TARGET)
    except Exception as err:  # libtpu missing or of the wrong version: one line
        print(f"tpu_plan: {err}", file=sys.stderr)
        return 2
    configs = [(m, s) for m, s in CONFIGS if not args.models or m in args.models]
    # the cheapest answers first, every model (smallest first) before the next: 16 per chip and the eval step,
    # --remat blocks at 16, then 8 and 32 both ways, then the searches (several compiles each)
    for remat, work in (("none", {"batches": (16,), "evaluate": True}), ("blocks", {"batches": (16,)}),
                        ("none", {"batches": (8, 32)}), ("blocks", {"batches": (8, 32)}),
                        ("none", {"batches": (), "search": True}), ("blocks", {"batches": (), "search": True})):
        for model, size in configs:
            measure(model, size, remat, results, args.out, devices, **work)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
