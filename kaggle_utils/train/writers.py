"""Metric writers: where the loop's scalars go besides ``metrics.json`` and ``history.csv``.

A writer is any object with ``write(step, scalars)`` (and optionally ``close()``, which its caller
calls): the loop calls it at every log step with the training scalars (``train/loss``, ``lr``,
``grad_norm``, ``train/img_per_s``, ...), after every evaluation with the row's metrics (``val/f1``,
``train_epoch/loss``, ``epoch``, ...) and at the end with the best row's (``best/val_f1``, ...). Values are
Python floats already pulled from the device, so a writer never forces a device sync of its own.

:class:`TensorBoardWriter` writes event files that TensorBoard and Kaggle's viewers read (with the run's
config as an HParams entry); :class:`WandbWriter` a Weights & Biases run, offline where W&B is out of reach.
"""
from __future__ import annotations

import csv
import math
import netrc
import os
import re
import socket
import time
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence
from urllib.parse import urlparse

__all__ = ["MetricWriter", "TensorBoardWriter", "WandbWriter", "WriterError", "close_writers", "import_wandb",
           "wandb_offline_reason"]


class WriterError(ValueError):
    """A writer cannot write where it was pointed, or its package is missing; raised before training starts."""


class MetricWriter(Protocol):
    def write(self, step: int, scalars: Mapping[str, float]) -> None: ...


def _check_writable(folder: Path, what: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write_test.{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise WriterError(f"{what} folder {folder} is not writable ({err.strerror or err}); choose another folder "
                          f"or turn {what} off") from None


def _finite(scalars: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in scalars.items() if v is not None and math.isfinite(v)}


class TensorBoardWriter:
    """Scalars as TensorBoard event files in ``logdir``; ``hparams`` (e.g. the run's flags) as an HParams entry.

    Event files are TFRecords of ``Event`` protocol buffers, which ship with TensorFlow, so this needs no
    ``tensorboard`` package (Kaggle's TPU image has ``tensorflow-cpu`` without it); the HParams plugin's own
    message is encoded by hand (:func:`_hparams_content`). TensorBoard lists the run's scalars (the
    ``best/...`` ones the loop writes last among them) as the HParams tab's metrics. The folder is checked
    when the writer is made. Non-finite values are skipped: TensorBoard draws them as gaps anyway.
    """

    def __init__(self, logdir: str | os.PathLike, *, hparams: Mapping[str, Any] | None = None):
        self.logdir = Path(logdir)
        _check_writable(self.logdir, "TensorBoard")
        from ..data import tensorflow_on_host  # TensorFlow stays off the accelerators

        tf = tensorflow_on_host()
        from tensorflow.core.framework import summary_pb2, tensor_pb2
        from tensorflow.core.util import event_pb2

        self._event_pb2 = event_pb2
        name = f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.v2"
        self.path = self.logdir / name
        self._file = tf.io.TFRecordWriter(str(self.path))
        self._file.write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        if hparams:
            event = event_pb2.Event(wall_time=time.time(), step=0)
            metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name="hparams", content=_hparams_content(hparams)))
            event.summary.value.add(tag="_hparams_/session_start_info", metadata=metadata,
                                    tensor=tensor_pb2.TensorProto(dtype=7, string_val=[b""]))  # 7: DT_STRING
            self._file.write(event.SerializeToString())
        self._file.flush()

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        event = self._event_pb2.Event(wall_time=time.time(), step=int(step))
        for name, value in _finite(scalars).items():
            event.summary.value.add(tag=name, simple_value=value)
        self._file.write(event.SerializeToString())
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _hparams_content(hparams: Mapping[str, Any]) -> bytes:
    """TensorBoard's ``HParamsPluginData{session_start_info: SessionStartInfo{hparams: map<string, Value>}}``.

    Field numbers of tensorboard/plugins/hparams/plugin_data.proto (3: session_start_info, in it 1: hparams)
    and of a map entry (1: key, 2: value); numbers, strings and booleans stay what they are, anything else
    (None, tuples) becomes its text.
    """
    from google.protobuf import struct_pb2

    def field(number: int, payload: bytes) -> bytes:  # a length-delimited field: tag, length, bytes
        return _varint(number << 3 | 2) + _varint(len(payload)) + payload

    entries = b""
    for key, value in hparams.items():
        if isinstance(value, bool):
            proto = struct_pb2.Value(bool_value=value)
        elif isinstance(value, (int, float)):
            proto = struct_pb2.Value(number_value=value)
        else:
            text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            proto = struct_pb2.Value(string_value=text)
        entries += field(1, field(1, key.encode()) + field(2, proto.SerializeToString()))
    return field(3, entries)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def import_wandb():
    """The ``wandb`` module, or :class:`WriterError` naming the package to install."""
    try:
        import wandb  # only a run that asks for W&B needs it (Kaggle's images have it)
    except ImportError:
        raise WriterError("--wandb needs the wandb package: pip install wandb") from None
    return wandb


