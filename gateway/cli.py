"""``gateway drain``, and the admin client and formatting every admin command shares
(``status``, ``pause``, ``resume`` and ``retry`` are in cli_status.py, ``checkpoints`` in
cli_checkpoints.py, the restart commands in cli_restore.py).

Only the standard library is used (urllib), so these commands work in a minimal image and
from a Kubernetes preStop hook. Exit codes (scripts and the Helm chart rely on them):

- 0: ``drain`` found everything drained.
- 1: the admin API could not be reached (or answered an HTTP error).
- 3: ``drain`` gave up: something was still pending when ``--timeout`` passed
  (or, without ``--wait``, at the moment of the call), or nothing but failed objects was
  left (they wait for an operator's retry, not for time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

DEFAULT_ADMIN = "http://127.0.0.1:9001"
EXIT_OK, EXIT_UNREACHABLE, EXIT_NOT_DRAINED = 0, 1, 3
# One drain poll blocks server-side at most this long, so progress refreshes about as often.
_POLL_S = 1.0
# Without a TTY a progress line is printed this often (a log, not an animation).
_PLAIN_EVERY_S = 10.0
_BAR_WIDTH = 30


class AdminError(RuntimeError):
    """The admin API could not be reached or answered an HTTP error."""


def admin_arguments(parser: argparse.ArgumentParser) -> None:
    """``--admin``, ``--admin-token``, ``--admin-token-file`` (every admin command has them)."""
    parser.add_argument(
        "--admin", default=None, help=f"admin URL [env GATEWAY_ADMIN, default {DEFAULT_ADMIN}]"
    )
    parser.add_argument(
        "--admin-token",
        default=None,
        help="bearer token for the admin API [env GATEWAY_ADMIN_TOKEN]",
    )
    parser.add_argument(
        "--admin-token-file",
        default=None,
        help="file holding that token [env GATEWAY_ADMIN_TOKEN_FILE]",
    )


def add_arguments(sub: Any) -> None:
    """Register ``drain`` on an argparse sub-parsers object."""
    drain = sub.add_parser("drain", help="wait until acknowledged writes are durable upstream")
    admin_arguments(drain)
    drain.add_argument("--bucket", default=None)
    drain.add_argument("--prefix", default="")
    drain.add_argument("--wait", action="store_true", help="block until drained or timeout")
    drain.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (with --wait)")
    drain.add_argument(
        "--progress",
        choices=("auto", "bar", "plain", "none"),
        default="auto",
        help="progress on stderr: bar on a TTY, plain lines otherwise (auto)",
    )


# --------------------------------------------------------------------------- admin client


@dataclass(frozen=True, slots=True)
class AdminClient:
    """A blocking JSON client of the admin API (stdlib only)."""

    base_url: str
    token: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> AdminClient:
        """Flags beat env: ``--admin``/``GATEWAY_ADMIN``; the token from ``--admin-token``,
        ``--admin-token-file``, ``GATEWAY_ADMIN_TOKEN``, ``GATEWAY_ADMIN_TOKEN_FILE`` (the
        first one set). Raises AdminError when the token file cannot be read."""
        url = args.admin or os.environ.get("GATEWAY_ADMIN") or DEFAULT_ADMIN
        token = getattr(args, "admin_token", None)
        token_file = getattr(args, "admin_token_file", None)
        if not token and not token_file:
            token = os.environ.get("GATEWAY_ADMIN_TOKEN")
            token_file = os.environ.get("GATEWAY_ADMIN_TOKEN_FILE")
        if not token and token_file:
            try:
                with open(token_file, encoding="utf-8") as f:
                    token = f.read().strip()
            except OSError as exc:
                raise AdminError(f"admin token file: {exc}") from exc
        return cls(url.rstrip("/"), token or None)

    def get(self, path: str, query: dict[str, str] | None = None, timeout_s: float = 10) -> Any:
        """GET ``path`` and decode its JSON body. Raises AdminError on any failure."""
        url = self.base_url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise AdminError(f"{url.split('?')[0]}: {exc}") from exc

    def request(
        self, method: str, path: str, query: dict[str, str] | None = None, timeout_s: float = 60
    ) -> tuple[int, dict[str, Any]]:
        """One request: (HTTP status, JSON body), error statuses included. Raises
        AdminError when nothing (or no JSON) came back."""
        url = self.base_url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = b"" if method == "POST" else None
        request = urllib.request.Request(url, method=method, data=data)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                    return resp.status, json.loads(resp.read())
            except urllib.error.HTTPError as exc:
                return exc.code, json.loads(exc.read() or b"{}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise AdminError(f"{url.split('?')[0]}: {exc}") from exc

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = self.get("/admin/v1/status")
        return data

    def drain(self, bucket: str | None, prefix: str, wait_s: float) -> dict[str, Any]:
        """One drain fence; blocks server-side up to ``wait_s`` (0: answer at once)."""
        query = {"prefix": prefix, "wait": "true" if wait_s > 0 else "false"}
        query["timeout"] = f"{wait_s:.3f}"
        if bucket:
            query["bucket"] = bucket
        data: dict[str, Any] = self.get("/admin/v1/drain", query, timeout_s=wait_s + 30)
        return data


# --------------------------------------------------------------------------- formatting


def human_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``; binary units, as the size flags use."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_duration(seconds: float | None) -> str:
    """``None`` -> ``-``; ``75`` -> ``1m15s``; ``3725`` -> ``1h02m``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def table(header: list[str], rows: list[list[str]], left: int = 2) -> list[str]:
    """Lines of a table: the first ``left`` columns left-aligned, the others (numbers)
    right-aligned; the last column, when left-aligned too, is not padded."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = [c.ljust(w) for c, w in zip(cells[:left], widths[:left], strict=True)]
        out += [c.rjust(w) for c, w in zip(cells[left:], widths[left:], strict=True)]
        return "  ".join(out).rstrip()

    return [line(header), *(line(r) for r in rows)]


# --------------------------------------------------------------------------- drain progress


@dataclass(slots=True)
class DrainProgress:
    """Bytes left, flush rate and ETA of one drain, from successive polls.

    Bytes left are the fence's unflushed bytes less what is already sent of its uploads in
    flight (a large object moves the bar while it goes). The rate is an exponentially
    weighted average of how fast they fell between polls (new writes arriving meanwhile
    make it look slower, which is the truth that matters for an ETA); it is 0 once nothing
    moved for ``IDLE_S``, and there is no ETA while the gateway says why there is none
    (``no_eta``: paused, waiting for the upstream).
    """

    IDLE_S = 10.0
    started_s: float
    first_bytes: int | None = None
    last_bytes: int | None = None
    last_s: float | None = None
    moved_s: float | None = None
    rate_bytes_per_s: float | None = None
    no_eta: bool = False

    def update(self, now_s: float, left_bytes: int) -> None:
        if self.first_bytes is None:
            self.first_bytes, self.moved_s = left_bytes, now_s
        if self.last_bytes is not None and self.last_s is not None and now_s > self.last_s:
            sample = max(0.0, (self.last_bytes - left_bytes) / (now_s - self.last_s))
            prev = self.rate_bytes_per_s
            self.rate_bytes_per_s = sample if prev is None else 0.7 * prev + 0.3 * sample
            if sample > 0:
                self.moved_s = now_s
            elif self.moved_s is not None and now_s - self.moved_s >= self.IDLE_S:
                self.rate_bytes_per_s = 0.0  # nothing moved lately: not a dwindling average
        self.last_bytes, self.last_s = left_bytes, now_s

    def eta_s(self) -> float | None:
        if not self.last_bytes:
            return 0.0 if self.last_bytes == 0 else None
        if not self.rate_bytes_per_s or self.no_eta:
            return None
        return self.last_bytes / self.rate_bytes_per_s

    def line(self, pending_objects: int, note: str = "") -> str:
        """One progress line: ``[####----] 42% 1.2 GiB left, 300.0 MiB/s, ETA 4s``."""
        left = self.last_bytes or 0
        total = max(self.first_bytes or 0, left)
        done = 1.0 if total == 0 else 1.0 - left / total
        filled = round(done * _BAR_WIDTH)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        rate = "-" if self.rate_bytes_per_s is None else human_bytes(self.rate_bytes_per_s) + "/s"
        text = (
            f"[{bar}] {done * 100:3.0f}% {human_bytes(left)} left in {pending_objects} objects,"
            f" {rate}, ETA {human_duration(self.eta_s())}"
        )
        return text + (f" ({note})" if note else "")


class ProgressSink:
    """Where progress lines go: redrawn in place on a TTY, periodic lines otherwise."""

    def __init__(self, stream: TextIO, mode: str, clock: Callable[[], float]) -> None:
        if mode == "auto":
            mode = "bar" if stream.isatty() else "plain"
        self.stream, self.mode, self.clock = stream, mode, clock
        self._last_plain_s: float | None = None

    def show(self, text: str, *, final: bool = False) -> None:
        if self.mode == "bar":
            self.stream.write("\r\x1b[2K" + text + ("\n" if final else ""))
        elif self.mode == "plain":
            now = self.clock()
            due = self._last_plain_s is None or now - self._last_plain_s >= _PLAIN_EVERY_S
            if not (due or final):
                return
            self._last_plain_s = now
            self.stream.write(text + "\n")
        self.stream.flush()


# --------------------------------------------------------------------------- commands


def run_drain(args: argparse.Namespace, clock: Callable[[], float] = time.monotonic) -> int:
    """``gateway drain``: 0 drained, 3 still pending at the deadline, 1 unreachable.

    Without ``--wait`` one fence is asked once. With ``--wait`` the fence is asked
    repeatedly with a short server-side wait, so progress is shown between polls; every
    poll is a new fence, so writes acknowledged while the drain runs are waited for too.
    The last drain answer is printed as one JSON line on stdout.
    """
    try:
        admin = AdminClient.from_args(args)
    except AdminError as exc:
        sys.stderr.write(f"gateway drain: {exc}\n")
        return EXIT_UNREACHABLE
    sink = ProgressSink(sys.stderr, "none" if not args.wait else args.progress, clock)
    progress = DrainProgress(started_s=clock())
    deadline_s = progress.started_s + max(0.0, args.timeout)
    try:
        data = admin.drain(args.bucket, args.prefix, 0.0)
        while args.wait and not data["drained"] and not _only_failed(data):
            progress.update(clock(), _left_bytes(data))
            note, progress.no_eta = _note(admin, data)
            sink.show(progress.line(data["pending_objects"], note))
            left_s = deadline_s - clock()
            if left_s <= 0:
                break
            data = admin.drain(args.bucket, args.prefix, min(_POLL_S, left_s))
    except AdminError as exc:
        sys.stderr.write(f"gateway drain: cannot reach the admin API: {exc}\n")
        return EXIT_UNREACHABLE
    progress.update(clock(), _left_bytes(data))
    if args.wait:
        verdict = "drained" if data["drained"] else "timed out"
        if _only_failed(data):
            verdict = "only failed objects are left"
        sink.show(progress.line(data["pending_objects"], verdict), final=True)
    if data.get("failed_objects"):
        held = int(data.get("held_objects") or 0)
        behind = f" ({held} commit markers wait behind them)" if held else ""
        sys.stderr.write(
            f"gateway drain: {data['failed_objects']} of the pending objects failed "
            f"permanently{behind} and wait for an operator: `gateway status` shows the last "
            f"error; fix its cause, then run `gateway retry` "
            f"(POST {admin.base_url}/admin/v1/flush/retry)\n"
        )
    sys.stdout.write(json.dumps(data) + "\n")
    return EXIT_OK if data["drained"] else EXIT_NOT_DRAINED


def _only_failed(drain: dict[str, Any]) -> bool:
    """Nothing is pending but failed objects and the commit markers they hold back:
    waiting longer cannot drain it."""
    stuck = int(drain.get("failed_objects") or 0) + int(drain.get("held_objects") or 0)
    return not drain["drained"] and stuck >= int(drain["pending_objects"])


def _left_bytes(drain: dict[str, Any]) -> int:
    """The fence's bytes not sent yet (a gateway too old to say counts none as sent)."""
    return max(0, int(drain["pending_bytes"]) - int(drain.get("in_flight_sent_bytes") or 0))


def _note(admin: AdminClient, drain: dict[str, Any]) -> tuple[str, bool]:
    """Why a drain may not progress (the flusher paused, the upstream accepting nothing,
    some of its objects failed), and whether the gateway says there can be no ETA."""
    notes = []
    no_eta = False
    try:
        status = admin.status()
    except AdminError:
        status = {}
    if status.get("flush_state") == "paused":
        notes.append("flusher paused")
        no_eta = True
    elif str(status.get("eta_note") or "").startswith("waiting for the upstream"):
        notes.append(str(status["eta_note"]))
        no_eta = True
    if drain.get("failed_objects"):
        notes.append(f"{drain['failed_objects']} failed")
    return ", ".join(notes), no_eta
