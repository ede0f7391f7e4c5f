"""Worker processes that run a numpy batch augmentation outside the training process.

Python under ``tf.py_function`` holds the GIL, so parallel map calls alone do not scale
(bench/README.md). :class:`ProcessPoolAugmenter` therefore runs the callable in worker
processes (spawned, never forked from a process that has TensorFlow's threads running) and
passes batches through ``multiprocessing.shared_memory``: by default the JPEG bytes, which
the worker decodes (:mod:`kaggle_utils.data.jpeg`) before it augments, and the uint8 result
back. The tf.data thread only copies bytes in and out and waits, without the GIL, while a
worker computes. The tf.data side of the route is in :mod:`kaggle_utils.data.numpy_augment`.
"""
from __future__ import annotations

import contextlib
import importlib.util
import itertools
import os
import pickle
import queue
import random
import sys
import threading
import traceback
import weakref
from concurrent.futures import Future
from multiprocessing import shared_memory
from typing import Callable, Sequence

import numpy as np

from .jpeg import decode_jpeg_into
from .jpeg_check import CorruptJpegError
from .tfrecords import UNDECODABLE

__all__ = ["AugmentWorkerError", "ProcessPoolAugmenter", "check_augmented", "default_worker_count"]


class AugmentWorkerError(RuntimeError):
    """The augmentation callable failed (or its worker process died); carries the traceback."""


