"""Porter: conversion rules, strict tree checks, verified writes, msgpack round trips."""
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from fs_helpers import read_only_folder
from kaggle_utils import checkpoint
from kaggle_utils.efficientnet import create_model, efficientnet_v2_pretrained, load_weights
from timm_reference import random_timm_model, timm_forward, to_nhwc
from weights_port import (ConversionError, OutputError, VerificationError, convert_timm, flax_name,
                          load_torch_state_dict, port)
from weights_port.__main__ import main as port_main

NAME = "tf_efficientnetv2_b0"


@pytest.fixture(scope="module")
def timm_b0():
    return random_timm_model(NAME)


def test_flax_names_follow_timm_module_paths():
    assert flax_name("blocks.3.11.se.conv_reduce") == ["blocks_3_11", "se", "conv_reduce"]
    assert flax_name("blocks.10.31.conv_pwl") == ["blocks_10_31", "conv_pwl"]  # multi-digit indices
    assert flax_name("conv_stem") == ["conv_stem"]


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_layout_rules(timm_b0):
    v = convert_timm(timm_b0, NAME)
    sd = timm_b0.state_dict()
    np.testing.assert_array_equal(v["params"]["conv_stem"]["kernel"], sd["conv_stem.weight"].numpy().transpose(2, 3, 1, 0))
    dw = v["params"]["blocks_3_0"]["conv_dw"]["kernel"]
    assert dw.shape == (3, 3, 1, sd["blocks.3.0.conv_dw.weight"].shape[0])  # depthwise (k, k, 1, C)
    np.testing.assert_array_equal(v["params"]["classifier"]["kernel"], sd["classifier.weight"].numpy().T)
    np.testing.assert_array_equal(v["batch_stats"]["blocks_0_0"]["bn1"]["var"], sd["blocks.0.0.bn1.running_var"].numpy())
    np.testing.assert_array_equal(v["params"]["bn2"]["scale"], sd["bn2.weight"].numpy())


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_tree_equals_flax_init_tree_exactly(timm_b0):
    v = convert_timm(timm_b0, NAME)
    expected = jax.eval_shape(create_model(NAME).init, jax.random.key(0), jnp.zeros((1, 32, 32, 3)))
    same = jax.tree.map(lambda a, b: a.shape == b.shape and a.dtype == b.dtype, v, expected)
    assert all(jax.tree.leaves(same))


@pytest.mark.parametrize("edit, message", [
    (lambda sd: sd.pop("blocks.2.1.conv_pwl.weight"), "missing"),
    (lambda sd: sd.__setitem__("blocks.9.0.conv_pw.weight", torch.zeros(8, 8, 1, 1)), "unexpected"),
    (lambda sd: sd.__setitem__("bn1.running_mean", torch.zeros(7)), "mis-shaped"),
])
@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_conversion_errors_name_the_keys(timm_b0, edit, message):
    sd = dict(timm_b0.state_dict())
    edit(sd)
    with pytest.raises(ConversionError, match=message):
        convert_timm(sd, NAME)


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_num_classes_comes_from_the_checkpoint():
    tm = random_timm_model(NAME, num_classes=21843 // 100)
    v = convert_timm(tm, NAME)
    assert v["params"]["classifier"]["kernel"].shape[-1] == 218
    with pytest.raises(ConversionError, match="classifier"):
        convert_timm(tm, NAME, num_classes=1000)


@pytest.mark.slow  # builds tf_efficientnetv2_b1 (tests/tiers.py)
def test_other_variant_is_refused(timm_b0):
    with pytest.raises(ConversionError):
        convert_timm(timm_b0, "tf_efficientnetv2_b1")


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_port_writes_verified_msgpack_and_manifest(tmp_path, timm_b0):
    ckpt = tmp_path / "b0.pth"
    torch.save(timm_b0.state_dict(), ckpt)
    out = tmp_path / "b0.msgpack"
    r = port(NAME, out, checkpoint_path=ckpt, verify_size=64)
    manifest = json.loads((tmp_path / "b0.json").read_text())
    assert manifest["model"] == NAME and manifest["num_classes"] == 1000
    assert manifest["max_rel_logit_diff"] == r.max_rel_diff < 1e-4
    assert manifest["pretrained_cfg"]["mean"] == [0.485, 0.456, 0.406]
    import hashlib
    assert manifest["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    # round trip: identical tree and values
    loaded = load_weights(create_model(NAME), out)
    direct = convert_timm(timm_b0, NAME)
    assert jax.tree.structure(loaded) == jax.tree.structure(direct)
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(a, b), loaded, direct)))
    # and the loaded model reproduces timm
    x = np.random.default_rng(0).standard_normal((2, 64, 64, 3), dtype=np.float32)
    ref = timm_forward(timm_b0, x)
    with jax.default_matmul_precision("highest"):
        out_logits = create_model(NAME).apply(loaded, x)
    assert np.max(np.abs(out_logits - ref)) / np.max(np.abs(ref)) < 1e-4


