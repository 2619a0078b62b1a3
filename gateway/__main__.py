"""Command line: ``gateway serve``, ``status``, ``drain``, ``verify``."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from gateway import config

DEFAULT_ADMIN = "http://127.0.0.1:9001"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description="S3 write-back gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    config.add_arguments(serve)
    status = sub.add_parser("status", help="print the drain status")
    status.add_argument(
        "--admin", default=None, help=f"admin URL [env GATEWAY_ADMIN, default {DEFAULT_ADMIN}]"
    )
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    drain = sub.add_parser("drain", help="wait until acknowledged writes are durable upstream")
    drain.add_argument(
        "--admin", default=None, help=f"admin URL [env GATEWAY_ADMIN, default {DEFAULT_ADMIN}]"
    )
    drain.add_argument("--bucket", default=None)
    drain.add_argument("--prefix", default="")
    drain.add_argument("--wait", action="store_true", help="block until drained or timeout")
    drain.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (with --wait)")
    verify = sub.add_parser("verify", help="re-hash local bodies against the journal (scrub)")
    verify.add_argument("--data-dir", required=True, help="the gateway's data directory")
    args = parser.parse_args(argv)
    if args.command == "verify":
        from gateway.store.verify import run_cli

        return run_cli(args.data_dir)
    if args.command == "serve":
        return _serve(args)
    if args.command == "status":
        return _status(args)
    return _drain(args)


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args)
    except config.ConfigError as exc:
        sys.stderr.write(f"gateway: configuration error: {exc}\n")
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # The embedded demo upstream's per-request lines drown the gateway's own.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    import uvloop

    from gateway.app import serve

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(settings))
    return 0


def _admin_url(args: argparse.Namespace) -> str:
    import os

    return (args.admin or os.environ.get("GATEWAY_ADMIN") or DEFAULT_ADMIN).rstrip("/")


def _get(url: str, timeout_s: float) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        data: dict[str, Any] = json.loads(resp.read())
        return data


def _status(args: argparse.Namespace) -> int:
    try:
        data = _get(_admin_url(args) + "/admin/v1/status", 10)
    except (urllib.error.URLError, OSError) as exc:
        sys.stderr.write(f"gateway status: cannot reach the admin API: {exc}\n")
        return 1
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    rows = [
        ("flush state", data["flush_state"]),
        ("pending", f"{data['pending_objects']} objects, {data['pending_bytes']} bytes"),
        ("flushed", f"{data['flushed_objects']} objects, {data['flushed_bytes']} bytes"),
        ("failed", str(data["failed_objects"])),
        (
            "oldest pending",
            "-"
            if data["oldest_pending_seconds"] is None
            else f"{data['oldest_pending_seconds']:.1f}s",
        ),
        ("cache", f"{data['cache_used_bytes']} / {data['cache_capacity_bytes']} bytes"),
    ]
    out = [f"{name:<16}{value}" for name, value in rows]
    if data["lanes"]:
        out.append(f"\n{'bucket':<24}{'prefix':<32}{'objects':>10}{'bytes':>16}")
        out += [
            f"{lane['bucket']:<24}{lane['prefix'] or '/':<32}"
            f"{lane['pending_objects']:>10}{lane['pending_bytes']:>16}"
            for lane in data["lanes"]
        ]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def _drain(args: argparse.Namespace) -> int:
    query = {
        "wait": "true" if args.wait else "false",
        "timeout": str(args.timeout),
        "prefix": args.prefix,
    }
    if args.bucket:
        query["bucket"] = args.bucket
    url = _admin_url(args) + "/admin/v1/drain?" + urllib.parse.urlencode(query)
    try:
        data = _get(url, args.timeout + 30)
    except (urllib.error.URLError, OSError) as exc:
        sys.stderr.write(f"gateway drain: cannot reach the admin API: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(data) + "\n")
    return 0 if data.get("drained") else 3


if __name__ == "__main__":
    sys.exit(main())
