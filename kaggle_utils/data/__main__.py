"""``python -m kaggle_utils.data convert SRC --out DIR``: any image source -> competition-layout TFRecords."""

import argparse
import sys

from ..config import int_in
from .convert import convert_source, source_from_spec
from .tfrecords import DataError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils.data")
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="write a folder / CSV / tfds source as TFRecords (train/ val/ test/)",
                                  description=__doc__)
    convert.add_argument("source", metavar="SRC",
                         help="class-folder directory DIR/<class>/<image>, a CSV (with --image-dir), or tfds:NAME[:SPLIT]")
    convert.add_argument("--out", required=True, help="output folder: train/ val/ test/ and class_names.json")
    convert.add_argument("--image-size", type=int_in(1), default=512, help="stored size, N x N (default 512)")
    convert.add_argument("--val-fraction", type=float, default=0.15, help="stratified validation share (default 0.15)")
    convert.add_argument("--shards", type=int_in(1), default=16, help="files per split (default 16)")
    convert.add_argument("--test", metavar="SRC", help="unlabeled test images: a folder, a CSV of ids, or tfds:NAME:SPLIT")
    convert.add_argument("--image-dir", help="images of a CSV source (default: the CSV's folder)")
    convert.add_argument("--test-image-dir", help="images of a CSV test source (default: the CSV's folder)")
    convert.add_argument("--id-column", default="id", help="CSV column with the image id or file name (default id)")
    convert.add_argument("--label-column", default="label", help="CSV column with the label(s) (default label)")
    convert.add_argument("--tfds-data-dir", help="tensorflow-datasets data_dir where the dataset is prepared")
    convert.add_argument("--quality", type=int_in(1, 100), default=95, help="JPEG quality, 1-100 (default 95)")
    convert.add_argument("--seed", type=int, default=0, help="seed of the validation split and shard order")
    convert.add_argument("--skip-errors", action="store_true", help="leave out images that do not decode (counted)")
    convert.add_argument("--overwrite", action="store_true", help="replace an earlier conversion in --out")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        train = source_from_spec(args.source, image_dir=args.image_dir, id_column=args.id_column,
                                 label_column=args.label_column, tfds_data_dir=args.tfds_data_dir)
        test = None if args.test is None else source_from_spec(
            args.test, image_dir=args.test_image_dir, id_column=args.id_column, tfds_data_dir=args.tfds_data_dir,
            labeled=False, class_names=train.class_names)
        info = convert_source(train, args.out, image_size=args.image_size, val_fraction=args.val_fraction,
                              shards=args.shards, test=test, seed=args.seed, quality=args.quality,
                              overwrite=args.overwrite, skip_errors=args.skip_errors)
    except (DataError, FileExistsError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk, a read-only --out: the conversion is staged, so --out is as it was
        print(f"error: {err.filename + ': ' if err.filename else ''}{err.strerror or err}; {args.out} is as it was "
              "(a conversion is swapped in only once complete)", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: {info['counts']} examples, {len(info['class_names'])} classes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
