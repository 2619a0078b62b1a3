"""Logging setup: text or JSON lines, request ids, and secrets kept out of every record.

``configure`` installs one stderr handler on the root logger. Both formats pass the final
message through ``redact``, so a presigned URL or an Authorization header that reaches a log
call by mistake is still masked (defence in depth: the access log never logs them anyway).

Records are handed to a writer thread in batches (``_Batches``): the event loop only builds
the message; formatting the line and writing it (a syscall that can block on a slow
terminal or pipe) happen off the loop, about 50 ms later. ``flush()`` waits for what is
queued.
"""

from __future__ import annotations

import atexit
import contextvars
import datetime
import json
import logging
import re
import sys
import threading
import time
import urllib.parse
from typing import Any

ACCESS_LOGGER = "gateway.access"
REDACTED = "REDACTED"
# The request id of the S3 request being served ("-" outside one); set by the S3 middleware.
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")

# Query parameters of presigned URLs (and STS tokens) that are secrets or identify the key.
SECRET_QUERY_PARAMS = frozenset(
    {"x-amz-signature", "x-amz-credential", "x-amz-security-token", "signature", "awsaccesskeyid"}
)
_SECRET_QUERY = re.compile(
    r"(?i)\b(X-Amz-Signature|X-Amz-Credential|X-Amz-Security-Token|Signature|AWSAccessKeyId)"
    r"=[^&\s\"']*"
)
# An Authorization header value (SigV4 or bearer) pasted into a message.
_AUTH_HEADER = re.compile(r"(?i)\b(Authorization)(\s*[:=]\s*)[^\r\n\"']+")
_SIGV4_FIELDS = re.compile(r"(?i)\b(Credential|Signature)=[^,\s\"']+")
# Fields of a LogRecord that are not user ``extra=`` fields.
_STANDARD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def redact(text: str) -> str:
    """Mask presigned-URL secrets, Authorization headers and SigV4 signature fields."""
    text = _SECRET_QUERY.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    text = _AUTH_HEADER.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _SIGV4_FIELDS.sub(lambda m: f"{m.group(1)}={REDACTED}", text)


def redact_query(query_string: str) -> str:
    """A raw query string with the values of secret parameters replaced by ``REDACTED``;
    everything else is kept byte for byte (so the logged URL is still greppable)."""
    if not query_string:
        return ""
    out = []
    for part in query_string.split("&"):
        name, sep, _ = part.partition("=")
        if urllib.parse.unquote_plus(name).lower() in SECRET_QUERY_PARAMS:
            part = f"{name}{sep or '='}{REDACTED}"
        out.append(part)
    return "&".join(out)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` (the S3 request being served, or ``-``) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class TextFormatter(logging.Formatter):
    """``2026-11-23 22:40:00,123 INFO gateway.app [rid]: message`` with secrets masked.
    Access-log records are printed as their bare line (it carries its own timestamp)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        if record.name == ACCESS_LOGGER:
            return redact(record.getMessage())
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (UTC ISO 8601), ``level``, ``logger``, ``msg``,
    ``request_id``, ``exc`` (traceback, if any) and every ``extra=`` field."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
            "request_id": getattr(record, "request_id", REQUEST_ID.get()),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD_FIELDS and name not in doc:
                doc[name] = value
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(doc, default=str, ensure_ascii=False)


class _Batches(logging.Handler):
    """Hands records to a writer thread that formats and writes them in batches.

    On the caller's thread (the event loop) a record costs its creation, its message (merged
    here: its arguments may change once the call returns) and an append; the writer thread
    is woken once per batch, not per record (a wake-up per access-log line cost more CPU
    than the rest of a small PUT), waits ``linger_s`` for the batch to fill, then writes it.
    """

    def __init__(self, target: logging.Handler, linger_s: float = 0.05) -> None:
        super().__init__()
        self._target = target
        self._linger_s = linger_s
        self._batch: list[logging.LogRecord] = []
        self._cond = threading.Condition()
        self._queued = 0
        self._written = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        record.msg = record.getMessage()
        record.args = None
        with self._cond:
            self._batch.append(record)
            self._queued += 1
            if len(self._batch) == 1:
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._batch and not self._closing:
                    self._cond.wait()
                if not self._batch and self._closing:
                    return
            time.sleep(self._linger_s)  # let the batch fill: one wake-up for many lines
            with self._cond:
                batch, self._batch = self._batch, []
            for record in batch:
                self._target.handle(record)
            self._target.flush()
            with self._cond:
                self._written += len(batch)
                self._cond.notify_all()

    def drain(self, timeout_s: float = 10.0) -> None:
        """Wait until every record emitted so far is written."""
        with self._cond:
            goal = self._queued
            self._cond.wait_for(lambda: self._written >= goal, timeout_s)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=10.0)
        super().close()


_handoff: _Batches | None = None


def flush() -> None:
    """Wait until every record logged so far is written."""
    if _handoff is not None:
        _handoff.drain()


def _stop_writer() -> None:
    global _handoff
    if _handoff is not None:
        _handoff.close()  # writes what is still queued
        _handoff = None


def configure(level: str, fmt: str, *, access_log: bool = True, stream: Any = None) -> None:
    """Install the one root handler (stderr by default) in format ``text`` or ``json``.

    ``level`` debug is the gateway's own loggers' (the libraries' stay at info); trace is
    everyone's.
    ``access_log=False`` silences the ``gateway.access`` logger. aiohttp's own access
    logger is always silenced: it prints the raw request line, presigned signature included.
    """
    global _handoff
    _stop_writer()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    _handoff = _Batches(handler)
    _handoff.addFilter(RequestIdFilter())  # here: the request id is this task's
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(_handoff)
    # debug is this gateway's: the libraries' (botocore logs every request's bytes) stay
    # at info but with trace.
    ours = logging.DEBUG if level == "trace" else logging.getLevelName(level.upper())
    root.setLevel(max(logging.INFO, ours) if level == "debug" else ours)
    logging.getLogger("gateway").setLevel(ours)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    access = logging.getLogger(ACCESS_LOGGER)
    access.setLevel(logging.INFO if access_log else logging.WARNING)


atexit.register(_stop_writer)
