"""msgpack checkpoints: atomic writes, checked reads, a JSON manifest beside each file, writes off the caller's thread.

A Kaggle session can be killed at any moment, so every write goes to a temporary file (named with its pid and
host, so :func:`remove_stale_temp_files` knows a dead writer's) renamed into place: a reader sees the old file
or the new one. Reads name every key that does not fit (a silently partial load trains for hours).
"""
import csv
import hashlib
import io
import json
import os
import re
import secrets
import socket
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import jax
import numpy as np
from flax import serialization

from .variable_trees import flatten, listing

_HOST_TAG = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
# .<name>.<pid>.<host tag>.<8 random hex digits>.tmp
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.(?P<host>[0-9a-f]{8})\.[a-z0-9_]{8}\.tmp$")
STALE_TEMP_AGE_S = 3600.0


class CheckpointError(ValueError):
    """A checkpoint file is unreadable or does not fit the tree it is loaded into."""


class ChangedCheckpointError(CheckpointError):
    """A checkpoint's sha256 is not the one its manifest records: changed, or another file copied over it."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that ``path`` is always either old or complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = str(path.parent / f".{path.name}.{os.getpid()}.{_HOST_TAG}.{secrets.token_hex(4)}.tmp")
    try:
        # created with the umask applied, as any new file (mkstemp's 0600 would hide weights and submissions)
        with os.fdopen(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename in (None, tmp):  # name the file the user knows, not the temp
            raise OSError(err.errno, err.strerror, str(path)) from err
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_csv(path: str | os.PathLike, columns: Sequence[str], rows: Iterable[Mapping | Sequence]) -> None:
    """A CSV of the header ``columns`` and ``rows`` written atomically: each row a mapping by column (a missing one
    is empty) or a sequence in the columns' order."""
    text = io.StringIO()
    by_name = csv.DictWriter(text, fieldnames=list(columns), lineterminator="\n")
    in_order = csv.writer(text, lineterminator="\n")
    by_name.writeheader()
    for row in rows:
        (by_name if isinstance(row, Mapping) else in_order).writerow(row)
    atomic_write_text(path, text.getvalue())


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        pass
    return True


def remove_stale_temp_files(folder: str | os.PathLike, *, max_age_s: float = STALE_TEMP_AGE_S) -> list[Path]:
    """Deletes (and returns) the temporary files of :func:`atomic_write_bytes` whose writer died: on this host when
    its pid is gone, from another host when older than ``max_age_s``."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for entry in folder.iterdir():
        match = _TEMP_NAME.match(entry.name)
        if match is None or not entry.is_file():
            continue
        if match["host"] == _HOST_TAG:
            stale = not pid_alive(int(match["pid"]))
        else:
            stale = time.time() - entry.stat().st_mtime > max_age_s
        if stale:
            entry.unlink(missing_ok=True)
            removed.append(entry)
    return sorted(removed)


def manifest_path(path: str | os.PathLike) -> Path:
    """``weights.msgpack`` -> ``weights.json``: the manifest lives beside its checkpoint."""
    path = Path(path)
    return path.with_suffix(".json") if path.suffix == ".msgpack" else Path(f"{path}.json")


def _serialized(tree: Any) -> bytes:
    host = jax.tree.map(np.asarray, jax.device_get(tree))  # sharded arrays fetched whole; numpy for msgpack
    return serialization.msgpack_serialize(serialization.to_state_dict(host))


def digest(tree: Any) -> str:
    """The sha256 :func:`save` would record for ``tree``: what a run started from, without a file."""
    return hashlib.sha256(_serialized(tree)).hexdigest()


def save(path: str | os.PathLike, tree: Any, *, manifest: dict | None = None) -> str:
    """Serialises ``tree`` (any Flax-serialisable pytree) to msgpack; returns its sha256. ``manifest``: a JSON file
    beside it, with ``sha256`` and ``file`` added, written after it (never describing a file not there)."""
    data = _serialized(tree)
    digest = hashlib.sha256(data).hexdigest()
    atomic_write_bytes(path, data)
    if manifest is not None:
        record = {**manifest, "file": Path(path).name, "sha256": digest}
        atomic_write_text(manifest_path(path), json.dumps(record, indent=2, default=str) + "\n")
    return digest


def file_record(path: str | os.PathLike) -> dict:
    """Which file a run read, so its folder says it: the absolute path, the size and the sha256 of the bytes."""
    path = Path(path).resolve()
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return {"file": str(path), "bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def check_format(path: str | os.PathLike) -> None:
    """Raises :class:`CheckpointError` for a missing, empty or PyTorch file from its first bytes, before any work."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else 0
        head += f.read(min(size, 1 << 20) + 1 if head[:1] != b"\x80" else 8)  # a safetensors header, up to 1 MiB
    if not head:
        raise CheckpointError(f"checkpoint {path} is empty")
    foreign = _torch_format(head)
    if foreign:
        raise CheckpointError(
            f"checkpoint {path} is a PyTorch {foreign}, not a Flax msgpack checkpoint: convert it with "
            f"`python -m weights_port MODEL --checkpoint {path} --out {path.stem}.msgpack`")


