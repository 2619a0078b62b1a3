"""``gateway checkpoints``: one place that says whether a checkpoint is safe.

Prints the checkpoint directories, newest first, each with its state in words (``writing``,
``complete on this node``, ``durable in the bucket``, ``held: <why>`` with the objects that
failed and the command that resolves it), its objects and bytes pending (failed and held
ones apart: a held commit marker is never shown as a pending row) and an ETA, from
``GET /admin/v1/checkpoints``. What needs an operator (the flusher paused, failed objects,
the upstream accepting nothing) comes first, as in ``gateway status``.

Without ``--bucket`` every bucket the gateway holds rows for is listed; without
``--prefix`` the roots are found from the journal's commit-marker rows (``ckpt/`` for
``ckpt/step_3/.metadata``; a bucket without any marker yet is listed from its root).

Exit codes (scripts rely on them):

- 0: printed (without ``--wait``); with ``--wait``: the newest complete checkpoint of every
  root listed is durable in the bucket;
- 1: the admin API could not be reached or answered an error;
- 3: ``--wait``: not durable when ``--timeout`` passed, or held behind failed objects
  (returned at once: waiting cannot help; ``gateway retry`` after fixing the cause can);
- 4: ``--wait``: no complete checkpoint under any root listed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.cli import (
    EXIT_NOT_DRAINED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    AdminClient,
    AdminError,
    admin_arguments,
    human_bytes,
    human_duration,
    table,
)
from gateway.cli_status import attention_lines

EXIT_TIMEOUT = EXIT_NOT_DRAINED  # 3
EXIT_NO_CHECKPOINT = 4
COMMANDS = ("checkpoints",)
_POLL_S = 1.0  # --wait polls this often
_WATCH_S = 2.0  # --watch redraws this often
_CLEAR = "\x1b[H\x1b[2J"


def add_arguments(sub: Any) -> None:
    parser = sub.add_parser(
        "checkpoints", help="checkpoint directories, newest first: which are safe, and when"
    )
    admin_arguments(parser)
    parser.add_argument("--bucket", default=None, help="only this bucket [default: every one]")
    parser.add_argument(
        "--prefix", default=None, help="where the checkpoints are [default: found from markers]"
    )
    parser.add_argument("--watch", action="store_true", help=f"redraw every {_WATCH_S:g}s")
    parser.add_argument(
        "--wait", action="store_true", help="until the newest complete checkpoint is durable"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds (with --wait) [default 300]"
    )
    parser.add_argument("--json", action="store_true", help="print the admin API's JSON")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What ``--wait`` concludes from one answer: an exit code and why, or keep waiting."""

    code: int | None  # None: not decided yet
    message: str


def verdict(doc: dict[str, Any]) -> Verdict:
    """Over every root: the newest complete checkpoint durable (0), held (3 at once),
    none at all (4), else not yet (None)."""
    newest = []
    for root in _roots(doc):
        found = next((c for c in root["checkpoints"] if c["complete"]), None)
        if found is not None:
            newest.append((root["bucket"], found))
    if not newest:
        return Verdict(EXIT_NO_CHECKPOINT, "no complete checkpoint")
    held = [(b, c) for b, c in newest if c["state"] == "held"]
    if held:
        b, c = held[0]
        return Verdict(EXIT_TIMEOUT, f"s3://{b}/{c['prefix']} is {c['state_text']}: {c['reason']}")
    waiting = [(b, c) for b, c in newest if not c["durable"]]
    if waiting:
        b, c = waiting[0]
        return Verdict(None, f"s3://{b}/{c['prefix']} is {c['state_text']}")
    names = ", ".join(f"s3://{b}/{c['prefix']}" for b, c in newest)
    return Verdict(EXIT_OK, f"{names}: durable in the bucket")


