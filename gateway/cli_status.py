"""``gateway status`` and the flusher's controls ``pause``, ``resume`` and ``retry``.

Like every admin command they use the standard library only (cli.py's ``AdminClient``).
Exit codes: 0 printed / done; 1 the admin API could not be reached or answered an error.

``gateway status`` starts with what needs an operator (the flusher paused, objects that
failed, the upstream accepting nothing), each with the command that resolves it, then the
totals: pending, failed and held are disjoint, unflushed is their sum; the flush rate is
measured (bytes in flight count, 0 when idle); lanes show their measured rate and their
limit in separate columns.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gateway.cli import (
    EXIT_OK,
    EXIT_UNREACHABLE,
    AdminClient,
    AdminError,
    admin_arguments,
    human_bytes,
    human_duration,
    table,
)

# Command -> (admin path, help).
CONTROLS = {
    "pause": ("/admin/v1/flush/pause", "stop starting uploads (those in flight finish)"),
    "resume": ("/admin/v1/flush/resume", "start uploading again after a pause"),
    "retry": ("/admin/v1/flush/retry", "make every failed object pending again"),
}
COMMANDS = ("status", *CONTROLS)


def add_arguments(sub: Any) -> None:
    """Register ``status``, ``pause``, ``resume`` and ``retry``."""
    status = sub.add_parser("status", help="print the drain status as a table")
    admin_arguments(status)
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    for name, (_, text) in CONTROLS.items():
        admin_arguments(sub.add_parser(name, help=text))


def run(args: argparse.Namespace) -> int:
    if args.command == "status":
        return run_status(args)
    return run_control(args)


def run_control(args: argparse.Namespace) -> int:
    """POST the control and say what it did: ``flusher paused``, ``3 failed objects are
    pending again``."""
    path, _ = CONTROLS[args.command]
    try:
        status, answer = AdminClient.from_args(args).request("POST", path)
    except AdminError as exc:
        sys.stderr.write(f"gateway {args.command}: cannot reach the admin API: {exc}\n")
        return EXIT_UNREACHABLE
    if status != 200:
        sys.stderr.write(f"gateway {args.command}: HTTP {status}: {answer}\n")
        return EXIT_UNREACHABLE
    if args.command == "retry":
        n = int(answer.get("retried_objects", 0))
        sys.stdout.write(f"{n} failed object{'s are' if n != 1 else ' is'} pending again\n")
    else:
        sys.stdout.write(f"flusher {answer.get('flush_state')}\n")
    return EXIT_OK


def run_status(args: argparse.Namespace) -> int:
    """``gateway status``: the table (or ``--json``); 1 when the admin API is unreachable."""
    try:
        admin = AdminClient.from_args(args)
        data = admin.status()
    except AdminError as exc:
        sys.stderr.write(f"gateway status: cannot reach the admin API: {exc}\n")
        return EXIT_UNREACHABLE
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return EXIT_OK
    rate = None
    if "flush_rate_bytes_per_s" not in data:  # an older gateway: its history's last minute
        try:
            rate = flush_rate(admin.get("/admin/v1/history")["samples"])
        except (AdminError, KeyError, TypeError):
            rate = None
    sys.stdout.write(format_status(data, rate))
    return EXIT_OK


def flush_rate(samples: list[dict[str, Any]], span_s: float = 60.0) -> float | None:
    """Bytes/s flushed over the last ``span_s`` of ``/admin/v1/history`` samples (oldest
    first); None with fewer than two samples in the span."""
    if len(samples) < 2:
        return None
    last = samples[-1]
    first = next((s for s in samples if last["t"] - s["t"] <= span_s), last)
    elapsed = float(last["t"]) - float(first["t"])
    if elapsed <= 0:
        return None
    return max(0.0, (int(last["flushed_bytes"]) - int(first["flushed_bytes"])) / elapsed)


def attention_lines(items: list[dict[str, Any]]) -> list[str]:
    """What needs an operator, one line each, in capitals first so that it cannot be
    missed: ``PAUSED  flusher paused: ... -> run `gateway resume```."""
    out = []
    for item in items:
        line = f"{str(item['state']).upper():<8}{item['message']}"
        if item.get("command"):
            line += f" -> run `{item['command']}`"
        out.append(line)
    return out


def format_status(data: dict[str, Any], rate_bytes_per_s: float | None = None) -> str:
    """The ``gateway status`` table: first what needs an operator (paused, failed, waiting
    for the upstream, each with the command that resolves it), then the totals (pending,
    failed and held are disjoint; unflushed is their sum) with the measured flush rate and
    the gateway's ETA (``rate_bytes_per_s``, the last minute's, only for a gateway too old
    to say), then one row per lane: its measured rate and its limit apart."""
    capacity = data.get("cache_capacity_bytes") or 0
    used = data.get("cache_used_bytes") or 0
    share = f" ({100 * used / capacity:.0f}%)" if capacity else ""
    out = attention_lines(data.get("attention") or [])
    if out:
        out.append("")
    rows = [
        ("flush state", str(data["flush_state"])),
        ("pending", _pending_text(data)),
        ("failed", f"{data['failed_objects']} objects, {human_bytes(data.get('failed_bytes', 0))}"),
    ]
    if data.get("held_objects"):
        held = f"{data['held_objects']} commit markers, {human_bytes(data.get('held_bytes', 0))}"
        rows.append(("held", held + " (behind failed objects)"))
    if "unflushed_objects" in data:
        unflushed = f"{data['unflushed_objects']} objects, {human_bytes(data['unflushed_bytes'])}"
        rows.append(("unflushed", unflushed + " (not durable upstream yet)"))
    rows += [
        ("flushed", f"{data['flushed_objects']} objects, {human_bytes(data['flushed_bytes'])}"),
        ("flush rate", _rate_text(data, rate_bytes_per_s)),
        ("oldest unflushed", human_duration(data["oldest_pending_seconds"])),
        ("cache", f"{human_bytes(used)} of {human_bytes(capacity)}{share}"),
        ("503 throttles", str(data.get("throttled", 0))),
    ]
    if data.get("last_error"):
        rows.append(("last error", str(data["last_error"])))
    out += [f"{name:<18}{value}" for name, value in rows]
    lanes = data.get("lanes") or []
    if lanes:
        header = ["bucket", "prefix", "objects", "bytes", "failed", "held", "in flight"]
        header += ["req/s", "limit/s", "503s"]
        cells = [
            [
                str(lane["bucket"]),
                str(lane["prefix"] or "/"),
                str(lane["pending_objects"]),
                human_bytes(lane["pending_bytes"]),
                str(lane.get("failed_objects", 0)),
                str(lane.get("held_objects", 0)),
                str(lane.get("in_flight", 0)),
                f"{lane.get('accepted_per_s', 0):g}",
                f"{lane.get('rate_limit_per_s', 0):g}",
                str(lane.get("throttled_503", 0)),
            ]
            for lane in lanes
        ]
        out += ["", *table(header, cells)]
    else:
        out += ["", "no lane has anything pending"]
    return "\n".join(out) + "\n"


def _pending_text(data: dict[str, Any]) -> str:
    """``3 objects, 3.0 GiB (1 flushing, 12.0 MiB of it sent)``."""
    text = f"{data['pending_objects']} objects, {human_bytes(data['pending_bytes'])}"
    notes = [f"{data['flushing_objects']} flushing"] if data.get("flushing_objects") else []
    if data.get("in_flight_sent_bytes"):
        notes.append(f"{human_bytes(data['in_flight_sent_bytes'])} of it sent")
    return text + (f" ({', '.join(notes)})" if notes else "")


def _rate_text(data: dict[str, Any], minute_rate: float | None) -> str:
    """``1.2 MiB/s, ETA 4.0s``: the measured rate (bytes in flight count; 0 when idle) and
    the gateway's ETA, or why there is none (``eta_note``: paused, waiting for the
    upstream, only failed objects left)."""
    if "flush_rate_bytes_per_s" not in data:  # an older gateway: its last minute's average
        if minute_rate is None:
            return "-"
        eta = data["pending_bytes"] / minute_rate if minute_rate > 0 else None
        text = f"{human_bytes(minute_rate)}/s over the last minute"
        return text + (f", ETA {human_duration(eta)}" if data["pending_bytes"] and eta else "")
    rate = data["flush_rate_bytes_per_s"]
    text = "-" if rate is None else f"{human_bytes(rate)}/s"
    if data.get("eta_note"):
        return text + f" (no ETA: {data['eta_note']})"
    eta = data.get("eta_seconds")
    if data.get("pending_bytes") and eta is not None:
        text += f", ETA {human_duration(eta)}"
    return text
