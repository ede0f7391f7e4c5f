"""``--lr auto``: the range test's rule on curves of known shape, one job run end to end, resume, refusals."""
import json
import types

import numpy as np
import pytest

from kaggle_utils import job, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.run import lr_find

from job_helpers import TEST_MODEL

LRS = np.geomspace(lr_find.LR_MIN, lr_find.LR_MAX, 100)


def drop(steepest: int, lowest: int, noise: float = 0.0, seed: int = 0):
    """A loss curve over ``LRS`` of the usual shape: flat, falling fastest at ``LRS[steepest]``, lowest at
    ``LRS[lowest]``, then exploding."""
    x = np.log10(LRS)
    loss = 2.3 - 1.5 / (1 + np.exp(-(x - x[steepest]) / 0.3)) + 3.0 * np.maximum(0, x - x[lowest]) ** 2
    return loss + noise * np.random.default_rng(seed).standard_normal(len(loss))


@pytest.mark.parametrize("steepest, lowest", [(30, 50), (55, 75), (70, 85)])
def test_the_rule_picks_the_rate_of_the_steepest_fall(steepest, lowest):
    picked, at_min = lr_find.pick_lr(LRS, drop(steepest, lowest))
    assert picked == pytest.approx(LRS[steepest]) and LRS[lowest - 3] <= at_min <= LRS[lowest]


def test_the_rule_reads_through_noise_and_an_exploded_step():
    loss = drop(55, 75, noise=0.03, seed=3)
    loss[-1] = np.nan  # the step that exploded
    picked, _ = lr_find.pick_lr(LRS, loss)
    assert LRS[52] <= picked <= LRS[58]  # within three points (a quarter decade) of the steepest fall


def test_the_smoothing_is_centred():
    """A trailing mean would move every feature to a larger rate (by half its window); the centred one keeps it."""
    valley = (np.log10(LRS) + 2) ** 2
    smoothed = lr_find.smooth(valley)
    assert len(smoothed) == len(LRS) and int(np.argmin(smoothed)) == int(np.argmin(valley))
    assert smoothed[0] == pytest.approx(valley[:3].mean())  # the ends: the neighbours there are


def test_a_curve_that_never_falls_picks_nothing():
    rising = 2.0 + np.linspace(0, 1, 40)
    assert lr_find.pick_lr(LRS[:40], rising) == (None, None)
    flat = np.full(40, 2.3) + 0.001 * np.sin(np.arange(40))
    assert lr_find.pick_lr(LRS[:40], flat) == (None, None)


def test_a_curve_that_never_falls_keeps_the_default_rate_and_says_so(tmp_path):
    plan = types.SimpleNamespace(global_batch=64)
    rising = list(2.0 + np.linspace(0, 1, 40))
    scratch = lr_find._finding(TrainConfig(), plan, list(LRS[:40]), rising, "reached 10")
    tuned = lr_find._finding(TrainConfig().replace(weights="w.msgpack"), plan, list(LRS[:40]), rising, "reached 10")
    assert scratch.lr == tuned.lr == 1e-2 and not scratch.found
    assert "the loss never fell by 2% over 40 steps" in scratch.describe() and "<- picked" not in scratch.text_curve()
    assert [p.name for p in scratch.write(tmp_path)] == ["lr_find.csv", "lr_find.png"]
    assert scratch.note()["found"] is False and scratch.note()["lr"] == 1e-2


def test_the_test_stops_when_the_loss_explodes():
    calm = [2.3, 2.2, 2.0, 1.5, 1.2, 1.1, 1.3, 1.6]
    assert not lr_find.exploded(calm)
    assert lr_find.exploded(calm + [9.0, 12.0, 15.0, 20.0])  # trailing mean 11.6 > 4 x 1.42
    assert lr_find.exploded(calm + [float("nan")])


# --------------------------------------------------------------------------- a run with --lr auto

FIND_STEPS = 12
ARGS = ["train", "--model", TEST_MODEL, "--batch-size", "64", "--steps", "4", "--eval-every", "2", "--lr", "auto",
        "--lr-find-steps", str(FIND_STEPS), "--no-progress", "--no-tensorboard"]


