"""Operator commands for restarts: ``gateway prefetch`` and ``gateway latest``.

Like ``status`` and ``drain`` (cli.py) they talk to a running gateway's admin API with the
standard library only, so an init container of the gateway's image can run them. Exit
codes (scripts rely on them):

- 0: ``prefetch`` started (or, with ``--wait``, finished with every object local);
  ``latest`` printed a checkpoint.
- 1: the admin API could not be reached or answered an unexpected error.
- 3: ``prefetch --wait`` timed out (the prefetch goes on in the gateway).
- 4: ``prefetch`` was refused (the prefix does not fit in the cache) or finished with
  objects it could not fetch; ``latest`` found no complete (``--durable``: durable)
  checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from gateway.cli import (
    DEFAULT_ADMIN,
    EXIT_NOT_DRAINED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    AdminClient,
    AdminError,
    ProgressSink,
    human_bytes,
    human_duration,
)

EXIT_TIMEOUT = EXIT_NOT_DRAINED  # 3, as ``drain`` uses it
EXIT_REFUSED = 4
COMMANDS = ("prefetch", "latest")
_POLL_S = 0.5
_BAR_WIDTH = 30


def add_arguments(sub: Any) -> None:
    """Register ``prefetch`` and ``latest`` on an argparse sub-parsers object."""
    prefetch = sub.add_parser("prefetch", help="pull every object under a prefix into the cache")
    latest = sub.add_parser("latest", help="print the newest complete checkpoint under a prefix")
    for parser in (prefetch, latest):
        parser.add_argument("--admin", default=None, help=f"admin URL [default {DEFAULT_ADMIN}]")
        parser.add_argument("--admin-token", default=None, help="bearer token for the admin API")
        parser.add_argument("--admin-token-file", default=None, help="file holding that token")
        parser.add_argument("--bucket", required=True)
        parser.add_argument("--prefix", default="")
        parser.add_argument("--json", action="store_true", help="print the raw JSON answer")
    prefetch.add_argument("--wait", action="store_true", help="block until it finished")
    prefetch.add_argument("--timeout", type=float, default=3600.0, help="seconds (with --wait)")
    prefetch.add_argument(
        "--progress",
        choices=("auto", "bar", "plain", "none"),
        default="auto",
        help="progress on stderr: bar on a TTY, plain lines otherwise (auto)",
    )
    latest.add_argument(
        "--durable", action="store_true", help="only a checkpoint already whole in the bucket"
    )


def run(args: argparse.Namespace) -> int:
    if args.command == "prefetch":
        return run_prefetch(args)
    return run_latest(args)


def call(
    admin: AdminClient, method: str, path: str, query: dict[str, str], timeout_s: float = 60
) -> tuple[int, dict[str, Any]]:
    """One admin request: (HTTP status, JSON body), error statuses included. Raises
    AdminError when nothing (or no JSON) came back."""
    url = f"{admin.base_url}{path}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    if admin.token:
        request.add_header("Authorization", f"Bearer {admin.token}")
    try:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AdminError(f"{url.split('?')[0]}: {exc}") from exc


def progress_line(job: dict[str, Any], rate_bytes_per_s: float | None) -> str:
    """``[####------] 42% 1.2 GiB of 3.0 GiB, 12 of 64 objects, 300.0 MiB/s, ETA 4s``."""
    total, done = int(job["bytes_total"]), int(job["bytes_done"])
    share = 1.0 if total == 0 else done / total
    filled = round(share * _BAR_WIDTH)
    rate = "-" if rate_bytes_per_s is None else human_bytes(rate_bytes_per_s) + "/s"
    eta = (total - done) / rate_bytes_per_s if rate_bytes_per_s else None
    text = (
        f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {share * 100:3.0f}% "
        f"{human_bytes(done)} of {human_bytes(total)}, {job['objects_done']} of "
        f"{job['objects_total']} objects, {rate}, ETA {human_duration(eta)}"
    )
    if job.get("objects_failed"):
        text += f" ({job['objects_failed']} failed)"
    return text


def run_prefetch(args: argparse.Namespace, clock: Callable[[], float] = time.monotonic) -> int:
    query = {"bucket": args.bucket, "prefix": args.prefix}
    try:
        admin = AdminClient.from_args(args)
        status, job = call(admin, "POST", "/admin/v1/prefetch", query)
        if status == 507:
            sys.stderr.write(f"gateway prefetch: refused: {job.get('message')}\n")
            return EXIT_REFUSED
        if status != 202:
            sys.stderr.write(f"gateway prefetch: HTTP {status}: {job.get('message', job)}\n")
            return EXIT_UNREACHABLE
        if args.wait:
            job = _wait(admin, query, job, args, clock)
    except AdminError as exc:
        sys.stderr.write(f"gateway prefetch: cannot reach the admin API: {exc}\n")
        return EXIT_UNREACHABLE
    sys.stdout.write(json.dumps(job) + "\n")
    if not args.wait:
        return EXIT_OK
    if not job["done"]:
        return EXIT_TIMEOUT
    for failure in job.get("failures", []):
        sys.stderr.write(f"gateway prefetch: not fetched: {failure['key']}: {failure['error']}\n")
    return EXIT_OK if job["state"] == "done" else EXIT_REFUSED


def _wait(
    admin: AdminClient,
    query: dict[str, str],
    job: dict[str, Any],
    args: argparse.Namespace,
    clock: Callable[[], float],
) -> dict[str, Any]:
    """Poll until the prefetch is done or ``--timeout`` passes; progress on stderr."""
    sink = ProgressSink(sys.stderr, args.progress, clock)
    started_s = clock()
    first_bytes = int(job["bytes_done"])
    while not job["done"] and clock() - started_s < args.timeout:
        elapsed_s = clock() - started_s
        rate = (int(job["bytes_done"]) - first_bytes) / elapsed_s if elapsed_s > 1 else None
        sink.show(progress_line(job, rate))
        time.sleep(_POLL_S)
        status, job = call(admin, "GET", "/admin/v1/prefetch", query)
        if status != 200:
            raise AdminError(f"prefetch progress: HTTP {status}: {job.get('message', job)}")
    elapsed_s = max(clock() - started_s, 1e-9)
    rate = (int(job["bytes_done"]) - first_bytes) / elapsed_s
    verdict = job["state"] if job["done"] else "timed out"
    sink.show(f"{progress_line(job, rate)} ({verdict})", final=True)
    return job


def run_latest(args: argparse.Namespace) -> int:
    query = {"bucket": args.bucket, "prefix": args.prefix}
    try:
        admin = AdminClient.from_args(args)
        status, answer = call(admin, "GET", "/admin/v1/checkpoints", query)
    except AdminError as exc:
        sys.stderr.write(f"gateway latest: cannot reach the admin API: {exc}\n")
        return EXIT_UNREACHABLE
    if status != 200:
        sys.stderr.write(f"gateway latest: HTTP {status}: {answer.get('message', answer)}\n")
        return EXIT_UNREACHABLE
    if args.json:
        sys.stdout.write(json.dumps(answer, indent=2) + "\n")
    found = answer["latest_durable" if args.durable else "latest_complete"]
    if found is None:
        kind = "durable" if args.durable else "complete"
        where = f"s3://{args.bucket}/{answer['prefix']}"
        sys.stderr.write(f"gateway latest: no {kind} checkpoint under {where}\n")
        return EXIT_REFUSED
    if not args.json:
        sys.stdout.write(found + "\n")
    return EXIT_OK
