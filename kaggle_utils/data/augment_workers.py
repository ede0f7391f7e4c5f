"""Worker processes that decode a batch's JPEGs and run a numpy augmentation outside the training process.

Python under ``tf.py_function`` holds the GIL, so processes, not threads, scale it (bench/README.md). The workers
are spawned (never forked from a process whose TensorFlow threads hold locks), all when the pool is made, and share
a buffer per call with the pipeline; each call carries its seed, so a batch comes out the same in any worker.
"""

import concurrent.futures
import contextlib
import importlib.util
import multiprocessing
import os
import pickle
import queue
import random
import sys
import threading
import time
import traceback
import weakref
from multiprocessing import shared_memory
from typing import Callable

import numpy as np

from .jpeg import CorruptJpegError, decode_jpeg_into
from .tfhost import host_cores
from .tfrecords import UNDECODABLE

STARTUP_TIMEOUT = 300.0  # seconds for every worker to import the callable's module


class AugmentWorkerError(RuntimeError):
    """The augmentation callable failed (or its worker process died); carries the traceback."""


def default_worker_count() -> int:
    """One worker per core this process may use, up to 16 (they decode as well as augment: the tf.data process
    needs little CPU of its own, bench/README.md)."""
    return min(16, host_cores())


def apply_seeded(fn, images: np.ndarray, seed: int | None) -> np.ndarray:
    """``fn(images)`` with ``random`` and ``np.random`` seeded (None: as they are), refused unless uint8 of the
    input's shape."""
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
    out = np.asarray(fn(images))
    if out.dtype != np.uint8 or out.shape != images.shape:
        raise AugmentWorkerError(f"{fn!r} returned {out.dtype} {out.shape}; an augmentation must return uint8 of "
                                 f"its input's shape {images.shape}")
    return out


def _pickle_for_worker(fn) -> bytes:
    """``fn`` by reference, or by value (cloudpickle) from ``__main__`` (a notebook cell, a script)."""
    module = getattr(fn, "__module__", None) or type(fn).__module__
    if module != "__main__":
        try:
            return pickle.dumps(fn)
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
    try:
        import cloudpickle
    except ImportError:
        raise TypeError(
            f"cannot send {fn!r} to augmentation worker processes: it is a lambda or defined in a notebook cell or "
            "script, and cloudpickle is not installed. Define it in an importable .py module, install cloudpickle, "
            "or pass augment_workers=0 to run it in the tf.data thread (slower: the GIL serialises it).") from None
    return cloudpickle.dumps(fn)


@contextlib.contextmanager
def _main_module_hidden():
    """Spawn processes without them re-running the parent's ``__main__`` (found by ``__spec__`` and ``__file__``)."""
    main = sys.modules.get("__main__")
    saved = {key: main.__dict__[key] for key in ("__spec__", "__file__") if main and key in main.__dict__}
    try:
        if main is not None:
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        yield
    finally:
        if main is not None:
            main.__dict__.pop("__spec__", None)
            main.__dict__.update(saved)


# ------------------------------------------------------------------------------------------ in a worker
_worker: dict = {}  # this worker's callable, start-up error, barrier and attached buffers


def _start_worker(payload: bytes, barrier) -> None:
    _worker.update(barrier=barrier, attached={}, error=None)
    threading.Thread(target=_end_with_parent, args=(os.getppid(),), daemon=True).start()
    try:
        if importlib.util.find_spec("cv2") is not None:  # processes are the parallelism: one thread each
            import cv2

            cv2.setNumThreads(1)
        _worker["fn"] = pickle.loads(payload)
    except BaseException:
        _worker["error"] = traceback.format_exc()


