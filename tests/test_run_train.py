"""``run.train``: the one function behind the job and notebook 04; a user's task; refusals that touch nothing."""
import json

import numpy as np
import pytest

from kaggle_utils import checkpoint, job, run
from kaggle_utils.config import ConfigError, TrainConfig
from kaggle_utils.efficientnet import create_model
from kaggle_utils.train import SoftmaxClassification, init_variables

from job_helpers import TEST_MODEL


def tiny_config(sample, **changes):
    return TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, batch_size=64, steps=4, eval_every=2,
                                 **changes)


def error_rate(sums):
    return 1.0 - int(sums["correct"]) / int(sums["count"])


def test_a_user_task_metric_is_a_column_and_can_be_monitored(sample, tmp_path):
    config = tiny_config(sample, monitor="val_error", monitor_mode="min")
    with pytest.raises(ConfigError, match="--monitor 'val_error' is not a metric of --task softmax"):
        run.train(config, tmp_path / "refused")  # the config's own task has no such metric
    assert not (tmp_path / "refused").exists()

    task = SoftmaxClassification(label_smoothing=0.1).with_metric("error", error_rate)
    result = run.train(config, tmp_path / "run", task=task, progress=False)
    errors = [row["val_error"] for row in result.history]
    assert len(errors) == 2 and all(0 <= e <= 1 for e in errors)
    np.testing.assert_allclose(errors, [1 - row["val_acc"] for row in result.history], atol=1e-6)
    assert result.best["val_error"] == min(errors)
    report = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert report["monitor"] == "val_error" and report["best"]["step"] == result.best["step"]
    assert result.submission == tmp_path / "run" / "submission.csv"
    assert len(result.test_ids) == len(sample.test_labels)


@pytest.fixture(scope="module")
def finished_run(sample, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    run.train(tiny_config(sample), out, progress=False)
    return out


def snapshot(out):
    return {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def ported_weights(path, model_name):
    checkpoint.save(path, init_variables(create_model(model_name), 32, seed=1), manifest={"model": model_name})
    return path


@pytest.mark.parametrize("case", ["freeze pattern that matches nothing", "weights of another variant"])
def test_a_refused_overwrite_leaves_the_previous_run_whole(finished_run, sample, tmp_path, capsys, case):
    before = snapshot(finished_run)
    assert {"best.msgpack", "last.msgpack", "config.json", "submission.csv"} <= {p.name for p in before}
    if case == "weights of another variant":
        flags = ["--weights", str(ported_weights(tmp_path / "w.msgpack", "tf_efficientnetv2_b0"))]
        message = "holds weights of 'tf_efficientnetv2_b0'"
    else:
        flags = ["--weights", str(ported_weights(tmp_path / "w.msgpack", TEST_MODEL)), "--freeze", "no_such_layer"]
        message = "--freeze"
    with pytest.raises(SystemExit) as exit_info:
        job.main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--batch-size", "64", "--steps", "4",
                  "--eval-every", "2", *flags, "--out", str(finished_run), "--overwrite", "--no-progress"])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert snapshot(finished_run) == before