def _without_counters(state_dict) -> dict:
    """As many exported checkpoints are saved: BatchNorm without its ``num_batches_tracked`` counters."""
    return {k: v for k, v in state_dict.items() if not k.endswith(".num_batches_tracked")}


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_a_checkpoint_without_batchnorm_counters_ports_its_weights(tmp_path, timm_b0):
    state = _without_counters(timm_b0.state_dict())
    assert len(state) < len(timm_b0.state_dict())  # the model has counters the file lacks
    ckpt = tmp_path / "exported.pth"
    torch.save(state, ckpt)
    out = tmp_path / "b0.msgpack"
    result = port(NAME, out, checkpoint_path=ckpt, verify_size=32)
    assert result.max_rel_diff < 1e-4
    # the file's weights, not a fresh model's: verification alone would pass on random weights too
    loaded = load_weights(create_model(NAME), out)
    expected = convert_timm(timm_b0, NAME)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, loaded, expected)))


def test_a_checkpoint_missing_a_real_tensor_is_still_refused_naming_it(tmp_path, timm_b0):
    state = _without_counters(timm_b0.state_dict())
    del state["blocks.2.1.conv_pwl.weight"]
    ckpt = tmp_path / "exported.pth"
    torch.save(state, ckpt)
    only_that = r"does not match the expected structure:\n  missing \(1\): blocks\.2\.1\.conv_pwl\.weight$"
    with pytest.raises(ConversionError, match=only_that):
        port(NAME, tmp_path / "w.msgpack", checkpoint_path=ckpt, verify_size=32)
    assert sorted(p.name for p in tmp_path.iterdir()) == [ckpt.name]


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_failed_verification_writes_nothing(tmp_path, timm_b0, monkeypatch):
    import importlib

    port_module = importlib.import_module("weights_port.port")  # the module, not the function it exports

    real = port_module.convert_timm

    def broken(*a, **k):  # a conversion bug: one kernel transposed the wrong way
        v = real(*a, **k)
        k_ = v["params"]["blocks_1_0"]["conv_exp"]["kernel"]
        v["params"]["blocks_1_0"]["conv_exp"]["kernel"] = k_[::-1, ::-1]
        return v

    monkeypatch.setattr(port_module, "convert_timm", broken)
    ckpt = tmp_path / "b0.pth"
    torch.save(timm_b0.state_dict(), ckpt)
    with pytest.raises(VerificationError, match="nothing written"):
        port(NAME, tmp_path / "w.msgpack", checkpoint_path=ckpt, verify_size=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b0.pth"]


def test_checkpoint_loading_never_unpickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    bad = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "evil": Evil()}, bad)
    with pytest.raises(ConversionError, match="tensor-only"):
        load_torch_state_dict(bad)


def test_safetensors_and_wrapped_checkpoints(tmp_path, timm_b0):
    from safetensors.torch import save_file

    sd = {k: v.contiguous() for k, v in timm_b0.state_dict().items()}
    save_file(sd, tmp_path / "w.safetensors")
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, tmp_path / "w.pth")
    a = load_torch_state_dict(tmp_path / "w.safetensors")
    b = load_torch_state_dict(tmp_path / "w.pth")
    assert a.keys() == b.keys() == sd.keys()


@pytest.fixture(scope="module")
def weights_file(tmp_path_factory, timm_b0):
    out = tmp_path_factory.mktemp("w") / "b0.msgpack"
    checkpoint.save(out, convert_timm(timm_b0, NAME), manifest={"model": NAME})
    return out


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_truncated_or_corrupt_file_is_a_clear_error(tmp_path, weights_file):
    data = weights_file.read_bytes()
    for name, payload in [("trunc.msgpack", data[: len(data) // 2]), ("junk.msgpack", b"\x00not msgpack" * 10),
                          ("empty.msgpack", b"")]:
        (tmp_path / name).write_bytes(payload)
        with pytest.raises(checkpoint.CheckpointError, match=name):
            load_weights(create_model(NAME), tmp_path / name)


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_loading_into_another_head_or_variant_fails_clearly(tmp_path, weights_file):
    with pytest.raises(checkpoint.CheckpointError, match=r"classifier.*\(1280, 1000\) vs expected \(1280, 104\)"):
        load_weights(create_model(NAME, num_classes=104), weights_file)
    with pytest.raises(checkpoint.CheckpointError, match="holds weights of 'tf_efficientnetv2_b0'"):
        load_weights(create_model("tf_efficientnetv2_b1"), weights_file)
    orphan = tmp_path / "orphan.msgpack"  # no manifest: the tree check still refuses
    orphan.write_bytes(weights_file.read_bytes())
    with pytest.raises(checkpoint.CheckpointError, match="missing"):
        load_weights(create_model("tf_efficientnetv2_b1"), orphan)


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_pretrained_backbone(weights_file, timm_b0):
    backbone, variables = efficientnet_v2_pretrained("b0", weights_file, input_size=64)
    assert "classifier" not in variables["params"] and set(variables) == {"params", "batch_stats"}
    x = np.random.default_rng(0).standard_normal((2, 64, 64, 3), dtype=np.float32)
    with torch.no_grad():
        ref = to_nhwc(timm_b0.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2))))
    with jax.default_matmul_precision("highest"):
        fmap = backbone.apply(variables, x)
    assert fmap.shape == ref.shape
    assert np.max(np.abs(fmap - ref)) / np.max(np.abs(ref)) < 1e-4


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "w.msgpack"
    checkpoint.save(target, {"a": np.ones(3)})
    before = target.read_bytes()

    def crash(*a, **k):
        raise KeyboardInterrupt  # killed in the middle of the write

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(target, {"a": np.zeros(1000)})
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["w.msgpack"]  # no temp file left behind