def _end_with_parent(parent: int) -> None:
    """Exit once the pipeline's process is gone: a worker holds its own queue's write end, so nothing else tells it."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def _started(timeout: float) -> str | None:
    """Held until every worker runs it, so that the pool starts them all now."""
    _worker["barrier"].wait(timeout)
    return _worker["error"]


def _run(name: str, shape, jpegs: list[bytes] | None, seed: int | None) -> tuple[str | None, list]:
    attached = _worker["attached"]
    try:
        if name not in attached:
            for old in list(attached)[:-8]:  # buffers the parent has replaced
                attached.pop(old).close()
            try:  # Python >= 3.13: only the creating process tracks (and unlinks) the segment
                attached[name] = shared_memory.SharedMemory(name=name, track=False)
            except TypeError:
                attached[name] = shared_memory.SharedMemory(name=name)
        images = np.ndarray(shape, np.uint8, buffer=attached[name].buf)
        failures = [] if jpegs is None else _decode_jpegs(jpegs, images)
        images[...] = apply_seeded(_worker["fn"], images, seed)
        return None, failures
    except Exception:  # raised in the parent, with this traceback
        return traceback.format_exc(), []


def _decode_jpegs(jpegs: list[bytes], images: np.ndarray) -> list[tuple[int, str]]:
    """Decode into ``images``; a JPEG that fails leaves a black image and ``(index, why)`` for the parent."""
    failures = []
    for i, data in enumerate(jpegs):
        try:
            decode_jpeg_into(data, images[i])
        except ValueError as err:
            images[i] = 0
            failures.append((i, str(err) if isinstance(err, CorruptJpegError) else f"{UNDECODABLE} ({err})"))
    return failures


# ------------------------------------------------------------------------------------------ in the pipeline
class _Slot:
    """A shared buffer owned by the parent, used by one call at a time."""

    def __init__(self):
        self.shm: shared_memory.SharedMemory | None = None

    def buffer(self, nbytes: int) -> memoryview:
        if self.shm is None or self.shm.size < nbytes:
            self.release()
            self.shm = shared_memory.SharedMemory(create=True, size=max(1, nbytes))
        return self.shm.buf

    def release(self) -> None:
        if self.shm is not None:
            with contextlib.suppress(BufferError):  # a view still held: the mapping goes with the process
                self.shm.close()
            self.shm.unlink()
            self.shm = None


def _shutdown(executor, slots: list[_Slot]) -> None:
    executor.shutdown(wait=True, cancel_futures=True)
    for slot in slots:
        slot.release()


class ProcessPoolAugmenter:
    """Run a numpy batch augmentation ``uint8 [B, H, W, 3] -> uint8 [B, H, W, 3]`` in worker processes.

    ``pool(images, seed=None)`` returns what ``fn`` returns. Twice as many calls as workers can be in flight.
    ``decode_jpegs=False``: TensorFlow decodes and the workers only run ``fn``. A ``fn`` from a notebook cell or a
    script travels by value (no ``__main__`` guard needed). Close with :meth:`close` or ``with``.
    """

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray], num_workers: int | None = None, *,
                 decode_jpegs: bool = True):
        num_workers = default_worker_count() if num_workers is None else num_workers
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (use the function itself for 0), got {num_workers}")
        self.fn, self.num_workers, self.decode_jpegs = fn, num_workers, decode_jpegs
        context = multiprocessing.get_context("spawn")
        self._executor = concurrent.futures.ProcessPoolExecutor(
            num_workers, mp_context=context, initializer=_start_worker,
            initargs=(_pickle_for_worker(fn), context.Barrier(num_workers)))
        self._slots = [_Slot() for _ in range(2 * num_workers)]
        self._free: queue.Queue[_Slot] = queue.Queue()
        for slot in self._slots:
            self._free.put(slot)
        self._finalizer = weakref.finalize(self, _shutdown, self._executor, self._slots)
        # all started here, with __main__ hidden, not later from a tf.data thread: a call held until all run it
        with _main_module_hidden():
            started = [self._executor.submit(_started, STARTUP_TIMEOUT) for _ in range(num_workers)]
        try:
            error = next((e for e in (f.result() for f in started) if e), None)
        except (concurrent.futures.process.BrokenProcessPool, threading.BrokenBarrierError) as err:
            error = f"a worker exited or did not start in {STARTUP_TIMEOUT:.0f} s ({err!r})"
        if error is not None:
            self.close()
            raise AugmentWorkerError(f"augmentation workers could not start {fn!r}:\n{error}")

    @property
    def num_slots(self) -> int:
        """How many calls can be in flight."""
        return len(self._slots)

    def __repr__(self):
        return f"ProcessPoolAugmenter({self.fn!r}, num_workers={self.num_workers}, decode_jpegs={self.decode_jpegs})"

    def __call__(self, images: np.ndarray, seed: int | None = None) -> np.ndarray:
        return self.run(images, seed=seed)[0]

    def run(self, data, *, seed: int | None = None, image_shape: tuple[int, int, int] | None = None,
            take: Callable[[np.ndarray], object] = np.copy) -> tuple[object, list[tuple[int, str]]]:
        """``(take(augmented), failures)`` of a uint8 batch, or of JPEG bytes (each ``image_shape``) the worker
        decodes; ``failures``: ``(index, why)`` per JPEG that did not decode (black). ``take`` copies the result
        out of the shared buffer."""
        if image_shape is None:
            images, jpegs = np.asarray(data), None
            if images.dtype != np.uint8 or images.ndim != 4:
                raise ValueError(f"{self!r} takes a uint8 batch [B, H, W, C], got {images.dtype} {images.shape}")
            shape = images.shape
        else:
            jpegs, shape = list(data), (len(data), *image_shape)
        if not self._finalizer.alive:
            raise RuntimeError(f"{self!r} is closed")
        slot = self._free.get()
        view = None
        try:
            view = np.ndarray(shape, np.uint8, buffer=slot.buffer(int(np.prod(shape))))
            if jpegs is None:
                view[...] = images
            try:
                error, failures = self._executor.submit(_run, slot.shm.name, shape, jpegs, seed).result()
            except concurrent.futures.process.BrokenProcessPool as err:
                raise AugmentWorkerError(f"an augmentation worker of {self!r} exited ({err})") from None
            if error is not None:
                raise AugmentWorkerError(f"{self.fn!r} failed in an augmentation worker:\n{error}")
            return take(view), failures
        finally:
            del view
            self._free.put(slot)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
