"""Tracking: checkpoints written off the training thread (a kill mid-write resumes whole), TensorBoard's HParams,
the W&B writer offline (its run read back), the model's parameters and FLOPs in every run."""
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from kaggle_utils import checkpoint, job, run
from kaggle_utils.config import LoopConfig, TrainConfig
from kaggle_utils.efficientnet import create_model
from kaggle_utils.train import TensorBoardWriter, fit, init_variables

from job_helpers import TEST_MODEL, cpu_process_env
from test_train_loop import assert_trees_equal, comparable, make_run, train_batches, val_batches

TESTS = Path(__file__).resolve().parent
SETTINGS = LoopConfig(steps_per_epoch=8, epochs=2, checkpoint_every=4, log_every=4)  # saves at 4 8 12 16


# --------------------------------------------------------------------------- background writes


def test_a_second_write_waits_for_the_first_and_an_error_comes_back_at_the_next_wait():
    writes, done = checkpoint.BackgroundWrites(), []
    started = time.perf_counter()
    writes.submit(lambda: (time.sleep(0.3), done.append("first")))
    writes.submit(lambda: done.append("second"))  # returns once the first is written
    assert time.perf_counter() - started >= 0.3 and done[0] == "first"
    writes.wait()
    assert done == ["first", "second"]

    def full_disk():
        raise OSError(28, "No space left on device", "last.msgpack")

    writes.submit(full_disk)
    with pytest.raises(OSError, match="No space left"):
        writes.wait()
    writes.wait()  # reported once


WORKER = textwrap.dedent("""
    import os, sys, tempfile, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[2])
    from kaggle_utils import checkpoint
    from kaggle_utils.train import fit
    from test_tracking import SETTINGS, make_run, train_batches, val_batches

    out, real = Path(sys.argv[1]), checkpoint.atomic_write_bytes

    def stalled(path, data):  # the second last.msgpack: half written into its temporary file, then the kill
        if Path(path).name == "last.msgpack" and (out / "last.msgpack").exists():
            fd, _ = tempfile.mkstemp(prefix=f".last.msgpack.{os.getpid()}.{checkpoint._HOST_TAG}.", suffix=".tmp",
                                     dir=out)
            os.write(fd, data[: len(data) // 2])
            print("writing", flush=True)
            time.sleep(600)
        return real(path, data)

    checkpoint.atomic_write_bytes = stalled
    steps, state, schedule = make_run(epochs=2)
    fit(steps, state, train_batches, SETTINGS, val_batches=val_batches, out_dir=out, lr_schedule=schedule,
        progress=False)
""")