def check_digest(path: str | os.PathLike, data: bytes | None = None) -> None:
    """Raises :class:`CheckpointError` when ``path``'s sha256 (of ``data``: its bytes, already read) is not the one
    its manifest records; a file without a recorded digest passes."""
    path = Path(path)
    try:
        recorded = json.loads(manifest_path(path).read_text()).get("sha256")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, str):
        return
    actual = hashlib.sha256(path.read_bytes() if data is None else data).hexdigest()
    if actual != recorded:
        raise ChangedCheckpointError(
            f"checkpoint {path} differs from its manifest {manifest_path(path).name} (sha256 {actual[:12]}... vs "
            f"{recorded[:12]}...): it was changed or truncated after it was written")


def _torch_format(data: bytes) -> str | None:
    """What PyTorch file ``data`` is, by its first bytes; None for anything else (msgpack included)."""
    if data.startswith(b"PK\x03\x04"):
        return "checkpoint (torch.save zip archive)"
    if len(data) > 1 and data[0] == 0x80 and 2 <= data[1] <= 5:  # msgpack's 0x80 is an empty map, nothing after
        return "checkpoint (pickle)"
    if len(data) > 9 and data[8:9] == b"{":
        header_size = int.from_bytes(data[:8], "little")
        if 8 + header_size <= len(data) and data[8:8 + header_size].rstrip(b" ").endswith(b"}"):  # JSON, padded
            return "safetensors file"
    return None


def check_tree(actual: Any, expected: Any, *, what: str = "tree") -> None:
    """Raises CheckpointError naming every missing, unexpected or mis-shaped leaf."""
    got, want = flatten(actual), flatten(expected)
    missing = sorted(set(want) - set(got))
    unexpected = sorted(set(got) - set(want))
    misshaped = [f"{k}: file {np.shape(got[k])} vs expected {np.shape(want[k])}" for k in sorted(set(got) & set(want))
                 if np.shape(got[k]) != np.shape(want[k])]
    if missing or unexpected or misshaped:
        lines = [f"{what} does not match the expected structure:"]
        for title, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
            if keys:
                lines.append(f"  {title} ({len(keys)}): {listing(keys, 12)}")
        raise CheckpointError("\n".join(lines))


def load(path: str | os.PathLike, target: Any = None, *, accept_changed: bool = False) -> Any:
    """A checkpoint of :func:`save` as a nested dict of numpy arrays, or with ``target`` (arrays or
    ``jax.ShapeDtypeStruct``) every key and shape checked and the values in ``target``'s structure and dtypes.

    A file whose sha256 is not its manifest's is refused (another run's file copied over it predicts as this run);
    ``accept_changed``: loaded with a warning (a file changed knowingly, or one whose manifest a kill left behind)."""
    path = Path(path)
    check_format(path)
    data = path.read_bytes()
    try:
        check_digest(path, data)
    except CheckpointError as problem:
        if not accept_changed:
            raise
        warnings.warn(str(problem), RuntimeWarning, stacklevel=2)
    try:
        state = serialization.msgpack_restore(data)
    except Exception as e:  # msgpack raises several unrelated types for damaged input
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({len(data)} bytes): "
                              f"{type(e).__name__}: {e}") from e
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a tree of arrays")
    if target is None:
        return state
    check_tree(state, serialization.to_state_dict(target), what=f"checkpoint {path}")
    template = jax.tree.map(lambda t: np.zeros(t.shape, t.dtype), target)
    restored = serialization.from_state_dict(template, state)
    return jax.tree.map(lambda r, t: np.asarray(r, dtype=t.dtype), restored, template)


class BackgroundWrites:
    """Runs write jobs (of host data) in a thread, one at a time, so training goes on while a checkpoint reaches the
    disk. :meth:`submit` first waits for the job before it; :meth:`wait` for the last, raising its error if it had
    one. The executor's thread is joined at exit: a process that ends finishes its last write; a killed one leaves the
    old file whole.
    """

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer")
        self._last: Future | None = None

    def submit(self, job, *args, **kwargs) -> None:
        self.wait()
        self._last = self._pool.submit(job, *args, **kwargs)

    def wait(self, *, raise_error: bool = True) -> None:
        last, self._last = self._last, None
        error = None if last is None else last.exception()  # waits for it
        if error is not None and raise_error:
            raise error
