"""Client credentials: access key id -> secret key, from flags and from a file or a directory.

``--credentials-file`` names either

- a YAML or JSON file holding one mapping ``access_key: secret_key`` (JSON is YAML), or
- a directory, as Kubernetes mounts a Secret: each regular file's name is an access key and
  its content (surrounding whitespace stripped) the secret. Names starting with ``.`` are
  skipped (Kubernetes keeps its ``..data`` symlinks and timestamped copies there).

The source is re-read when it changes (checked at most every ``check_interval_s`` on lookup),
so rotating a Secret needs no restart. A source that cannot be read or parsed keeps the last
good table and logs a warning naming the path, never a secret.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import yaml

log = logging.getLogger(__name__)

# A change signature: (name, inode, mtime_ns, size) of the file or of each entry of the directory.
_Signature = tuple[tuple[str, int, int, int], ...]


class CredentialsError(ValueError):
    """The credentials source is missing or malformed; the message never holds a secret."""


class CredentialStore(Mapping[str, str]):
    """A read-only mapping of access key ids to secret keys, reloaded when its source changes.

    ``static`` pairs (``--access-key/--secret-key``) are always present; pairs from ``path``
    win over them on a clash. Loop affinity: none (lookups stat the source at most every
    ``check_interval_s``; that is a few syscalls on the calling thread).
    """

    def __init__(
        self,
        static: Mapping[str, str],
        path: Path | None = None,
        *,
        check_interval_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._static = dict(static)
        self._path = path
        self._interval_s = check_interval_s
        self._monotonic = monotonic
        self._signature: _Signature = ()
        self._checked_at_s = monotonic()
        self._table = dict(self._static)
        if path is not None:
            # At start a broken source is fatal (the operator sees it at once).
            self._signature = _signature(path)
            self._table = {**self._static, **load_credentials(path)}

    def __getitem__(self, access_key: str) -> str:
        self._maybe_reload()
        return self._table[access_key]

    def __iter__(self) -> Iterator[str]:
        self._maybe_reload()
        return iter(dict(self._table))

    def __len__(self) -> int:
        self._maybe_reload()
        return len(self._table)

    def _maybe_reload(self) -> None:
        if self._path is None:
            return
        now_s = self._monotonic()
        if now_s - self._checked_at_s < self._interval_s:
            return
        self._checked_at_s = now_s
        try:
            signature = _signature(self._path)
            if signature == self._signature:
                return
            table = load_credentials(self._path)
        except CredentialsError as exc:
            log.warning("keeping the previous client credentials: %s", exc)
            return
        self._signature = signature
        self._table = {**self._static, **table}
        log.info("reloaded %d client credentials from %s", len(table), self._path)


def load_credentials(path: Path) -> dict[str, str]:
    """The access key -> secret table of a file or directory (see the module docstring)."""
    try:
        if path.is_dir():
            return _from_directory(path)
        return _from_file(path)
    except OSError as exc:
        raise CredentialsError(f"cannot read credentials {path}: {exc.strerror}") from None


def _from_directory(path: Path) -> dict[str, str]:
    table: dict[str, str] = {}
    for entry in sorted(path.iterdir()):
        if entry.name.startswith(".") or not entry.is_file():
            continue
        secret = entry.read_text(encoding="utf-8").strip()
        if secret:
            table[entry.name] = secret
    if not table:
        raise CredentialsError(f"credentials directory {path} holds no key files")
    return table


def _from_file(path: Path) -> dict[str, str]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        # yaml's message quotes the offending line, which may hold a secret.
        raise CredentialsError(f"credentials file {path} is not valid YAML/JSON") from None
    if not isinstance(doc, dict) or not doc:
        raise CredentialsError(f"credentials file {path} must hold a non-empty mapping")
    table: dict[str, str] = {}
    for key, secret in doc.items():
        if not isinstance(key, str) or not isinstance(secret, str) or not key or not secret:
            raise CredentialsError(
                f"credentials file {path}: every entry must be access_key: secret (strings)"
            )
        table[key] = secret
    return table


def _signature(path: Path) -> _Signature:
    try:
        if not path.is_dir():
            st = path.stat()
            return ((path.name, st.st_ino, st.st_mtime_ns, st.st_size),)
        out = []
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            if not entry.name.startswith("."):
                st = entry.stat()  # follows the ..data symlinks of a Secret mount
                out.append((entry.name, st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)
    except OSError as exc:
        raise CredentialsError(f"cannot read credentials {path}: {exc.strerror}") from None
