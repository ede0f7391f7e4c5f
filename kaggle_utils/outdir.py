"""An output folder belongs to one run: a lock while it runs, and never two runs' files mixed.

A crashed run's lock is stale when its process is gone (pid and start time, so a reused pid is not the
holder); another host's lock cannot be checked, so the refusal says how to remove it. :func:`prepare`
allows ``--resume`` of the same config, ``--overwrite`` (the kit's own files only), or nothing.
"""
import contextlib
import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Iterator

from .checkpoint import pid_alive
from .config import ConfigError, TrainConfig, differences, flag_of, resume_may_change

LOCK_NAME = ".kaggle_utils.lock"
OUTPUTS = ("config.json", "best.msgpack", "best.json", "last.msgpack", "last.json", "metrics.json", "history.csv",
           "submission.csv", "val_counts.json", "per_class.csv", "curves.png",  # these three: kaggle_utils.report
           "lr_find.csv", "lr_find.png",  # --lr auto's range test (kaggle_utils.run.lr_find)
           "thresholds.json", "probabilities.csv")  # thresholds: a multi-label run's (kaggle_utils.run.thresholds)


class OutDirError(ConfigError):
    """The output folder cannot take this run; the message names it and what to do."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def check_writable(out: str | os.PathLike) -> Path:
    """Refuses a folder the results could not be written into, before any work; creates nothing."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out} is a file, not a folder: choose a folder for the output files")
    existing = next(p for p in (out, *out.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise OutDirError(f"--out {out} cannot be created: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == out else f" ({existing} is not writable)"
        raise OutDirError(f"--out {out} is not writable{where}: choose a writable folder")
    return out


def _holder_text(info: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("time", 0)))
    return f"pid {info.get('pid')} on {info.get('host')}, since {since}"


def _take_lock(lock: Path, me: dict) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(me, f)
    return True


@contextlib.contextmanager
def owned(out: str | os.PathLike) -> Iterator[Path]:
    """Holds ``out`` for this run (creating it); refuses a folder another live run holds. A folder this
    call created and nothing was written to is removed again on exit."""
    out = Path(out)
    created = not out.exists()
    check_writable(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutDirError(f"--out {out} cannot be created ({err.strerror or err}): choose a writable folder") from None
    lock = out / LOCK_NAME
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _start_time(os.getpid()), "time": time.time()}
    while not _take_lock(lock, me):
        try:
            other = json.loads(lock.read_text())
        except (OSError, ValueError):
            other = {}
        pid, started = other.get("pid"), other.get("started")  # a reused pid has another start time
        if other.get("host") == me["host"] and isinstance(pid, int) \
                and not (pid_alive(pid) and (started is None or _start_time(pid) in (None, started))):
            print(f"--out {out}: removing the stale lock of a run that ended without releasing it "
                  f"({_holder_text(other)})")
            lock.unlink(missing_ok=True)
            continue
        holder = _holder_text(other) if other else "unreadable lock"
        raise OutDirError(f"--out {out} is in use by another run ({holder}): wait for it to end or choose another "
                          f"folder; if that run is gone, delete {lock}")
    try:
        yield out
    finally:
        with contextlib.suppress(OSError, ValueError):
            if json.loads(lock.read_text()).get("pid") == me["pid"]:
                lock.unlink()
        if created:  # a run refused before it wrote anything leaves no empty folder behind
            with contextlib.suppress(OSError):
                out.rmdir()


def _read_config(path: Path) -> TrainConfig:
    """The run config a config.json or a checkpoint's manifest records (both under "config")."""
    try:
        return TrainConfig.from_dict(json.loads(path.read_text())["config"], where=str(path))
    except (ValueError, KeyError, TypeError) as err:
        raise OutDirError(f"{path} is not a config this version can read ({err}); pass --overwrite to start "
                          "a new run there, or choose another folder") from None


def _refuse_changes(out: Path, before: TrainConfig, config: TrainConfig, where: str = "") -> None:
    changed = [(name, old, new) for name, old, new in differences(before, config) if not resume_may_change(name)]
    if changed:
        detail = "; ".join(f"{flag_of(name)}: {old!r} -> {new!r}" for name, old, new in changed)
        said = f" per {where}" if where else ""
        raise OutDirError(f"--out {out} holds a run with another config{said} ({detail}); --resume continues only "
                          "the same config: pass --overwrite to start a new run there, or choose another folder")


def prepare(out: Path, config: TrainConfig, *, resume: bool, overwrite: bool) -> None:
    """Refuses to mix runs: an existing run in ``out`` needs --resume (same config) or --overwrite."""
    if resume and overwrite:
        raise OutDirError("--resume and --overwrite exclude each other")
    existing = [name for name in OUTPUTS if (out / name).exists()] + sorted(p.name for p in out.glob("ckpt-*"))
    existing += ["tensorboard/"] if (out / "tensorboard").is_dir() else []
    if not existing:
        if resume:
            raise OutDirError(f"--resume: {out} holds no run to resume (no last.msgpack)")
        return
    if overwrite:
        for name in existing:
            path = out / name.rstrip("/")
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        return
    config_file = out / "config.json"
    if not config_file.is_file():
        raise OutDirError(f"--out {out} holds {', '.join(existing)} but no config.json: not a run of this job; "
                          "pass --overwrite to replace it or choose another folder")
    _refuse_changes(out, _read_config(config_file), config)
    last_manifest = out / "last.json"
    if resume and last_manifest.is_file():  # the checkpoint resumed from says which run wrote it, too
        _refuse_changes(out, _read_config(last_manifest), config,
                        where=f"{last_manifest.name} (the manifest of the checkpoint --resume reads)")
    if not resume:
        raise OutDirError(f"--out {out} already holds this run ({', '.join(existing)}); pass --resume to continue it "
                          "or --overwrite to start again")
    if not (out / "last.msgpack").is_file():
        raise OutDirError(f"--resume: {out} has no last.msgpack yet (the run stopped before its first checkpoint); "
                          "pass --overwrite to start again")
