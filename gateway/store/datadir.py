"""The data directory's exclusive lock: one gateway per data dir.

Two gateways on one data dir would both flush from one journal (double uploads, a result
recorded against a version the other one superseded) and sweep each other's fresh blobs.
``lock`` takes an exclusive ``flock`` on ``<data dir>/gateway.lock`` for the process's life;
the kernel releases it when the process dies, however it dies (kill -9 included), so a
stale lock never blocks a restart. The holder's pid is written in the file for the message
a second gateway prints. ``gateway verify`` only reads and does not take it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
from pathlib import Path

LOCK_NAME = "gateway.lock"


class DataDirError(RuntimeError):
    """The data dir cannot be used as asked; the message says why (the caller names it)."""


class DataDirLocked(DataDirError):
    """Another process holds the data dir's lock; the message names its pid."""


class DataDirLock:
    """An exclusive lock on a data dir. ``release()`` (or process exit) frees it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def lock(data_dir: Path) -> DataDirLock:
    """Create ``data_dir`` if needed and lock it. Raises DataDirLocked when another process
    holds it, OSError when the directory cannot be created or written (read-only, denied)."""
    if data_dir.exists() and not data_dir.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(data_dir))
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        by = f" (pid {holder})" if holder else ""
        raise DataDirLocked(f"in use by another gateway{by}") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DataDirLock(path, fd)


def _read_pid(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 32, 0).decode("ascii").strip()
        if text.isdigit():
            return text
    return ""


DEMO_MARK = "DEMO-DATA-DIR"
_KEPT = frozenset({LOCK_NAME, DEMO_MARK})


def reset_for_demo(data_dir: Path) -> None:
    """Empty a demo data dir (the caller holds its lock). The embedded demo upstream lives
    in memory and starts empty, so anything a journal says is durable there would be a lie:
    a demo starts with an empty data dir too. A data dir that holds data but no demo mark
    (written with a real upstream, or by an older version) is refused, never emptied."""
    mark = data_dir / DEMO_MARK
    leftovers = [p for p in data_dir.iterdir() if p.name not in _KEPT]
    if leftovers and not mark.exists():
        raise DataDirError(
            "it holds data but no demo mark (written with a real upstream, or by an older "
            "version), and the demo empties its data dir at every start: give the demo "
            "another --data-dir, or remove this one"
        )
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    mark.write_text("A demo data dir: emptied at every start of the embedded demo upstream.\n")