@pytest.mark.slow  # builds tf_efficientnetv2_b0 (tests/tiers.py)
def test_cli_random_port(tmp_path, capsys):
    # In this process: the exit status is main()'s return value (a process's exit status is
    # checked by test_another_architectures_checkpoint_is_one_line_naming_model_and_keys).
    out = tmp_path / "b0.msgpack"
    assert port_main([NAME, "--random", "--out", str(out), "--verify-size", "32"]) == 0
    assert "max |logit diff| vs timm" in capsys.readouterr().out
    assert out.is_file() and (tmp_path / "b0.json").is_file()
    assert port_main([NAME, "--checkpoint", str(tmp_path / "nope.pth"), "--out", str(tmp_path / "x.msgpack")]) == 2
    assert "nope.pth does not exist" in capsys.readouterr().err
    assert not (tmp_path / "x.msgpack").exists()


def test_model_package_imports_neither_tensorflow_nor_torch():
    code = ("import sys, kaggle_utils.efficientnet, kaggle_utils.checkpoint; "
            "bad = [m for m in ('tensorflow', 'torch') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow  # starts a job process (tests/tiers.py)
def test_another_architectures_checkpoint_is_one_error_naming_model_and_keys(tmp_path):
    import timm

    other = timm.create_model("efficientnet_b0", pretrained=False).state_dict()
    ckpt = tmp_path / "efficientnet_b0.pth"
    torch.save(other, ckpt)
    out = tmp_path / "w.msgpack"
    done = subprocess.run([sys.executable, "-m", "weights_port", NAME, "--checkpoint", str(ckpt), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr, done.stderr
    key = "blocks.0.0.bn1.bias"  # efficientnet_b0's first block is wider than the V2's
    theirs, ours = tuple(other[key].shape), tuple(timm.create_model(NAME).state_dict()[key].shape)
    assert theirs != ours
    assert done.stderr.startswith(f"error: checkpoint {ckpt} for {NAME} does not match the expected structure")
    assert f"{key}: file {theirs} vs expected {ours}" in done.stderr
    assert "missing" in done.stderr and "unexpected" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [ckpt.name]


def test_a_resnet_checkpoint_names_its_keys(tmp_path):
    import timm

    ckpt = tmp_path / "resnet.pth"
    torch.save(timm.create_model("resnet10t", pretrained=False).state_dict(), ckpt)
    with pytest.raises(ConversionError, match=rf"resnet.pth for {NAME} does not match(?s:.*)unexpected \(\d+\): conv1\."):
        port(NAME, tmp_path / "w.msgpack", checkpoint_path=ckpt)
    assert not (tmp_path / "w.msgpack").exists()


def _port_to(out, capsys) -> str:
    """Runs the CLI in this process; returns its one-line error."""
    assert port_main([NAME, "--random", "--out", str(out), "--verify-size", "32"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: --out {out}: "), err
    return err


def test_unwritable_outputs_are_refused_before_any_work(tmp_path, capsys, monkeypatch):
    import importlib

    port_module = importlib.import_module("weights_port.port")  # the module, not the function it exports
    monkeypatch.setattr(port_module, "timm_model", lambda *a, **k: pytest.fail("the model was loaded"))
    folder = tmp_path / "folder.msgpack"
    folder.mkdir()
    assert "is a folder" in _port_to(folder, capsys)
    assert list(folder.iterdir()) == []

    old = tmp_path / "w.msgpack"
    old.write_bytes(b"earlier weights")
    (tmp_path / "w.json").mkdir()  # the manifest's place is taken
    assert f"{tmp_path / 'w.json'} is a folder" in _port_to(old, capsys)
    assert old.read_bytes() == b"earlier weights"

    with read_only_folder(tmp_path / "ro") as read_only:
        for out in (read_only / "w.msgpack", read_only / "new" / "w.msgpack"):
            err = _port_to(out, capsys)
            assert f"cannot write in {read_only}" in err and ("Read-only" in err or "Permission" in err), err
            assert list(read_only.iterdir()) == []
    with pytest.raises(OutputError, match="is a folder"):
        port(NAME, folder, pretrained=False)