@pytest.fixture(scope="module")
def auto_run(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("auto") / "run"
    assert job.main([*ARGS, "--data-dir", sample.root, "--out", str(out)]) == 0
    return out


def read_curve(out):
    rows = (out / "lr_find.csv").read_text().splitlines()
    assert rows[0] == "step,lr,peak_lr,loss,smoothed_loss"
    return np.array([[float(v) for v in row.split(",")] for row in rows[1:]])


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_run_with_lr_auto_writes_its_curve_and_the_found_rate(auto_run):
    curve = read_curve(auto_run)
    assert 5 <= len(curve) <= FIND_STEPS
    rates = np.geomspace(lr_find.LR_MIN, lr_find.LR_MAX, FIND_STEPS)  # geometric: as many per decade everywhere
    np.testing.assert_allclose(curve[:, 1], rates[:len(curve)], rtol=1e-5)
    np.testing.assert_allclose(curve[:, 2], curve[:, 1] * 64 / 256, rtol=1e-5)
    assert (auto_run / "lr_find.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    record = json.loads((auto_run / "config.json").read_text())
    lr = record["config"]["optim"]["lr"]
    assert record["given"]["lr"] == "auto" and record["lr_find"]["found"] and record["lr_find"]["lr"] == lr
    picked, _ = lr_find.pick_lr(curve[:, 1], curve[:, 3])  # the pick follows from the curve written
    assert lr == pytest.approx(picked, rel=5e-3) and lr_find.LR_MIN < lr < lr_find.LR_MAX
    assert record["plan"]["peak_lr"] == pytest.approx(lr * 64 / 256)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_the_run_after_the_test_starts_from_the_normal_initial_state(auto_run, sample, tmp_path):
    """The range test's training is thrown away: the same run with the found rate given by hand is identical."""
    lr = json.loads((auto_run / "config.json").read_text())["config"]["optim"]["lr"]
    config = TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, batch_size=64, steps=4, eval_every=2,
                                   lr=lr, tensorboard=False)
    fixed = run.train(config, tmp_path / "fixed", progress=False)
    auto = json.loads((auto_run / "metrics.json").read_text())["history"]
    assert [row["train_loss"] for row in fixed.history] == [row["train_loss"] for row in auto]
    assert [row["val_loss"] for row in fixed.history] == [row["val_loss"] for row in auto]


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_find_lr_from_python_gives_the_runs_finding(auto_run, sample, tmp_path):
    config = TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, batch_size=64, steps=4)
    finding = run.find_lr(config, steps=FIND_STEPS, out=tmp_path, progress=False)
    assert finding.lr == json.loads((auto_run / "config.json").read_text())["config"]["optim"]["lr"]
    np.testing.assert_allclose(read_curve(tmp_path)[:, 3], finding.losses, rtol=1e-5)
    assert "<- picked" in finding.text_curve() and f"--lr {finding.lr:.3g}" in finding.describe()


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_resume_reuses_the_found_rate_without_testing_again(auto_run, sample, monkeypatch, capsys):
    def no_test(*args, **kwargs):
        raise AssertionError("--resume ran the range test again")

    monkeypatch.setattr(lr_find, "range_test", no_test)
    before = (auto_run / "config.json").read_text()
    assert job.main([*ARGS, "--data-dir", sample.root, "--out", str(auto_run), "--resume"]) == 0
    after = json.loads((auto_run / "config.json").read_text())
    assert after["config"] == json.loads(before)["config"] and after["lr_find"] == json.loads(before)["lr_find"]
    assert "LR range test" not in capsys.readouterr().out


# --------------------------------------------------------------------------- refusals


def run_main(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        job.main(argv)
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("value, said", [("foo", "foo is not a learning rate"),
                                         ("-1", "-1 is not a learning rate: it must be a finite number > 0"),
                                         ("0", "0 is not a learning rate"), ("nan", "nan is not a learning rate")])
def test_a_bad_lr_is_a_usage_error(value, said, tmp_path, capsys):
    code, err = run_main(["train", "--lr", value, "--out", str(tmp_path / "out")], capsys)
    assert code == 2 and f"argument --lr: {said}" in err and "or auto" in err
    assert not (tmp_path / "out").exists()


def test_a_bad_lr_from_python_is_refused_before_any_write(sample, tmp_path):
    with pytest.raises(ConfigError, match=r"--lr 'fast': must be a finite number > 0 \(per 256 images\) or 'auto'"):
        run.train(TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, lr="fast"), tmp_path / "out")
    with pytest.raises(ConfigError, match="--lr-find-steps 3: must be at least 10"):
        run.train(TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, lr="auto", lr_find_steps=3),
                  tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_overwrite_removes_an_earlier_range_test_and_a_folder_with_one_is_a_run(tmp_path):
    """A new run into the folder must not show the previous run's curve as its own."""
    from kaggle_utils import outdir

    for name in ("lr_find.csv", "lr_find.png"):
        (tmp_path / name).write_text("earlier run")
    with pytest.raises(outdir.OutDirError, match="holds lr_find.csv, lr_find.png but no config.json"):
        outdir.prepare(tmp_path, TrainConfig(), resume=False, overwrite=False)
    outdir.prepare(tmp_path, TrainConfig(), resume=False, overwrite=True)
    assert not list(tmp_path.iterdir())
