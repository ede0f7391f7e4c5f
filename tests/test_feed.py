"""Device feeding: layouts for pmap and jit, ids on the host, divisibility errors, prefetch."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from kaggle_utils import parallel as feed


def host_batch(n=16):
    return {
        "image": np.arange(n * 2 * 2 * 3, dtype=np.uint8).reshape(n, 2, 2, 3),
        "label": np.arange(n, dtype=np.int32),
        "mask": np.arange(n) < n - 3,
        "id": np.array([f"id{i}".encode() for i in range(n)], dtype=object),
    }


def test_pmap_layout_puts_consecutive_slices_on_each_local_device():
    mesh = feed.make_mesh()
    out = feed.shard_batch(host_batch(16), mode="pmap", mesh=mesh)
    assert out["image"].shape == (8, 2, 2, 2, 3) and out["image"].dtype == np.uint8
    assert out["label"].shape == (8, 2)
    for i, shard in enumerate(sorted(out["label"].addressable_shards, key=lambda s: s.index[0].start)):
        assert shard.device == mesh.devices.flat[i]
        np.testing.assert_array_equal(np.asarray(shard.data).ravel(), [2 * i, 2 * i + 1])
    np.testing.assert_array_equal(np.asarray(out["mask"]).ravel(), host_batch(16)["mask"])


def test_jit_layout_is_a_global_array_split_on_the_batch_axis():
    mesh = feed.make_mesh()
    out = feed.shard_batch(host_batch(16), mode="jit", mesh=mesh)
    assert out["image"].shape == (16, 2, 2, 3)
    assert out["label"].sharding.spec == P(feed.AXIS)
    for shard in out["label"].addressable_shards:
        rows = np.arange(16)[shard.index[0]]
        assert len(rows) == 2
        np.testing.assert_array_equal(np.asarray(shard.data), rows)
    np.testing.assert_array_equal(np.asarray(out["image"]), host_batch(16)["image"])


@pytest.mark.parametrize("mode", feed.MODES)
def test_ids_stay_on_the_host(mode):
    out = feed.shard_batch(host_batch(16), mode=mode, mesh=feed.make_mesh())
    assert isinstance(out["id"], np.ndarray) and not isinstance(out["id"], jax.Array)
    assert list(out["id"]) == list(host_batch(16)["id"])


@pytest.mark.parametrize("mode", feed.MODES)
def test_batch_not_divisible_by_local_devices_is_a_clear_error(mode):
    with pytest.raises(ValueError, match=r"12 examples .* 8 local devices.*multiple of 8"):
        feed.shard_batch(host_batch(12), mode=mode, mesh=feed.make_mesh())


def test_fields_of_different_length_are_rejected():
    batch = host_batch(16)
    batch["label"] = batch["label"][:8]
    with pytest.raises(ValueError, match="disagree on the batch size"):
        feed.shard_batch(batch, mode="jit", mesh=feed.make_mesh())


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="mode must be one of"):
        feed.shard_batch(host_batch(16), mode="pjit", mesh=feed.make_mesh())


def test_mesh_of_a_device_subset():
    mesh = feed.make_mesh(jax.devices()[:2])
    out = feed.shard_batch(host_batch(4), mode="jit", mesh=mesh)
    assert {s.device for s in out["label"].addressable_shards} == set(jax.devices()[:2])


def test_local_rows_split_a_global_batch_in_process_order():
    batch = host_batch(16)
    parts = [feed.local_rows(batch, process_index=i, process_count=2) for i in range(2)]
    np.testing.assert_array_equal(parts[0]["label"], np.arange(8))
    np.testing.assert_array_equal(parts[1]["label"], np.arange(8, 16))
    assert list(parts[1]["id"]) == list(batch["id"][8:])
    with pytest.raises(ValueError, match="cannot be split over 3 processes"):
        feed.local_rows(batch, process_index=0, process_count=3)


@pytest.mark.parametrize("mode", feed.MODES)
def test_prefetch_yields_every_batch_in_order_and_reads_only_size_ahead(mode):
    pulled = []

    def source():
        for i in range(5):
            pulled.append(i)
            b = host_batch(8)
            b["label"] = b["label"] + 100 * i
            yield b

    it = feed.prefetch_to_device(source(), size=2, mode=mode, mesh=feed.make_mesh())
    first = next(it)
    assert pulled == [0, 1]  # the current batch and one in flight, no more
    labels = [np.asarray(first["label"]).ravel()] + [np.asarray(b["label"]).ravel() for b in it]
    np.testing.assert_array_equal(np.stack(labels), np.arange(8)[None] + 100 * np.arange(5)[:, None])


def test_prefetch_size_must_be_positive():
    with pytest.raises(ValueError, match="prefetch size"):
        next(feed.prefetch_to_device(iter([host_batch(8)]), size=0, mode="jit", mesh=feed.make_mesh()))
