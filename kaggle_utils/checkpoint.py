"""msgpack checkpoints: atomic writes, checked reads, a JSON manifest beside each file.

A Kaggle session can be killed at any moment (time limit, preemption, a user pressing stop),
so every write goes to a temporary file in the same folder and is renamed into place: a
reader sees the old file or the new one, never half of one. Reads check the whole tree
against what the caller expects and name every key that does not fit, because a silently
partial load (a head with the wrong size, a missing stage) trains for hours before anyone
notices.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

from .variable_trees import flatten

__all__ = [
    "CheckpointError",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_tree",
    "load",
    "manifest_path",
    "save",
]


class CheckpointError(ValueError):
    """A checkpoint file is unreadable or does not fit the tree it is loaded into."""


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Writes ``data`` to ``path`` so that ``path`` is always either old or complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def manifest_path(path: str | os.PathLike) -> Path:
    """``weights.msgpack`` -> ``weights.json``: the manifest lives beside its checkpoint."""
    path = Path(path)
    return path.with_suffix(".json") if path.suffix == ".msgpack" else Path(f"{path}.json")


def _to_numpy(tree: Any) -> Any:
    # device_get fetches sharded / replicated arrays whole; numpy keeps msgpack happy.
    return jax.tree.map(np.asarray, jax.device_get(tree))


def save(path: str | os.PathLike, tree: Any, *, manifest: dict | None = None) -> str:
    """Serialises ``tree`` (any Flax-serialisable pytree) to msgpack; returns its sha256.

    With ``manifest``, a JSON file is written beside the checkpoint (after it, so a manifest
    never describes a file that is not there) with ``sha256`` and ``file`` added.
    """
    data = serialization.msgpack_serialize(serialization.to_state_dict(_to_numpy(tree)))
    digest = hashlib.sha256(data).hexdigest()
    atomic_write_bytes(path, data)
    if manifest is not None:
        record = {**manifest, "file": Path(path).name, "sha256": digest}
        atomic_write_text(manifest_path(path), json.dumps(record, indent=2, default=str) + "\n")
    return digest


def _read_state_dict(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    data = path.read_bytes()
    if not data:
        raise CheckpointError(f"checkpoint {path} is empty")
    try:
        state = serialization.msgpack_restore(data)
    except Exception as e:  # msgpack raises several unrelated types for damaged input
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupt ({len(data)} bytes): {type(e).__name__}: {e}"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a tree of arrays")
    return state


def check_tree(actual: Any, expected: Any, *, what: str = "tree") -> None:
    """Raises CheckpointError naming every missing, unexpected or mis-shaped leaf."""
    got, want = flatten(actual), flatten(expected)
    missing = sorted(set(want) - set(got))
    unexpected = sorted(set(got) - set(want))
    misshaped = [
        f"{k}: file {tuple(np.shape(got[k]))} vs expected {tuple(np.shape(want[k]))}"
        for k in sorted(set(got) & set(want))
        if tuple(np.shape(got[k])) != tuple(np.shape(want[k]))
    ]
    if missing or unexpected or misshaped:
        lines = [f"{what} does not match the expected structure:"]
        for title, keys in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", misshaped)):
            if keys:
                shown = ", ".join(keys[:12]) + (f", ... ({len(keys)} in all)" if len(keys) > 12 else "")
                lines.append(f"  {title} ({len(keys)}): {shown}")
        raise CheckpointError("\n".join(lines))


def load(path: str | os.PathLike, target: Any = None) -> Any:
    """Reads a checkpoint written by :func:`save`.

    Without ``target`` it returns the raw nested dict of numpy arrays. With ``target`` (a
    tree of arrays or ``jax.ShapeDtypeStruct``), every key and shape is checked first, and the
    values come back in ``target``'s structure and dtypes.
    """
    path = Path(path)
    state = _read_state_dict(path)
    if target is None:
        return state
    check_tree(state, serialization.to_state_dict(target), what=f"checkpoint {path}")
    template = jax.tree.map(lambda t: np.zeros(t.shape, t.dtype), target)
    restored = serialization.from_state_dict(template, state)
    return jax.tree.map(lambda r, t: np.asarray(r, dtype=t.dtype), restored, template)
