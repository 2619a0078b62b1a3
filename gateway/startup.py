"""Start-up failures as one line naming the cause.

``gateway serve`` either starts or exits with status 2 and one line such as
``gateway: cannot start: listening on 127.0.0.1:9000: address already in use``; never a
traceback. ``starting(what)`` wraps one start-up step and turns what it raises into a
``StartupError`` that says which step failed and why.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import ssl
from collections.abc import Iterator

log = logging.getLogger("gateway")


# OpenSSL's terse reasons, said plainly.
_SSL_REASONS = {
    "PEM lib": "not a PEM certificate chain and private key",
    "KEY_VALUES_MISMATCH": "the private key does not match the certificate",
    "NO_START_LINE": "not a PEM file",
}


class StartupError(RuntimeError):
    """The gateway cannot start. The message is one line: the step and its cause."""


@contextlib.contextmanager
def starting(what: str) -> Iterator[None]:
    """Run one start-up step; any failure becomes ``StartupError("<what>: <cause>")``.
    (An unexpected failure's traceback is still logged, at debug level.)"""
    try:
        yield
    except StartupError:
        raise
    except Exception as exc:
        log.debug("start-up step failed: %s", what, exc_info=True)
        raise StartupError(f"{what}: {cause(exc)}") from exc


def cause(exc: BaseException) -> str:
    """A short, one-line description of why ``exc`` happened."""
    if isinstance(exc, ssl.SSLError):
        text = str(exc.reason or exc)
        for reason, plain in _SSL_REASONS.items():
            if reason in text:
                text = plain
                break
    elif isinstance(exc, OSError) and exc.errno is not None and exc.errno in errno.errorcode:
        text = os.strerror(exc.errno).lower()
        if exc.filename:
            text += f" ({exc.filename})"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())
