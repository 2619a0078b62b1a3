"""Start-up: failures as one line naming the cause, the checks made before anything is
created on disk (``bind``), and what a start does with its data dir (``open_data_dir``).

``gateway serve`` either starts or exits with status 2 and one line such as
``gateway: cannot start: listening on 127.0.0.1:9000: address already in use``; never a
traceback. ``starting(what)`` wraps one start-up step and turns what it raises into a
``StartupError`` that says which step failed and why.

``plan_data_dir`` decides, before anything in the data dir changes, whether this start may
use it: no start ever drops a write that was acknowledged and is not in its upstream.
``open_data_dir`` locks the data dir, carries the plan out, and hands back the start's
footprint, which undoes what a failed start created there.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.cli import human_bytes
from gateway.config import Settings
from gateway.store import datadir, origin
from gateway.store.datadir import DataDirError

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


def upstream_record(settings: Settings) -> str:
    """The journal's record of this start's upstream (``store/origin.py``)."""
    if settings.upstream_endpoint is None:
        return origin.DEMO
    return origin.normalise_endpoint(settings.upstream_endpoint)


def _name(upstream: str | None) -> str:
    return "the embedded demo upstream" if upstream == origin.DEMO else str(upstream)


@dataclass(frozen=True, slots=True)
class DataDirPlan:
    """What a start does with its data dir's record of the upstream.

    ``is_recorded``: the record is (re)written; ``renews``: first the previous upstream's
    cached copies, known buckets and upstream uploads are forgotten (its bytes are not in
    the new one); ``previous``/``upstream``: the records before and after; ``adopted``: the
    unflushed writes were acknowledged for another (or an unrecorded) upstream and are
    flushed to this one all the same; ``assumed``: an older version's data dir, without a
    record, whose unflushed writes are taken to be this upstream's."""

    is_recorded: bool
    renews: bool
    previous: str | None
    upstream: str
    adopted: origin.Contents | None = None
    assumed: origin.Contents | None = None

    def lines(self, forgotten: origin.Forgotten) -> list[str]:
        """What the operator is told (log warnings) once the plan was carried out."""
        out: list[str] = []
        if self.assumed is not None:
            out.append(
                f"the data dir has no record of its upstream (an older version wrote it): "
                f"its {_what(self.assumed)} not flushed yet are taken as acknowledged for "
                f"{self.upstream} and flush there"
            )
        if self.adopted is not None:
            out.append(
                f"--adopt-data-dir true: {_what(self.adopted)}, acknowledged for "
                f"{_name(self.previous) if self.previous else 'an unrecorded upstream'}, "
                f"flush to {self.upstream} instead"
            )
        if forgotten.cached_objects:
            copies = (
                f"dropped {forgotten.cached_objects} cached copies "
                f"({human_bytes(forgotten.cached_bytes)}) of objects"
            )
            if self.previous == origin.DEMO:
                out.append(
                    f"{copies} flushed to the previous demo upstream: it lived in memory, and "
                    "they are gone with it"
                )
            else:
                whose = self.previous or "an unrecorded upstream"
                out.append(f"{copies} in {whose}: {_name(self.upstream)} does not hold them")
        if forgotten.upstream_uploads and self.previous not in (None, origin.DEMO):
            out.append(
                f"{forgotten.upstream_uploads} multipart uploads this gateway opened in "
                f"{self.previous} and a crash left open were not aborted there: abort them "
                "(aws s3api list-multipart-uploads, abort-multipart-upload) or let a "
                "lifecycle rule do it"
            )
        return out


def plan_data_dir(
    found: origin.Contents, upstream: str, *, has_demo_mark: bool, adopt: bool
) -> DataDirPlan:
    """Decide what a start does with a data dir that holds ``found`` (``upstream``: this
    start's record). Never drops an acknowledged write the upstream does not hold: a dir
    holding such writes for another upstream is refused (``DataDirError``, one line saying
    what is there and how to flush it), unless ``adopt`` (an operator's decision, never for
    the demo's writes) sends them to this upstream. Otherwise:

    - the same real upstream: nothing changes;
    - the demo again: its new in-memory upstream holds none of the old one's objects, so
      what the journal knows of the old one is forgotten (cached copies, buckets); the
      unflushed writes stay and flush into the new one;
    - another upstream, nothing unflushed: what the journal knows of the old one is
      forgotten, the new one is recorded;
    - no record (an older version's data dir): without the older demo's mark it was
      written with a real upstream, taken to be this one (what that version did, and the
      upgrade path); with the mark, or for the demo, its writes' upstream is unknown.
    """
    previous = found.upstream
    if previous == upstream and upstream != origin.DEMO:
        return DataDirPlan(False, False, previous, upstream)
    if previous is None and not has_demo_mark and upstream != origin.DEMO:
        assumed = found if found.has_unflushed else None
        return DataDirPlan(True, False, previous, upstream, assumed=assumed)
    if not found.has_unflushed:
        return DataDirPlan(True, True, previous, upstream)
    if previous == upstream:  # the demo again: its unflushed writes flush into the new one
        return DataDirPlan(True, True, previous, upstream)
    if adopt and origin.DEMO not in (upstream, previous):
        return DataDirPlan(True, True, previous, upstream, adopted=found)
    raise DataDirError(_refusal(found, upstream, has_demo_mark))