def default_worker_count() -> int:
    """One worker per CPU core this process may run on (its affinity: a container's or a pinned job's
    share, which ``os.cpu_count()`` ignores), up to 16.

    The workers decode as well as augment, so the tf.data process needs little CPU of its
    own (a small fraction of a worker's per image: bench/README.md): no core is held back for
    it. Workers only run while the prefetch buffer has room, so they yield to the training
    step once the input is ahead.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(16, cores or 1))


def _pickle_for_worker(fn) -> bytes:
    """Serialise ``fn`` for a worker: by reference to its module, by value if it lives in ``__main__``.

    Workers never import the parent's ``__main__`` (see :func:`_main_module_hidden`), so
    functions from a notebook cell or a script travel by value, through cloudpickle.
    """
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
            f"cannot send {fn!r} to augmentation worker processes: it is a lambda or defined in a notebook "
            "cell or script, and cloudpickle is not installed. Define it in an importable .py module, install "
            "cloudpickle, or pass augment_workers=0 to run it in the tf.data thread (slower: the GIL "
            "serialises it).") from None
    return cloudpickle.dumps(fn)


@contextlib.contextmanager
def _main_module_hidden():
    """Start spawned processes without them re-running the parent's main script.

    ``spawn`` (and ``forkserver``) children import the parent's ``__main__`` so that objects
    defined there can be unpickled. For a script that means re-running its top-level code in
    every worker: imports of TensorFlow and JAX, data writing, or the whole training when the
    script has no ``if __name__ == "__main__":`` guard. Here the callable travels by value
    instead (:func:`_pickle_for_worker`), so the children need nothing from ``__main__``.
    multiprocessing finds the main script through ``__spec__`` and ``__file__`` only while it
    starts a process; both are hidden for that moment and restored right after.
    """
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


def check_augmented(out, shape, what: str) -> np.ndarray:
    """``out`` as an array, if an augmentation ``what`` returned uint8 of its input's ``shape``; else why not.

    Checked wherever a user's callable runs (worker, tf.data thread, ``augment_images``), so
    a wrong dtype or shape is named there rather than failing later in the step.
    """
    out = np.asarray(out)
    if out.dtype != np.uint8 or out.shape != tuple(shape):
        raise AugmentWorkerError(
            f"{what} returned {out.dtype} {out.shape}; an augmentation must return uint8 of its input's shape "
            f"{tuple(shape)}")
    return out


def _attach(name: str) -> shared_memory.SharedMemory:
    try:  # Python >= 3.13: the creating process alone tracks (and unlinks) the segment
        return shared_memory.SharedMemory(name=name, track=False)
    except TypeError:
        return shared_memory.SharedMemory(name=name)


def _decode_jpegs(buffer, images: np.ndarray, jpeg_ends: list[int]) -> list[tuple[int, str]]:
    """Decode the JPEGs stored after the image area of ``buffer`` into ``images``; list the failures.

    A JPEG that cannot be decoded, or whose data are corrupt, leaves a black image in its place
    and ``(index, problem)`` in the list, for the parent to name by file and record (and to
    raise, or mask and count).
    """
    failures = []
    start = images.nbytes
    for i, end in enumerate(jpeg_ends):
        try:
            decode_jpeg_into(bytes(buffer[start:images.nbytes + end]), images[i])
        except ValueError as err:
            images[i] = 0
            failures.append((i, str(err) if isinstance(err, CorruptJpegError) else f"{UNDECODABLE} ({err})"))
        start = images.nbytes + end
    return failures


def _run_task(fn, attached: dict, slot: int, name: str, shape, jpeg_ends) -> tuple[str | None, list]:
    failures = []
    try:
        if slot not in attached or attached[slot].name.lstrip("/") != name.lstrip("/"):
            if slot in attached:
                attached.pop(slot).close()
            attached[slot] = _attach(name)
        images = np.ndarray(shape, np.uint8, buffer=attached[slot].buf)
        try:
            if jpeg_ends is not None:
                failures = _decode_jpegs(attached[slot].buf, images, jpeg_ends)
            images[...] = check_augmented(fn(images), shape, repr(fn))
        finally:
            del images
        return None, failures
    except Exception:  # sent back to the parent, raised there with the traceback
        return traceback.format_exc(), failures


def _worker_main(conn, payload: bytes, entropy: int, index: int) -> None:
    """Entry point of an augmentation worker: unpickle the callable, then serve batches."""
    try:
        if importlib.util.find_spec("cv2") is not None:  # processes are the parallelism: one thread each
            import cv2

            cv2.setNumThreads(1)
        fn = pickle.loads(payload)
        first, second = np.random.SeedSequence(entropy, spawn_key=(index,)).generate_state(2)
        random.seed(int(first))
        np.random.seed(int(second))
    except BaseException:
        conn.send(("ready", traceback.format_exc()))
        return
    conn.send(("ready", None))
    attached: dict[int, shared_memory.SharedMemory] = {}
    try:
        while True:
            try:
                task = conn.recv()
            except (EOFError, OSError):  # parent gone
                break
            if task is None:
                break
            task_id, slot, name, shape, jpeg_ends = task
            conn.send((task_id, *_run_task(fn, attached, slot, name, shape, jpeg_ends)))
    finally:
        for shm in attached.values():
            shm.close()


class _Worker:
    """One worker process, its pipe, and a thread that hands replies to waiting callers."""

    def __init__(self, context, payload: bytes, entropy: int, index: int):
        self.index = index
        self.conn, child_conn = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child_conn, payload, entropy, index),
                                       name=f"augment-worker-{index}", daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = Future()
        self._pending: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._dead: str | None = None
        threading.Thread(target=self._read_replies, name=f"augment-replies-{index}", daemon=True).start()

    def _read_replies(self) -> None:
        try:
            _, startup_error = self.conn.recv()
            self.ready.set_result(startup_error)
            while True:
                task_id, error, failures = self.conn.recv()
                with self._lock:
                    future = self._pending.pop(task_id)
                future.set_result((error, failures))
        except (EOFError, OSError):
            self.process.join(timeout=5)
            with self._lock:
                self._dead = f"augmentation worker {self.index} exited (exit code {self.process.exitcode})"
                pending, self._pending = list(self._pending.values()), {}
            if not self.ready.done():
                self.ready.set_result(self._dead)
            for future in pending:
                future.set_result((self._dead, []))

    def submit(self, task_id: int, slot: int, name: str, shape, jpeg_ends: list[int] | None) -> Future:
        """Future of ``(error traceback or None, [(index, why) for each JPEG that failed to decode])``."""
        future = Future()
        with self._lock:
            if self._dead:
                future.set_result((self._dead, []))
                return future
            self._pending[task_id] = future
            self.conn.send((task_id, slot, name, tuple(shape), jpeg_ends))
        return future

    def stop(self) -> None:
        try:
            with self._lock:
                self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.conn.close()


class _Slot:
    """A shared-memory buffer owned by the parent, used by one call at a time on one worker.

    Layout: the uint8 image batch from offset 0, then (when the worker decodes) the
    batch's JPEG bytes, back to back.
    """

    def __init__(self, worker: _Worker, index: int):
        self.worker, self.index = worker, index
        self.shm: shared_memory.SharedMemory | None = None

    def buffer(self, nbytes: int) -> memoryview:
        if self.shm is None or self.shm.size < nbytes:
            self.release()
            self.shm = shared_memory.SharedMemory(create=True, size=max(1, nbytes))
        return self.shm.buf

    def release(self) -> None:
        if self.shm is not None:
            try:
                self.shm.close()
            except BufferError:  # a caller still holds a view; the mapping goes with the process
                pass
            self.shm.unlink()
            self.shm = None


def _shutdown(workers: list[_Worker], slots: list[_Slot]) -> None:
    for worker in workers:
        worker.stop()
    for slot in slots:
        slot.release()


class ProcessPoolAugmenter:
    """Run a numpy batch augmentation in worker processes, called like the function itself.

    ``pool(images)`` copies the uint8 batch into a shared-memory slot, lets a worker run
    ``fn`` on it in place, and returns a copy of the result. :meth:`decode_and_run` sends
    JPEG bytes instead and the worker decodes them first, to the pipeline's exact pixels
    (:mod:`kaggle_utils.data.jpeg`). Each worker has ``slots_per_worker`` slots, so the
    next batch is already waiting when it finishes one; the tf.data hooks issue that many
    concurrent calls.

    ``decode_jpegs`` says where ``load_dataset`` decodes for this pool. True (default): in
    the workers, so all per-image work scales with them and the training process only
    reads records; this is what a host with few cores per worker wants (with tf.data
    decoding, the main process's share of the per-image CPU caps how far the workers scale:
    bench/README.md, "Why the workers decode"). False: TensorFlow decodes in its own thread
    pool and the workers only run ``fn``, which can be faster where cores outnumber the workers.

    ``fn`` is pickled to the workers: by reference when it lives in an importable module,
    by value (cloudpickle) when it comes from a notebook cell or the main script. Workers
    are spawned (``start_method="spawn"``, or ``"forkserver"``), never forked, because
    forking a process whose TensorFlow threads hold locks can deadlock the child; they do
    not re-run the main script, so no ``if __name__ == "__main__":`` guard is needed. Each
    worker seeds ``random`` and ``np.random`` from ``seed`` and its index. Close with
    :meth:`close` or a ``with`` block; worker processes are also stopped and shared memory
    unlinked at interpreter exit.
    """

    def __init__(self, fn: Callable[[np.ndarray], np.ndarray], num_workers: int = 2, *, seed: int | None = None,
                 decode_jpegs: bool = True, slots_per_worker: int = 2, start_method: str = "spawn",
                 startup_timeout: float = 300.0):
        import multiprocessing

        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1 (use the function directly for 0), got {num_workers}")
        self.fn, self.num_workers, self.decode_jpegs = fn, num_workers, decode_jpegs
        payload = _pickle_for_worker(fn)
        entropy = np.random.SeedSequence(seed).entropy
        context = multiprocessing.get_context(start_method)
        with _main_module_hidden():
            self._workers = [_Worker(context, payload, entropy, i) for i in range(num_workers)]
        self._slots = [_Slot(w, s) for s in range(slots_per_worker) for w in self._workers]
        self._finalizer = weakref.finalize(self, _shutdown, self._workers, self._slots)
        self._free: queue.Queue[_Slot] = queue.Queue()
        for slot in self._slots:  # interleaved over workers, so load spreads evenly
            self._free.put(slot)
        self._task_ids = itertools.count()
        for worker in self._workers:
            error = worker.ready.result(timeout=startup_timeout)
            if error is not None:
                self.close()
                raise AugmentWorkerError(f"augmentation worker {worker.index} could not start {fn!r}:\n{error}")

    @property
    def num_slots(self) -> int:
        return len(self._slots)

    def __repr__(self):
        return f"ProcessPoolAugmenter({self.fn!r}, num_workers={self.num_workers}, decode_jpegs={self.decode_jpegs})"

    def __call__(self, images: np.ndarray) -> np.ndarray:
        return self.run(images, np.copy)

    def run(self, images: np.ndarray, take: Callable[[np.ndarray], object]):
        """Augment ``images`` in a worker; ``take`` copies the result out of shared memory.

        ``take`` runs before the slot is handed to the next call, so it may read the shared
        buffer directly: the tf.data hook passes ``tf.convert_to_tensor``, whose own copy is
        then the only one (``np.copy`` followed by TF's conversion would copy twice).
        """
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4:
            raise ValueError(f"{self!r} takes a uint8 batch [B, H, W, C], got {images.dtype} {images.shape}")

        def fill(buffer):
            np.ndarray(images.shape, np.uint8, buffer=buffer)[...] = images

        result, _ = self._call(images.shape, images.nbytes, fill, None, take)
        return result

    def decode_and_run(self, jpegs: Sequence[bytes], image_shape: tuple[int, int, int],
                       take: Callable[[np.ndarray], object] = np.copy) -> tuple[object, list[tuple[int, str]]]:
        """Decode ``jpegs`` (each ``image_shape``) in a worker, augment them, return ``(take(images), failures)``.

        ``failures`` lists ``(index, why)`` for each JPEG the worker could not decode; its
        image is black (and augmented with the rest, so the batch keeps its shape).
        """
        shape = (len(jpegs), *image_shape)
        image_bytes = int(np.prod(shape))
        ends = np.cumsum([len(data) for data in jpegs]).tolist()
        encoded_bytes = ends[-1] if ends else 0

        def fill(buffer):
            buffer[image_bytes:image_bytes + encoded_bytes] = b"".join(jpegs)

        return self._call(shape, image_bytes + encoded_bytes, fill, ends, take)

    def _call(self, shape, nbytes: int, fill, jpeg_ends, take):
        if not self._finalizer.alive:
            raise RuntimeError(f"{self!r} is closed")
        slot = self._free.get()
        shared = None
        try:
            buffer = slot.buffer(nbytes)
            fill(buffer)
            future = slot.worker.submit(next(self._task_ids), slot.index, slot.shm.name, shape, jpeg_ends)
            error, failures = future.result()
            if error is not None:
                raise AugmentWorkerError(f"{self.fn!r} failed in augmentation worker {slot.worker.index}:\n{error}")
            shared = np.ndarray(shape, np.uint8, buffer=buffer)
            return take(shared), failures
        finally:
            del shared
            self._free.put(slot)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
