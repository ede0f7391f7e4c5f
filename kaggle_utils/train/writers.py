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
    """Scalars as TensorBoard event files in ``logdir`` (TensorFlow's own summary writer).

    The folder is checked when the writer is made, so an unwritable folder fails before the
    first step rather than at the first log. Non-finite values are skipped: TensorBoard draws
    them as gaps anyway and a NaN would hide the rest of a curve's range.
    """

    def __init__(self, logdir: str | os.PathLike, *, flush_every: int = 1):
        self.logdir = Path(logdir)
        _check_writable(self.logdir)
        from ..data import tensorflow_on_host  # TensorFlow stays off the accelerators

        self._tf = tensorflow_on_host()
        self._writer = self._tf.summary.create_file_writer(str(self.logdir))
        self._flush_every, self._since_flush = flush_every, 0

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        with self._writer.as_default(step=int(step)):
            for name, value in scalars.items():
                if value is not None and math.isfinite(value):
                    self._tf.summary.scalar(name, float(value))
        self._since_flush += 1
        if self._since_flush >= self._flush_every:
            self._writer.flush()
            self._since_flush = 0

    def close(self) -> None:
        self._writer.close()


def close_writers(writers: Sequence[object]) -> None:
    for writer in writers:
        close = getattr(writer, "close", None)
        if close is not None:
            close()