def _what(found: origin.Contents) -> str:
    what = f"{found.unflushed_objects} objects ({human_bytes(found.unflushed_bytes)})"
    if found.uploads:
        what += f" and {found.uploads} multipart uploads in progress"
        what += f" ({human_bytes(found.upload_bytes)} of parts)"
    return what


def _refusal(found: origin.Contents, upstream: str, has_demo_mark: bool) -> str:
    """One line: what the data dir holds, for which upstream, and how to flush it."""
    what, previous = _what(found), found.upstream
    elsewhere = "give this gateway another --data-dir"
    if upstream == origin.DEMO:
        elsewhere = "give the demo another --data-dir"
    if previous is None:
        return (
            f"it holds {what} not flushed yet, written by an older version that did not "
            f"record for which upstream{' (a demo data dir then)' if has_demo_mark else ''}: "
            "start it with --upstream-endpoint of the upstream they were written for and "
            f"--adopt-data-dir true to flush them there, or {elsewhere}"
        )
    if previous == origin.DEMO:
        return (
            f"it holds {what} acknowledged for the embedded demo upstream and not flushed "
            f"yet; they never go to {upstream}: start the demo on it (no "
            "--upstream-endpoint) to flush them into its new in-memory upstream, or "
            f"{elsewhere}"
        )
    adopt = f" (or --adopt-data-dir true to send them to {upstream})"
    adopt = "" if upstream == origin.DEMO else adopt
    return (
        f"it holds {what} acknowledged for {previous} and not flushed there yet: start it "
        f"with --upstream-endpoint {previous} and that upstream's credentials to flush "
        f"them, or {elsewhere}{adopt}"
    )


async def open_data_dir(
    settings: Settings, stack: contextlib.AsyncExitStack
) -> tuple[datadir.Footprint, origin.Contents]:
    """Lock the data dir, and reconcile its record of the upstream with this start's
    (``startup.plan_data_dir``): refuse, keep, or forget the previous upstream's copies.
    Returns the start's footprint (undone if the start fails) and what the journal held."""
    data_dir = Path(settings.data_dir)
    upstream = upstream_record(settings)
    footprint = datadir.Footprint(data_dir)
    with starting(f"data dir {data_dir}"):
        lock = footprint.take_lock()
    stack.callback(lock.release)
    # Undone before the lock is released, after everything registered later (the journal).
    stack.callback(footprint.undo)
    with starting(f"opening the journal {data_dir / origin.JOURNAL_NAME}"):
        found = await asyncio.to_thread(origin.inspect, data_dir, with_buckets=settings.is_demo)
    with starting(f"data dir {data_dir}"):
        plan = plan_data_dir(
            found,
            upstream,
            has_demo_mark=datadir.has_demo_mark(data_dir),
            adopt=settings.adopt_data_dir,
        )
    if plan.is_recorded:
        with starting(f"opening the journal {data_dir / origin.JOURNAL_NAME}"):
            forgotten = await asyncio.to_thread(
                origin.record, data_dir, upstream, renew=plan.renews, fsync=settings.fsync
            )
        with contextlib.suppress(OSError):
            datadir.retire_demo_mark(data_dir)
        for line in plan.lines(forgotten):
            log.warning("%s", line)
    return footprint, found


async def bind(host_port: str, stack: contextlib.AsyncExitStack) -> list[socket.socket]:
    """Bind (not listen on) every address ``host_port`` names, as aiohttp's TCPSite would;
    closed on ``stack``. Connections are refused until the listener starts (app.py), so an
    address in use fails the start before anything is created on disk."""
    host, _, port = host_port.rpartition(":")
    loop = asyncio.get_running_loop()
    sockets: list[socket.socket] = []
    stack.callback(_close_sockets, sockets)
    with starting(f"listening on {host_port}"):
        infos = await loop.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: one family per socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
    return sockets


def _close_sockets(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
