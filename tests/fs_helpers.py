"""A folder nobody can write into, for tests of writers given a read-only place."""
import contextlib
import os
import subprocess
from pathlib import Path


@contextlib.contextmanager
def read_only_folder(path: Path):
    """``path`` created read-only; as root (which ignores modes) a read-only tmpfs is mounted on it."""
    path.mkdir(parents=True)
    path.chmod(0o555)
    mounted = False
    if os.access(path, os.W_OK):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)], check=True)
        mounted = True
    try:
        assert not os.access(path, os.W_OK)
        yield path
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=True)
        path.chmod(0o755)
