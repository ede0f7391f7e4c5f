"""bench/job_speed.py's cheap parts: flags, the job config of every route, the verdict.

The measurement itself compiles a model per route and is run by hand (bench/README.md).
"""
import importlib.util
from pathlib import Path

import pytest

from kaggle_utils import run

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "job_speed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_job_speed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_route_by_default_and_a_config_the_job_accepts(bench):
    args = bench.parse_args([])
    assert args.routes == ["none", "randaugment", "imgaug", "randaugment-device"]
    assert (args.size, args.batch) == (64, 16)
    for route in args.routes:
        config = bench.job_config(args, route)
        run.check_config(config)  # the job's own checks: values, model name, monitor
        assert config.data.augment == route
        assert config.loop.log_every == args.steps  # a log window is a timed window
        assert config.loop.steps == config.loop.steps_per_epoch == args.steps * (args.windows + 1)
        assert not config.loop.tensorboard and config.data.deterministic  # as the job runs by default
    assert not bench.job_config(bench.parse_args(["--nondeterministic"]), "imgaug").data.deterministic


def test_flags_given_are_kept_and_bad_ones_refused(bench, capsys):
    args = bench.parse_args(["--routes", "imgaug", "none", "imgaug", "--size", "128", "--batch", "64"])
    assert args.routes == ["imgaug", "none"] and (args.size, args.batch) == (128, 64)
    assert bench.parse_args(["--data-dir", "somewhere"]).size is None  # the stored size
    for flags, named in ((["--steps", "0"], "--steps 0"), (["--size", "4"], "--size 4"),
                         (["--threshold", "1.5"], "--threshold 1.5"), (["--routes", "mixup"], "invalid choice")):
        with pytest.raises(SystemExit) as stop:
            bench.parse_args(flags)
        assert stop.value.code == 2
        assert named in capsys.readouterr().err


def test_verdict_reads_the_ratio_against_the_threshold(bench):
    assert bench.verdict(0.5, 0.9) == "input-bound"
    assert bench.verdict(0.95, 0.9) == "step-bound"
    assert bench.verdict(0.9, 0.9) == "step-bound"
