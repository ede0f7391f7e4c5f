"""``python -m weights_port NAME --out FILE.msgpack [--checkpoint FILE] [--num-classes N] [--random]``"""
import argparse
import sys

from kaggle_utils.config import int_in
from kaggle_utils.efficientnet import list_models

from .convert import ConversionError
from .port import VerificationError, port


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m weights_port", description=(
        "Port a timm EfficientNet to Flax: convert, verify against timm, write msgpack + JSON manifest."))
    p.add_argument("name", help=f"timm model name or short V2 name (s, m, l, xl, b0-b3); one of: "
                                f"{', '.join(list_models())}")
    p.add_argument("--out", required=True, help="output .msgpack file (manifest written beside as .json)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--checkpoint", help="local timm weights (.safetensors, .pth, .bin); default: timm pretrained")
    src.add_argument("--random", action="store_true", help="port randomly initialised weights (offline demo)")
    p.add_argument("--num-classes", type=int_in(1), default=None, help="default: the checkpoint's classifier size")
    p.add_argument("--verify-size", type=int_in(1), default=128, help="input size of the parity check (default 128)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not args.out.endswith(".msgpack"):
        p.error(f"--out must end with .msgpack, got {args.out!r}")
    try:
        r = port(args.name, args.out, checkpoint_path=args.checkpoint, pretrained=not args.random,
                 num_classes=args.num_classes, verify_size=args.verify_size, seed=args.seed)
    except (VerificationError, ConnectionError, ConversionError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        # 1: the port or the network failed; 2: bad input, a usage error like argparse's
        return 1 if isinstance(e, (VerificationError, ConnectionError)) else 2
    print(f"{r.name}: {r.num_classes} classes, max |logit diff| vs timm {r.max_abs_diff:.2e} "
          f"({r.max_rel_diff:.2e} of the logit scale)\nwrote {r.out} (sha256 {r.sha256[:16]}...) and its manifest")
    return 0


if __name__ == "__main__":
    sys.exit(main())
