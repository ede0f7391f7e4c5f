"""Metric writers: where the loop's scalars go besides ``metrics.json``: TensorBoard, Weights & Biases, yours.

A writer is any object with ``write(step, scalars)`` (and optionally ``close()``, called by its owner); it gets
host floats at each log, evaluation and the end (``best/...``), so it never forces a device sync.
"""
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
    """Scalars as TensorBoard event files in ``logdir`` (checked at once); ``hparams`` (the run's flags) as an
    HParams entry whose metrics are the run's scalars (``best/...`` among them). Event protos ship with
    TensorFlow, so no ``tensorboard`` package is needed (Kaggle's TPU image has none). NaNs are skipped.
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
    """TensorBoard's ``HParamsPluginData{session_start_info (3): SessionStartInfo{hparams (1): map<string, Value>}}``.

    A ``Struct`` is laid out exactly as that SessionStartInfo (its field 1 is a ``map<string, Value>``), so only
    the outer field is written by hand. Numbers, strings and booleans stay themselves; None and tuples become text.
    """
    from google.protobuf import struct_pb2

    start = struct_pb2.Struct()
    start.update({k: v if isinstance(v, (bool, int, float, str)) else ",".join(map(str, v)) if isinstance(v, tuple)
                  else str(v) for k, v in hparams.items()})
    payload = start.SerializeToString()
    size, length = bytearray(), len(payload)
    while True:  # the payload's length as a varint: 7 bits a byte, low bits first
        size.append((length & 0x7F) | (0x80 if length > 0x7F else 0))
        length >>= 7
        if not length:
            return bytes([3 << 3 | 2]) + bytes(size) + payload  # field 3, length-delimited


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
    """The run on Weights & Biases (in ``out_dir/wandb/``): config, scalars and, when closed, ``curves.png``,
    ``per_class.csv`` (and ``best.msgpack`` with ``artifact``). Offline, with how to upload later, where the
    server is out of reach (:func:`wandb_offline_reason`) and ``WANDB_MODE`` is not set.
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
        if (out / "per_class.csv").is_file():
            with open(out / "per_class.csv", newline="") as f:
                header, *rows = list(csv.reader(f))
            numeric = [all(_number(v) is not None for v in column if v) for column in zip(*rows)]  # or blank
            logged["per_class"] = wandb.Table(columns=header, data=[
                [(_number(v) if v else None) if number else v for v, number in zip(row, numeric)] for row in rows])
        if logged:
            self.run.log(logged)
        if self.artifact and (out / "best.msgpack").is_file():
            model = wandb.Artifact(re.sub(r"[^\w.-]", "-", f"{self.run.name}-best"), type="model")
            for name in ("best.msgpack", "best.json"):
                model.add_file(str(out / name))
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