def format_checkpoints(doc: dict[str, Any]) -> str:
    """The table: what needs an operator first, the flusher's line, then per root its
    checkpoints newest first (a reason line under a held or failing one)."""
    flush = doc.get("flush") or {}
    out = attention_lines(flush.get("attention") or [])
    line = f"flusher {flush.get('flush_state', '?')}"
    if flush.get("flush_rate_bytes_per_s") is not None:
        line += f", {human_bytes(flush['flush_rate_bytes_per_s'])}/s"
    if flush.get("eta_note"):
        line += f" (no ETA: {flush['eta_note']})"
    out.append(line)
    roots = _roots(doc)
    if not roots:
        out += ["", "no bucket holds anything on this gateway"]
    for root in roots:
        out += ["", f"s3://{root['bucket']}/{root['prefix']}"]
        if root.get("upstream_error"):
            out.append(
                f"  the bucket cannot be listed ({root['upstream_error']}): only what this "
                "gateway holds is shown"
            )
        if not root["checkpoints"]:
            out.append("  no checkpoint directories")
            continue
        out += _rows(root["checkpoints"])
    return "\n".join(out) + "\n"


def _rows(checkpoints: list[dict[str, Any]]) -> list[str]:
    """``checkpoint  pending  failed  ETA  state``, the state in words last (left-aligned),
    and under a held or failing checkpoint the reason: which objects, which command."""
    header = ["checkpoint", "pending", "failed", "ETA"]
    cells = [
        [
            c["name"],
            _count(c["pending_objects"], c["pending_bytes"], c.get("sent_bytes", 0)),
            _count(c.get("failed_objects", 0), c.get("failed_bytes", 0)),
            "-" if c.get("eta_seconds") is None else human_duration(c["eta_seconds"]),
        ]
        for c in checkpoints
    ]
    lines = table(header, cells, left=3)
    width = max(len(line) for line in lines)
    out = [f"  {lines[0].ljust(width)}  state"]
    for c, line in zip(checkpoints, lines[1:], strict=True):
        out.append(f"  {line.ljust(width)}  {c.get('state_text', c.get('state', ''))}")
        if c.get("reason"):
            out.append(f"      {c['reason']}")
    return out


def _count(objects: int, size: int, sent: int = 0) -> str:
    if not objects:
        return "-"
    text = f"{objects} object{'s' if objects != 1 else ''}, {human_bytes(size)}"
    return text + (f" ({human_bytes(sent)} sent)" if sent else "")


def _roots(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-root documents, whether the answer is one root or ``{"roots": [...]}``."""
    return list(doc["roots"]) if "roots" in doc else [doc]


def fetch(admin: AdminClient, args: argparse.Namespace) -> dict[str, Any]:
    query = {name: value for name in ("bucket", "prefix") if (value := getattr(args, name))}
    if args.prefix == "":
        query["prefix"] = ""  # the bucket's root, given explicitly
    status, doc = admin.request("GET", "/admin/v1/checkpoints", query)
    if status != 200:
        raise AdminError(f"HTTP {status}: {doc.get('message', doc)}")
    return doc


def run(
    args: argparse.Namespace,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """One answer printed (0), or with ``--wait``/``--watch`` polled and redrawn until the
    verdict, the timeout, or Ctrl-C (``--watch`` alone: exit 0)."""
    try:
        admin = AdminClient.from_args(args)
        doc = fetch(admin, args)
        deadline_s = clock() + max(0.0, args.timeout)
        outcome = verdict(doc) if args.wait else None
        while args.watch or (outcome is not None and outcome.code is None):
            if args.watch:
                _show(doc, args, redraw=True)
            if outcome is not None and outcome.code is not None:
                break
            if args.wait and clock() >= deadline_s:
                break
            sleep(_WATCH_S if args.watch else _POLL_S)
            doc = fetch(admin, args)
            outcome = verdict(doc) if args.wait else None
    except AdminError as exc:
        sys.stderr.write(f"gateway checkpoints: cannot reach the admin API: {exc}\n")
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return EXIT_OK
    if not args.watch:
        _show(doc, args, redraw=False)
    if outcome is None:
        return EXIT_OK
    if outcome.code is None:
        sys.stderr.write(f"gateway checkpoints: timed out: {outcome.message}\n")
        return EXIT_TIMEOUT
    sys.stderr.write(f"gateway checkpoints: {outcome.message}\n")
    return outcome.code


def _show(doc: dict[str, Any], args: argparse.Namespace, *, redraw: bool) -> None:
    text = json.dumps(doc, indent=2) + "\n" if args.json else format_checkpoints(doc)
    if redraw and sys.stdout.isatty():
        text = _CLEAR + text
    elif redraw:
        text += "\n"
    sys.stdout.write(text)
    sys.stdout.flush()