def wandb_offline_reason() -> str | None:
    """Why W&B's server is out of reach (no API key, or no network: a Kaggle notebook without internet), or None."""
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    if not os.environ.get("WANDB_API_KEY"):
        try:
            known = netrc.netrc().authenticators(host) is not None  # where `wandb login` keeps the key
        except (OSError, netrc.NetrcParseError):
            known = False
        if not known:
            return "no API key: set WANDB_API_KEY (on Kaggle from Add-ons > Secrets) or run `wandb login`"
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        return f"no network: {host} cannot be reached"
    return None


class WandbWriter:
    """The run on Weights & Biases: its config, every scalar the loop writes, and, when closed, the run folder's
    ``curves.png``, ``per_class.csv`` and ``history.csv`` (and ``best.msgpack`` as an artifact with ``artifact``).

    The run lives in ``out_dir/wandb/``. Where W&B's server is out of reach (:func:`wandb_offline_reason`)
    and ``WANDB_MODE`` is not set, it runs offline and says where the run is and how to upload it later.
    """

    def __init__(self, out_dir: str | os.PathLike, *, project: str, config: Mapping[str, Any], name: str | None = None,
                 artifact: bool = False):
        wandb = import_wandb()
        self.out_dir, self.artifact, self._wandb = Path(out_dir), artifact, wandb
        _check_writable(self.out_dir, "W&B")
        offline = None if os.environ.get("WANDB_MODE") else wandb_offline_reason()
        self.run = wandb.init(project=project, name=name or self.out_dir.name, dir=str(self.out_dir),
                              config=dict(config), mode="offline" if offline else None)
        if offline:
            where = Path(self.run.dir).parent
            print(f"W&B runs offline ({offline}): the run is in {where}; upload it later with `wandb sync {where}`")

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(_finite(scalars), step=int(step))

    def close(self) -> None:
        wandb, out, logged = self._wandb, self.out_dir, {}
        if (out / "curves.png").is_file():
            logged["curves"] = wandb.Image(str(out / "curves.png"))
        for name in ("per_class", "history"):
            if (out / f"{name}.csv").is_file():
                with open(out / f"{name}.csv", newline="") as f:
                    header, *rows = list(csv.reader(f))
                columns = list(zip(*rows)) or [()] * len(header)  # a column of numbers (or blanks) is numbers
                numeric = [all(_number(v) is not None for v in column if v) for column in columns]
                logged[name] = wandb.Table(columns=header, data=[
                    [(_number(v) if v else None) if number else v for v, number in zip(row, numeric)] for row in rows])
        if logged:
            self.run.log(logged)
        if self.artifact and (out / "best.msgpack").is_file():
            model = wandb.Artifact(re.sub(r"[^\w.-]", "-", f"{self.run.name}-best"), type="model")
            model.add_file(str(out / "best.msgpack"))
            if (out / "best.json").is_file():
                model.add_file(str(out / "best.json"))
            self.run.log_artifact(model)
        self.run.finish()


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def close_writers(writers: Sequence[object]) -> None:
    for writer in writers:
        close = getattr(writer, "close", None)
        if close is not None:
            close()
