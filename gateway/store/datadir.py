"""The data directory's exclusive lock: one gateway per data dir.

Two gateways on one data dir would both flush from one journal (double uploads, a result
recorded against a version the other one superseded) and sweep each other's fresh blobs.
``lock`` takes an exclusive ``flock`` on ``<data dir>/gateway.lock`` for the process's life;
the kernel releases it when the process dies, however it dies (kill -9 included), so a
stale lock never blocks a restart. The holder's pid is written in the file for the message
a second gateway prints. ``gateway verify`` only reads and does not take it.

``Creation`` undoes what a failed start created in the data dir (the data dir itself, when
the start made it): a start either comes up or leaves the disk as it found it.
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


# Older versions marked a data dir made by the demo (and emptied it at every demo start).
# The journal's upstream record (origin.py) replaces it; start-up reads it from a data dir
# without a record, then removes it.
DEMO_MARK = "DEMO-DATA-DIR"


def has_demo_mark(data_dir: Path) -> bool:
    return (data_dir / DEMO_MARK).exists()


def retire_demo_mark(data_dir: Path) -> None:
    """Remove an older version's demo mark (once the journal records its upstream)."""
    (data_dir / DEMO_MARK).unlink(missing_ok=True)


class Footprint:
    """What a start adds to a data dir, taken away again if that start fails.

    Made before anything is created: it notes whether the data dir exists. ``take_lock()``
    locks it (creating it if needed) and notes what it holds then. ``undo()`` removes what
    was added since: the data dir itself (with the parents made for it) when this start
    made it, otherwise the entries it did not hold (a new journal, the lock file, the body
    directories); entries it held are left alone. ``keep()`` disarms it once the start
    succeeded. It MUST only be undone before the first write is accepted (nothing
    acknowledged can be in what it removes) and before the lock is released (no other
    gateway can be using what it removes).
    """

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._made: Path | None = None  # the outermost directory this start creates
        path = data_dir.absolute()
        if not path.exists():
            while not path.parent.exists() and path.parent != path:
                path = path.parent
            self._made = path
        self._held: set[str] = set()
        self._is_armed = False

    def take_lock(self) -> DataDirLock:
        """``lock(data_dir)``, then note what the data dir holds under the lock."""
        had_lock_file = (self.data_dir / LOCK_NAME).exists()
        try:
            held = lock(self.data_dir)
        except BaseException:
            self._remove_empty_dirs()
            raise
        names = set(os.listdir(self.data_dir))
        if not had_lock_file:
            names.discard(LOCK_NAME)
        if names:  # another gateway filled it between the look and the lock: not ours
            self._made = None
        self._held = names
        self._is_armed = True
        return held

    def keep(self) -> None:
        self._is_armed = False

    def undo(self) -> None:
        if not self._is_armed:
            return
        self._is_armed = False
        if self._made is not None:
            shutil.rmtree(self._made, ignore_errors=True)
            return
        for name in set(os.listdir(self.data_dir)) - self._held:
            path = self.data_dir / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def _remove_empty_dirs(self) -> None:
        """After a failed lock: the directories this start made, if still empty."""
        if self._made is None:
            return
        path = self.data_dir.absolute()
        while True:
            with contextlib.suppress(OSError):
                path.rmdir()
            if path == self._made or path.parent == path:
                return
            path = path.parent
