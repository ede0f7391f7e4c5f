"""Folders nobody can write into: a new empty one, for tests of writers given a read-only place, and an existing
tree made read-only, as Kaggle mounts ``/kaggle/input``."""
import contextlib
import os
import subprocess
from pathlib import Path


@contextlib.contextmanager
def _unwritable(path: Path, mounts: list[list[str]]):
    """``path``, its modes already taken away, unwritable for root too (whom modes do not stop): ``mounts`` run
    over it when it is still writable, and unmounted after."""
    mounted = False
    if os.access(path, os.W_OK):
        for command in mounts:
            subprocess.run(command, check=True)
        mounted = True
    try:
        assert not os.access(path, os.W_OK)
        yield path
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=True)


@contextlib.contextmanager
def read_only_folder(path: Path):
    """``path`` created read-only; as root a read-only tmpfs is mounted on it."""
    path.mkdir(parents=True)
    path.chmod(0o555)
    try:
        with _unwritable(path, [["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)]]):
            yield path
    finally:
        path.chmod(0o755)


@contextlib.contextmanager
def read_only_tree(path: Path):
    """The existing folder ``path`` and everything in it read-only: its modes taken away (and given back after);
    as root a read-only bind mount of it over itself."""
    modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")]}
    for p, mode in modes.items():
        p.chmod(mode & 0o555)
    try:
        with _unwritable(path, [["mount", "--bind", str(path), str(path)],
                                ["mount", "-o", "remount,ro,bind", str(path)]]):
            yield path
    finally:
        for p, mode in modes.items():
            p.chmod(mode)
