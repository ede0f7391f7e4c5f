"""What the steps and the input feed share: the mesh, its axis ``"data"``, and host batches -> device arrays.

Two layouts: ``"pmap"``, a leading axis of local devices ``[n_local, B / n_local, ...]`` (the seed
tutorial's ``shard``), or ``"jit"``, one global ``jax.Array`` split over ``"data"`` from each process's own
rows. Ids stay numpy on the host; images stay uint8 until the step normalises them (a quarter of the transfer).
"""
import collections
import itertools
from typing import Iterable, Iterator, Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "data"  # the one mesh / pmap axis name every step function reduces over
MODES = ("pmap", "jit")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    return mode


def make_mesh(devices=None) -> Mesh:
    """A 1-D mesh named ``"data"``, each process's devices in one contiguous block (so the global batch
    is the processes' local batches in process order, which gathered predictions rely on)."""
    devices = jax.devices() if devices is None else list(devices)
    if not devices:
        raise ValueError("make_mesh: no devices given")
    devices = sorted(devices, key=lambda d: (d.process_index, d.id))
    return Mesh(np.array(devices), (AXIS,))


def local_devices(mesh: Mesh) -> list:
    """The mesh's devices that belong to this process, in mesh order."""
    me = jax.process_index()
    return [d for d in mesh.devices.flat if d.process_index == me]


def _batch_size(batch: Mapping[str, np.ndarray]) -> int:
    sizes = {k: len(v) for k, v in batch.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch fields disagree on the batch size: {sizes}")
    return next(iter(sizes.values()))


def shard_batch(batch: Mapping[str, np.ndarray], *, mode: str, mesh: Mesh) -> dict:
    """Places one host batch on the devices; ids (bytes/str fields) stay numpy on the host."""
    check_mode(mode)
    n = len(local_devices(mesh))
    size = _batch_size(batch)
    if n == 0:
        raise ValueError(f"mesh {mesh.devices.tolist()} holds no device of process {jax.process_index()}")
    if size % n:
        raise ValueError(
            f"a batch of {size} examples cannot be split evenly over {n} local devices: make the "
            f"per-process batch size a multiple of {n} (e.g. {max(n, size // n * n)} or {(size // n + 1) * n})")
    out = {}
    for key, value in batch.items():
        value = np.asarray(value)
        if value.dtype.kind in "OSU":  # object / bytes / str: ids
            out[key] = value
        elif mode == "pmap":
            per_device = value.reshape(n, size // n, *value.shape[1:])
            out[key] = jax.device_put(per_device, NamedSharding(Mesh(np.array(local_devices(mesh)), (AXIS,)),
                                                                PartitionSpec(AXIS)))
        else:
            out[key] = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec(AXIS)), value)
    return out


def local_rows(batch: Mapping[str, np.ndarray], *, process_index: int | None = None,
               process_count: int | None = None) -> dict:
    """This process's contiguous slice of a *global* host batch that every process holds: evaluation and
    prediction read the whole split everywhere, so every process runs the same steps (no hang on uneven
    files) and gathered outputs come back in file order."""
    index = jax.process_index() if process_index is None else process_index
    count = jax.process_count() if process_count is None else process_count
    size = _batch_size(batch)
    if size % count:
        raise ValueError(f"a global batch of {size} cannot be split over {count} processes")
    rows = slice(index * size // count, (index + 1) * size // count)
    return {k: np.asarray(v)[rows] for k, v in batch.items()}


def prefetch_to_device(batches: Iterable[Mapping[str, np.ndarray]], size: int = 2, *, mode: str,
                       mesh: Mesh) -> Iterator[dict]:
    """Yields device batches while the next ``size - 1`` are already being transferred (``device_put`` is
    asynchronous, so copy and compute overlap; more than 2 only holds more device memory)."""
    if size < 1:
        raise ValueError(f"prefetch size must be >= 1, got {size}")
    queue: collections.deque = collections.deque()
    iterator = iter(batches)

    def enqueue(k: int) -> None:
        for batch in itertools.islice(iterator, k):
            queue.append(shard_batch(batch, mode=mode, mesh=mesh))

    enqueue(size)
    while queue:
        yield queue.popleft()
        enqueue(1)
