"""``python -m kaggle_utils train | cv | tune | predict | plan | report``: :mod:`kaggle_utils.run` from a command line.

Flags in (``train``, ``cv``, ``tune`` and ``plan`` take :class:`~kaggle_utils.config.TrainConfig`'s fields), words
out: each command ends with a summary block, and every way it can stop is one line and an exit code.
"""
import argparse
import errno
import json
import time
from pathlib import Path

import jax

from . import checkpoint, outdir, report, run, runtime
from .config import ConfigError, DataConfig, TrainConfig, add_config_flags, config_from_args, config_from_file, int_in
from .data import DataError
from .data.convert import source_from_spec
from .run import target_plan
from .run.tune import PRUNERS
from .train import MetricError, TrainingDiverged, WriterError


def _comma_list(kind: type, what: str, example: str):
    """An argparse type: a comma-separated list of ``kind`` values, refused naming ``what`` it should be."""

    def parse(text: str) -> tuple:
        try:
            return tuple(kind(value) for value in text.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {what} (e.g. {example})"
                                             ) from None

    return parse


def build_parser(config_cls: type = TrainConfig) -> argparse.ArgumentParser:
    """The job's parser; ``config_cls``: a :class:`TrainConfig` subclass whose added fields become flags too."""
    parser = argparse.ArgumentParser(prog="python -m kaggle_utils",
                                     description="Train an EfficientNet on TFRecords in the flower competition's "
                                                 "layout, or predict a submission from a run.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, command, own_flags, help, out, resume, overwrite in _RUN_COMMANDS:  # --out, --resume, ..., the config
        sub = commands.add_parser(name, help=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        job = sub.add_argument_group("job")
        job.add_argument("--out", required=True, help=out)
        job.add_argument("--resume", action="store_true", help=resume)
        job.add_argument("--overwrite", action="store_true", help=overwrite)
        job.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
        job.add_argument("--config", metavar="FILE", help="start from a run's config.json or tune's best_config.json; "
                                                          "the flags given override it")
        own_flags(sub)
        add_config_flags(sub, config_cls)
        sub.set_defaults(run=command, config_cls=config_cls)

    predict = commands.add_parser("predict", help="write submission.csv and probabilities.csv from runs")
    predict.add_argument("--checkpoint", action="append", required=True,
                         help="a run folder, one of its checkpoints, or a CV folder (all its fold*/ runs); repeat "
                              "it to average several models' probabilities")
    predict.add_argument("--weights-per-checkpoint", type=_comma_list(float, "numbers", "0.7,0.3"), metavar="W1,W2,...",
                         help="a weight per --checkpoint, in order (default: equal); a CV folder's folds share its "
                              "weight")
    test = predict.add_mutually_exclusive_group(required=True)
    test.add_argument("--data-dir", help="TFRecords folder with a test/ split")
    test.add_argument("--test-source", help="test images: a folder of images, or a CSV of ids (the run's id column)")
    predict.add_argument("--test-image-dir", help="with a CSV --test-source: the images' folder (default: the CSV's "
                                                  "folder)")
    predict.add_argument("--out", required=True, help="output folder for submission.csv and probabilities.csv")
    predict.add_argument("--batch-size", type=int, help="global batch (default 16 per device, at least 64); checked "
                                                       "as train's")
    predict.add_argument("--accept-changed-checkpoint", action="store_true",
                         help="predict with a checkpoint whose sha256 is not its manifest's (changed after its run "
                              "wrote it), knowingly; refused otherwise")
    predict.add_argument("--tta", action=argparse.BooleanOptionalAction, help="flip TTA (default: the run's)")
    predict.add_argument("--mode", choices=("jit", "pmap"), default="jit")
    predict.add_argument("--threshold", type=float, help="multi-label runs: this threshold for every class (default: "
                                                         "each run's own, OUT/thresholds.json)")
    predict.add_argument("--min-labels", type=int_in(0), help="multi-label runs: at least this many classes per row, "
                                                              "the most probable (default: the run's)")
    predict.add_argument("--no-progress", dest="progress", action="store_false")
    predict.set_defaults(run=predict_command)

    plan = commands.add_parser("plan", help="compile the run's steps for a TPU or this device: memory, batch, FLOPs",
                               formatter_class=argparse.ArgumentDefaultsHelpFormatter)  # kaggle_utils.run.target_plan
    plan.add_argument("--target", choices=(*target_plan.TARGETS, "local"), default="tpu-v5e-8")
    plan.add_argument("--train-images", type=int, help="without data: training images (default: the flower "
                                                       f"competition's {target_plan.FLOWER_TRAIN_IMAGES:,})")
    plan.add_argument("--out", help="folder for plan.json")
    add_config_flags(plan, config_cls)
    plan.set_defaults(config_cls=config_cls, run=lambda args: target_plan.plan_command(
        _config(args), args.target, out=args.out, train_images=args.train_images))

    redraw = commands.add_parser("report", help="draw curves.png and per_class.csv again for a run or CV folder")
    redraw.add_argument("out", help="a run folder, or a CV folder of fold0/, fold1/, ... run folders")
    redraw.set_defaults(run=lambda args: print("\n".join(report.report_command(args.out))))
    return parser


def _config(args) -> TrainConfig:
    """The flags given, over ``--config FILE`` where one is given, else over the defaults."""
    base = config_from_file(args.config, args.config_cls) if getattr(args, "config", None) else None
    return config_from_args(args, args.config_cls, base=base)


def train_command(args) -> None:
    """Runs ``train`` (:func:`kaggle_utils.run.train`); prints the end-of-run block and what to run next."""
    started = time.perf_counter()
    result = run.train(_config(args), args.out, resume=args.resume, overwrite=args.overwrite, progress=args.progress)
    if jax.process_index() == 0:
        steps = report.next_lines(result.out, data_dir=result.config.data.data_dir,
                                  submission=result.submission is not None)
        print("\n".join(report.summary_lines(result.out, wall_s=time.perf_counter() - started, next_steps=steps)))
        _submit_on_kaggle(result.submission)


def _submit_on_kaggle(submission: Path | None) -> None:
    """On Kaggle, the run's submission also where Kaggle reads one (``/kaggle/working/submission.csv``), said."""
    copied = runtime.kaggle_submission(submission) if submission is not None else None
    if copied is not None:
        print(f"submission: {copied}" + ("" if copied == Path(submission) else f" (a copy of {submission})")
              + ": where Kaggle's Submit and a code competition read it")


def _cv_flags(parser) -> None:
    job = parser.add_argument_group("cross-validation")
    job.add_argument("--folds", type=int, required=True, help="K: folds over the train + val records (stratified; "
                     "multi-label: iterative stratification)")
    job.add_argument("--only-folds", type=_comma_list(int, "fold numbers", "0,2"), metavar="0,2",
                     help="train only these folds now")
    job.add_argument("--fold-group", metavar="COLUMN", help="a column whose groups stay in one fold (a patient, a "
                     "video), read from a CSV --source or --fold-group-file; folds then balance the labels as the "
                     "groups allow")
    job.add_argument("--fold-group-file", metavar="CSV", help="with --fold-group: the CSV holding the run's id column "
                     "and COLUMN (needed with --data-dir, class folders or tfds; default: a CSV --source)")


def cv_command(args) -> None:
    """Runs ``cv`` (:func:`kaggle_utils.run.cross_validate`); prints each fold's best, the OOF score, the files."""
    started = time.perf_counter()
    result = run.cross_validate(_config(args), args.out, folds=args.folds, only_folds=args.only_folds,
                                fold_group=args.fold_group, fold_group_file=args.fold_group_file, resume=args.resume,
                                overwrite=args.overwrite, progress=args.progress)
    if jax.process_index() == 0:
        print("\n".join(_cv_lines(result, time.perf_counter() - started)))
        if result.scores is not None and (result.out / runtime.SUBMISSION).is_file():  # the fold ensemble's
            _submit_on_kaggle(result.out / runtime.SUBMISSION)


def _cv_lines(result, wall_s: float) -> list[str]:
    out = result.out
    if result.scores is None:
        left = ",".join(map(str, result.remaining))
        return [f"cv: fold(s) {left} not finished; run the same command with --resume (or --only-folds {left}) "
                f"to train them, then {out}/oof.csv and cv.json are written"]
    scores = result.scores
    names = [name for name in scores["fold_mean_std"] if name != "loss"]  # the task's scores: acc, f1, ...

    def shown(values: dict) -> str:
        return ", ".join(f"{name} {values[name]:.4f}" for name in names)

    lines = [f"cv: {len(scores['folds'])} folds in {out} ({wall_s:.0f} s this call)"]
    lines += [f"  fold {fold['fold']}: held-out {shown(fold)} ({fold['examples']} records)" for fold in scores["folds"]]
    spread = scores["fold_mean_std"]
    lines.append("  folds: " + ", ".join(f"{n} {spread[n]['mean']:.4f} +- {spread[n]['std']:.4f}" for n in names))
    lines.append(f"  out-of-fold: {shown(scores['oof'])} over {scores['oof']['examples']} records")
    files = [str(out / name) for name in (run.cv.FOLDS_FILE, *run.cv.CV_FILES) if (out / name).is_file()]
    lines.append(f"  files: {', '.join(files)}")
    return lines


def _tune_flags(parser) -> None:
    job = parser.add_argument_group("tune")
    job.add_argument("--trials", type=int_in(1), required=True, help="trials the study ends with (--resume counts "
                                                                    "those finished before)")
    job.add_argument("--search", required=True, metavar="SPACE", help="the flags searched: NAME=LOW:HIGH[:STEP] "
                     "(uniform), NAME=log:LOW:HIGH, NAME=A|B|C, comma-separated, e.g. 'lr=log:1e-4:3e-2,"
                     "label_smoothing=0:0.2,augment=none|randaugment-device'")
    job.add_argument("--pruner", choices=PRUNERS, default="median", help="stops weak trials at "
                     "their evaluations: median (below the median of earlier trials at that step, after 2 trials) "
                     "| halving (successive halving) | none")
    job.add_argument("--folds", type=int_in(2), help="score each trial by K-fold cross-validation (the folds' mean)")


def tune_command(args) -> None:
    """Runs ``tune`` (:func:`kaggle_utils.run.tune`); prints the trials, the best one, what to run next."""
    result = run.tune(_config(args), args.search, args.out, trials=args.trials, folds=args.folds,
                      pruner=args.pruner, resume=args.resume, overwrite=args.overwrite, progress=args.progress)
    print("\n".join(report.tune_lines(result.out)))


def predict_command(args) -> None:
    """Runs ``predict`` (:mod:`kaggle_utils.run.predict`); ends with a summary block."""
    started = time.perf_counter()
    if args.test_image_dir is not None and args.test_source is None:
        raise ConfigError("--test-image-dir goes with --test-source (a CSV of ids); --data-dir holds the images")
    outdir.check_writable(args.out)  # before the prediction, not after it
    batch = run.global_batch(TrainConfig(data=DataConfig(batch_size=args.batch_size)).check())  # before the models
    members = run.load_members(args.checkpoint, args.weights_per_checkpoint,
                               accept_changed=args.accept_changed_checkpoint)
    source = None if args.test_source is None else source_from_spec(
        args.test_source, image_dir=args.test_image_dir, labeled=False,
        id_column=members[0].config.data.id_column or "id")
    with run.open_test_split(data_dir=args.data_dir, source=source) as records:
        ids, probs = run.predict_ensemble(members, records, batch_size=batch, tta=args.tta, mode=args.mode)
    config, thresholds = members[0].config, None
    if config.task.task == "multilabel":
        if args.threshold is not None and not 0 < args.threshold < 1:
            raise ConfigError(f"--threshold {args.threshold:g}: must be in (0, 1)")
        config = config.replace(**{k: v for k, v in (("threshold", args.threshold), ("min_labels", args.min_labels))
                                   if v is not None})
        if args.threshold is None:
            thresholds, where = run.ensemble_thresholds(args.checkpoint, members, args.weights_per_checkpoint)
            print(f"thresholds: {where}")
    submission, _ = run.write_predictions(args.out, ids, probs, config, thresholds=thresholds)
    run.write_blend_record(args.out, members)
    if jax.process_index() == 0:
        test = f"{args.data_dir}/test" if args.data_dir is not None else args.test_source
        test_flag = f"--data-dir {args.data_dir}" if args.data_dir is not None else f"--test-source {test}"
        checkpoints = " ".join(f"--checkpoint {c}" for c in args.checkpoint)
        blend = [  # submit; or blend more models: this command again with another --checkpoint and a weight each
            f"next: submit {submission}, or blend another model into it (probabilities.csv: one column per class):",
            f"  python -m kaggle_utils predict {checkpoints} --checkpoint OTHER_RUN --weights-per-checkpoint "
            f"{','.join(['1'] * (len(args.checkpoint) + 1))} {test_flag} --out {args.out}-blend"]
        print("\n".join(report.prediction_lines(args.out, members, tta=args.tta, rows=len(ids), test=test,
                                                wall_s=time.perf_counter() - started, next_steps=blend)))


def _what_is_kept(args, fix: str | None = None) -> str:
    """What a stopped command leaves usable, and the command that goes on from there."""
    then = f"{fix}, then " if fix else ""
    kept = {"cv": "finished folds are kept (fold*/oof.csv) and the unfinished one resumes from its last.msgpack",
            "tune": f"{args.out}/study.db keeps every finished trial and the unfinished one resumes from its checkpoint"}
    if args.command in kept:
        return f"{kept[args.command]}: {then}the same command with --resume goes on"
    if args.command != "train":
        return f"no half-written file is left (writes are atomic): {then}run {args.command} again"
    try:  # the step last.msgpack holds, per its manifest
        step = json.loads((Path(args.out) / "last.json").read_text()).get("step")
    except (OSError, ValueError, AttributeError):
        step = None
    if not isinstance(step, int) or not (Path(args.out) / "last.msgpack").is_file():
        return f"the run stopped before its first checkpoint: {then}run the same command again"
    return f"{args.out}/last.msgpack (step {step}) is intact: {then}the same command with --resume continues from it"


_OS_FIXES = {errno.ENOSPC: "free space", errno.EDQUOT: "free space", errno.EACCES: "make it writable",
             errno.EPERM: "make it writable", errno.EROFS: "choose a writable place"}


# the commands that run the config: (name, command, its own flags, help, --out, --resume and --overwrite's help)
_RUN_COMMANDS = (
    ("train", train_command, lambda parser: None, "train, evaluate, keep the best checkpoint, predict the test split",
     "output folder (one run per folder)", "continue the run in --out from last.msgpack", "replace the run in --out"),
    ("cv", cv_command, _cv_flags, "K-fold cross-validation: a run per fold, out-of-fold score, fold ensemble",
     "CV folder: folds.csv, fold{k}/ runs, oof.csv, cv.json, submission",
     "skip finished folds, continue the unfinished one", "start the whole CV in --out again"),
    ("tune", tune_command, _tune_flags, "search train flags with Optuna: a run per trial, pruning, best config",
     "study folder: study.db, trial-K/ runs, tune.json, best_config.json",
     "continue the study in --out (finished trials are kept)", "start the study in --out again"))


def main(argv=None) -> int:
    """The command, with every way it can stop turned into one line and an exit code (no traceback)."""
    target_plan.quiet_libtpu()  # before any backend starts: a CPU machine with libtpu installed prints no TPU search
    parser = build_parser()
    args = parser.parse_args(argv)
    prefix = f"{parser.prog} {args.command}"
    try:
        args.run(args)
    except DataError as err:
        hint = ("(--skip-errors skips unreadable records, counts them and names them in the log)\n"
                if err.skippable and args.command == "train" else "")
        parser.exit(2, f"{prefix}: error: {err}\n{hint}")
    except (ConfigError, checkpoint.CheckpointError, WriterError, MetricError) as err:
        parser.exit(2, f"{prefix}: error: {err}\n")
    except TrainingDiverged as err:
        parser.exit(3, f"{prefix}: {err}\n")
    except OSError as err:  # a full disk, a folder made read-only, a vanished mount: not a bug of the kit
        where, code = f"{err.filename}: " if err.filename else "", errno.errorcode.get(err.errno)
        parser.exit(2, f"{prefix}: error: {where}{err.strerror or err}{f' [{code}]' if code else ''}; "
                       f"{_what_is_kept(args, _OS_FIXES.get(err.errno))}\n")
    except KeyboardInterrupt:
        parser.exit(130, f"{prefix}: interrupted; {_what_is_kept(args)}\n")
    return 0