def test_killed_during_a_background_write_resumes_from_a_complete_checkpoint(tmp_path):
    steps, state, schedule = make_run(epochs=2)
    kwargs = dict(val_batches=val_batches, lr_schedule=schedule, progress=False)
    full = fit(steps, state, train_batches, SETTINGS, out_dir=tmp_path / "full", **kwargs)
    assert json.loads((tmp_path / "full" / "metrics.json").read_text())["checkpoint_s"] >= 0

    out = tmp_path / "killed"
    out.mkdir()
    env = cpu_process_env(8)
    proc = subprocess.Popen([sys.executable, "-c", WORKER, str(out), str(TESTS)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:
            if line.strip() == "writing":
                break
        else:
            pytest.fail(f"the worker ended before its second save: {proc.wait()}")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert json.loads((out / "last.json").read_text())["step"] == 4  # the save before the one killed mid-write
    checkpoint.check_digest(out / "last.msgpack")  # whole: the file its manifest describes
    assert len(checkpoint.remove_stale_temp_files(out)) == 1  # the half-written one, left by the dead writer
    resumed = fit(steps, state, train_batches, SETTINGS, out_dir=out, resume=True, **kwargs)
    assert comparable(resumed.history) == comparable(full.history)
    assert_trees_equal(resumed.state, full.state)


def test_the_training_thread_does_not_wait_for_a_slow_disk(tmp_path, monkeypatch):
    """Every write takes 1 s; the run (4 saves) spends far less than 4 s of its thread on them."""
    real = checkpoint.atomic_write_bytes

    def slow(path, data):
        time.sleep(1.0 if Path(path).suffix == ".msgpack" else 0)
        real(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", slow)
    steps, state, schedule = make_run(epochs=2)
    started = time.perf_counter()
    fit(steps, state, train_batches, LoopConfig(steps_per_epoch=8, epochs=2, checkpoint_every=8), out_dir=tmp_path,
        val_batches=val_batches, lr_schedule=schedule, progress=False)
    report = json.loads((tmp_path / "metrics.json").read_text())
    assert report["checkpoint_s"] >= 0.9  # the run waits for its last write before it reports
    assert time.perf_counter() - started > 2  # 2 saves of last + best reached the disk
    assert int(checkpoint.load(tmp_path / "last.msgpack")["state"]["step"]) == 16


# --------------------------------------------------------------------------- TensorBoard HParams


def hparams_of(content: bytes) -> dict:
    """TensorBoard's HParamsPluginData (tensorboard/plugins/hparams/plugin_data.proto) decoded with protobuf's
    own runtime from its field numbers: 3 session_start_info, in it 1 map<string, google.protobuf.Value>."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, struct_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(struct_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(name="hp.proto", package="hp", dependency=["google/protobuf/struct.proto"])
    entry = descriptor_pb2.DescriptorProto(name="HparamsEntry", options=descriptor_pb2.MessageOptions(map_entry=True))
    entry.field.add(name="key", number=1, type=9, label=1)
    entry.field.add(name="value", number=2, type=11, label=1, type_name=".google.protobuf.Value")
    start = proto.message_type.add(name="SessionStartInfo")
    start.nested_type.append(entry)
    start.field.add(name="hparams", number=1, type=11, label=3, type_name=".hp.SessionStartInfo.HparamsEntry")
    data = proto.message_type.add(name="HParamsPluginData")
    data.field.add(name="session_start_info", number=3, type=11, label=1, type_name=".hp.SessionStartInfo")
    pool.Add(proto)
    message = message_factory.GetMessageClass(pool.FindMessageTypeByName("hp.HParamsPluginData"))()
    message.ParseFromString(content)
    values = message.session_start_info.hparams
    return {k: getattr(v, v.WhichOneof("kind")) for k, v in values.items()}


def test_tensorboard_keeps_the_config_as_hparams_and_the_best_metrics_as_scalars(run_fixture, tmp_path):
    from kaggle_utils.data import tensorflow_on_host

    steps, state, schedule = run_fixture
    hparams = {"lr": 0.01, "model": "tiny", "tta": True, "freeze": ("stem", "head"), "patience": None, "epochs": 3}
    writer = TensorBoardWriter(tmp_path, hparams=hparams)
    result = fit(steps, state, train_batches, LoopConfig(steps_per_epoch=4, epochs=2), val_batches=val_batches,
                 lr_schedule=schedule, writers=[writer], progress=False)
    writer.close()
    tags = {}
    for event in tensorflow_on_host().compat.v1.train.summary_iterator(str(writer.path)):
        for value in event.summary.value:
            tags[value.tag] = value
    plugin = tags["_hparams_/session_start_info"].metadata.plugin_data
    assert plugin.plugin_name == "hparams"
    assert hparams_of(plugin.content) == {"lr": 0.01, "model": "tiny", "tta": True, "freeze": "stem,head",
                                          "patience": "None", "epochs": 3.0}
    assert tags["best/val_f1"].simple_value == pytest.approx(max(r["val_f1"] for r in result.history))
    assert {"epoch", "train_epoch/loss", "val/f1"} <= set(tags)


@pytest.fixture(scope="module")
def run_fixture():
    return make_run(epochs=2)


# --------------------------------------------------------------------------- W&B, parameters and FLOPs


def wandb_records(run_folder: Path, timeout_s: float = 120) -> list:
    """The records of an offline W&B run: its ``run-ID.wandb`` file, a LevelDB-style log (7-byte header; 32 KiB
    blocks of chunks: crc32, length, type 1 full / 2 first / 3 middle / 4 last) of ``wandb.proto`` Records.

    ``run.finish()`` returns once wandb-core has answered the exit record, and then only asks it to close the run's
    stream (a message it does not wait on); wandb-core keeps the log's last block in memory until that close. Under
    load the file is read before it is whole (a CI run saw no run record at all), so this reads until the exit
    record, the last one written, is there.
    """
    from wandb.proto import wandb_internal_pb2

    deadline = time.monotonic() + timeout_s
    while True:
        data, records, chunk, pos = next(run_folder.glob("run-*.wandb")).read_bytes(), [], b"", 7
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            _, length, kind = struct.unpack("<IHB", data[pos:pos + 7]) if left >= 7 else (0, 0, 0)
            if kind == 0:  # the block's zero padding
                pos += left
                continue
            if pos + 7 + length > len(data):  # a block being written
                break
            chunk, pos = chunk + data[pos + 7:pos + 7 + length], pos + 7 + length
            if kind in (1, 4):
                records.append(wandb_internal_pb2.Record.FromString(chunk))
                chunk = b""
        if any(r.HasField("exit") for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


@pytest.mark.slow  # trains test_efficientnet (tests/tiers.py)
def test_a_run_with_wandb_offline_is_read_back_with_its_config_history_tables_and_best_checkpoint(
        sample, tmp_path, monkeypatch, capsys):
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key, so W&B must go offline by itself
    monkeypatch.setenv("WANDB_CONSOLE", "off")
    weights = tmp_path / "ported.msgpack"  # --freeze goes with --weights
    checkpoint.save(weights, init_variables(create_model(TEST_MODEL), 32, seed=1), manifest={"model": TEST_MODEL})
    config = TrainConfig().replace(data_dir=sample.root, model=TEST_MODEL, batch_size=64, steps=4, eval_every=2,
                                   wandb="kaggle-utils-test", wandb_artifact=True, weights=str(weights),
                                   freeze=("stem",))
    result = run.train(config, tmp_path / "run", progress=False)
    printed = capsys.readouterr().out
    assert "W&B runs offline (no API key" in printed
    folder = Path(printed.split("the run is in ")[1].split(";")[0])
    assert folder.parent == tmp_path / "run" / "wandb"

    records = wandb_records(folder)
    kinds = [r.WhichOneof("record_type") for r in records]
    config_items = {i.key: json.loads(i.value_json) for r in records if r.HasField("run") for i in r.run.config.update}
    assert config_items["model"] == TEST_MODEL and config_items["steps"] == 4 and config_items["freeze"] == ["stem"]
    history = [{i.key or "/".join(i.nested_key): i.value_json for i in r.history.item} for r in records
               if r.HasField("history")]
    val = [json.loads(h["val/f1"]) for h in history if "val/f1" in h]
    assert val == pytest.approx([row["val_f1"] for row in result.history])
    assert any("best/val_f1" in h for h in history) and any("train/loss" in h for h in history)
    assert {"curves", "per_class"} <= {k.split("/")[0] for h in history for k in h}
    artifacts = {r.artifact.name: [m.path for m in r.artifact.manifest.contents] for r in records
                 if r.HasField("artifact")}
    assert sorted(artifacts["run-best"]) == ["best.json", "best.msgpack"]
    assert "exit" in kinds  # finished, not left open

    # the same run's size: every parameter counted once, the --freeze'd stem apart, FLOPs from XLA at 16 px
    size = result.plan.model_size
    params = checkpoint.load(tmp_path / "run" / "best.msgpack")["params"]
    leaves = {"/".join(str(getattr(k, "key", k)) for k in path): np.size(v)
              for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}
    assert size["params_trainable"] + size["params_frozen"] == sum(leaves.values())
    assert size["params_frozen"] == sum(n for k, n in leaves.items() if "stem" in k) > 0  # --freeze: a regex
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["model"] == size
    model = run.build_model(result.config)
    flops = [run.model_size(result.config.replace(image_size=s), model, jax.tree.map(np.asarray, jax.device_get(
        result.fit.state.variables())))["gflops_per_image"] for s in (16, 32)]
    assert flops[0] == size["gflops_per_image"] > 0 and 3.5 < flops[1] / flops[0] < 4.5  # ~ the pixels


def test_wandb_missing_is_one_line_before_the_folder_changes(sample, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(SystemExit) as exit_info:
        job.main(["train", "--data-dir", sample.root, "--model", TEST_MODEL, "--steps", "2", "--wandb",
                  "--out", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--wandb needs the wandb package: pip install wandb")
    assert not (tmp_path / "run").exists()
