"""Metric writers: where the loop's scalars go besides ``metrics.json`` and ``history.csv``.

A writer is any object with ``write(step, scalars)`` (and optionally ``close()``): the loop
calls it at every log step with the training scalars (``train/loss``, ``lr``, ``grad_norm``,
``param_norm``, ``train/img_per_s``, ...) and after every evaluation with every metric
(``val/f1``, ...). Values arrive as Python floats, already pulled from the device, so a writer
never forces a device sync of its own. W&B, a CSV of your own or a print are a few lines::

    class PrintWriter:
        def write(self, step, scalars):
            print(step, scalars)

:class:`TensorBoardWriter` writes event files that TensorBoard and Kaggle's viewers read.
"""
from __future__ import annotations

import math
import os
import socket
import time
from pathlib import Path
from typing import Mapping, Protocol, Sequence

__all__ = ["MetricWriter", "TensorBoardWriter", "WriterError", "close_writers"]


class WriterError(ValueError):
    """A writer cannot write where it was pointed; raised before training starts."""


class MetricWriter(Protocol):
    def write(self, step: int, scalars: Mapping[str, float]) -> None: ...


def _check_writable(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write_test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise WriterError(f"TensorBoard folder {folder} is not writable ({err.strerror or err}); "
                          f"choose another folder or turn TensorBoard off") from None


class TensorBoardWriter:
    """Scalars as TensorBoard event files in ``logdir``.

    Event files are TFRecord files of ``Event`` protocol buffers; both ship with TensorFlow, so
    this writes them directly and needs no ``tensorboard`` package (Kaggle's TPU image has
    ``tensorflow-cpu`` without it). The folder is checked when the writer is made, so an
    unwritable folder fails before the first step rather than at the first log. Non-finite
    values are skipped: TensorBoard draws them as gaps anyway.
    """

    def __init__(self, logdir: str | os.PathLike):
        self.logdir = Path(logdir)
        _check_writable(self.logdir)
        from ..data import tensorflow_on_host  # TensorFlow stays off the accelerators

        tf = tensorflow_on_host()
        from tensorflow.core.util import event_pb2

        self._event_pb2 = event_pb2
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.v2"
        self.path = self.logdir / name
        self._file = tf.io.TFRecordWriter(str(self.path))
        self._file.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        self._file.flush()

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        event = self._event_pb2.Event(wall_time=time.time(), step=int(step))
        for name, value in scalars.items():
            if value is not None and math.isfinite(value):
                event.summary.value.add(tag=name, simple_value=float(value))
        self._file.write(event.SerializeToString())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def close_writers(writers: Sequence[object]) -> None:
    for writer in writers:
        close = getattr(writer, "close", None)
        if close is not None:
            close()
