"""Operator commands of the fleet (docs/fleet.md): ``gateway fleet`` (the members as this
node sees them, and the commit markers held on them), ``gateway fleet forget NODE`` (a node
gone for good) and ``gateway release --bucket B --key K`` (publish a held commit marker now).

Exit codes: 0 done; 1 the admin API unreachable or an HTTP error; 4 nothing to act on (no
such held marker, no such member, no fleet).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gateway.cli import AdminClient, AdminError, human_bytes, human_duration

EXIT_OK, EXIT_UNREACHABLE, EXIT_NOTHING = 0, 1, 4
COMMANDS = ("fleet", "release")


def add_arguments(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--admin", default=None, help="admin URL [env GATEWAY_ADMIN]")
    common.add_argument("--admin-token", default=None, help="[env GATEWAY_ADMIN_TOKEN]")
    common.add_argument("--admin-token-file", default=None, help="[env GATEWAY_ADMIN_TOKEN_FILE]")
    fleet = sub.add_parser(
        "fleet", parents=[common], help="the fleet's members and held markers (with --peers)"
    )
    fleet.add_argument("action", nargs="?", choices=("status", "forget"), default="status")
    fleet.add_argument("node", nargs="?", help="forget: the node id to remove for good")
    fleet.add_argument("--json", action="store_true", help="print the raw JSON")
    release = sub.add_parser(
        "release", parents=[common], help="publish a held commit marker now (logged)"
    )
    release.add_argument("--bucket", required=True)
    release.add_argument("--key", required=True, help="the marker's key (e.g. ckpt/7/.metadata)")


def _post(admin: AdminClient, path: str, query: dict[str, str]) -> tuple[int, Any]:
    url = f"{admin.base_url}{path}?{urllib.parse.urlencode(query)}"
    request = urllib.request.Request(url, method="POST", data=b"")
    if admin.token:
        request.add_header("Authorization", f"Bearer {admin.token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read())
        except ValueError:
            return exc.code, {"message": str(exc)}
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise AdminError(f"{url.split('?')[0]}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    try:
        admin = AdminClient.from_args(args)
        if args.command == "release":
            return _release(admin, args.bucket, args.key)
        if args.action == "forget":
            if not args.node:
                sys.stderr.write("gateway fleet forget: give the node id to forget\n")
                return EXIT_NOTHING
            return _forget(admin, args.node)
        return _status(admin, args.json)
    except AdminError as exc:
        sys.stderr.write(f"gateway {args.command}: cannot reach the admin API: {exc}\n")
        return EXIT_UNREACHABLE


def _release(admin: AdminClient, bucket: str, key: str) -> int:
    status, body = _post(admin, "/admin/v1/markers/release", {"bucket": bucket, "key": key})
    if status == 200:
        sys.stdout.write(f"released {bucket}/{key}: it flushes now\n")
        return EXIT_OK
    sys.stderr.write(f"gateway release: {body.get('message', status)}\n")
    return EXIT_NOTHING if status == 404 else EXIT_UNREACHABLE


def _forget(admin: AdminClient, node: str) -> int:
    status, body = _post(admin, "/admin/v1/fleet/forget", {"node": node})
    if status == 200:
        sys.stdout.write(f"forgot {node}: markers stop waiting on it\n")
        return EXIT_OK
    sys.stderr.write(f"gateway fleet forget: {body.get('message', status)}\n")
    return EXIT_NOTHING if status == 404 else EXIT_UNREACHABLE


def _status(admin: AdminClient, as_json: bool) -> int:
    try:
        data = admin.get("/admin/v1/fleet")
    except AdminError as exc:
        if "404" in str(exc):
            sys.stderr.write("gateway fleet: this gateway has no peers (--peers)\n")
            return EXIT_NOTHING
        raise
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return EXIT_OK
    sys.stdout.write(format_fleet(data))
    return EXIT_OK


def format_fleet(data: dict[str, Any]) -> str:
    """The members as a table, then the held markers with what they wait on."""
    lines = [f"this node: {data['node']} (data dir {data['datadir_id']})", ""]
    rows = [["node", "state", "address", "unreachable", "last error"]]
    for m in data["members"]:
        away = m.get("unreachable_seconds")
        rows.append(
            [
                str(m["node"]),
                str(m["state"]),
                str(m["address"]),
                "-" if away is None else human_duration(away),
                str(m.get("last_error") or ""),
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if len(rows) == 1:
        lines.append("(no other member known yet)")
    replicas = data.get("replicas")
    if replicas:
        lines += ["", f"replicas: {replicas['copies']} per write ({replicas['policy']})"]
        for h in replicas.get("held_for") or []:
            lost = " (lost: being taken over)" if h.get("writer_lost") else ""
            lines.append(
                f"  held for {h['writer']}: {h['objects']} objects, {human_bytes(h['bytes'])}{lost}"
            )
        for r in replicas.get("remaking") or []:
            how = "back empty" if r.get("wiped") else "silent"
            lines.append(
                f"  re-replicating what {r['holder']} held ({how}): {r['sent']} versions sent"
            )
    lines += _shares(data.get("shares"), data["node"])
    held = data.get("held_markers") or []
    lines.append("")
    if held:
        lines.append("held commit markers (`gateway release --bucket B --key K` publishes one):")
        lines += [f"  {h['bucket']}/{h['key']}: waiting on {h['waiting_on']}" for h in held]
    else:
        lines.append("no commit marker is held by the fleet")
    return "\n".join(lines) + "\n"


def _shares(shares: dict[str, Any] | None, me: str) -> list[str]:
    """Who sends to which bucket, requests/s each (flush/shares.py), and what this node
    took over from members that stopped."""
    if not shares:
        return []
    sending: dict[str, dict[str, float]] = {
        b: dict(rates) for b, rates in (shares.get("peers") or {}).items()
    }
    for bucket, rate in (shares.get("mine") or {}).items():
        sending.setdefault(bucket, {})[me] = rate
    lines = ["", "sending to the bucket (requests/s got through, each member's last report):"]
    for bucket in sorted(sending):
        rates = sending[bucket]
        each = ", ".join(f"{node} {rate:g}" for node, rate in sorted(rates.items()))
        lines.append(f"  {bucket}: {sum(rates.values()):g} ({each})")
    if len(lines) == 2:
        lines.append("  (nothing)")
    if shares.get("handovers"):
        lines.append(
            f"  taken over from members that stopped: {shares['taken_per_s']:g}/s in "
            f"{shares['handovers']} hand-overs"
        )
    if shares.get("cuts_followed"):
        lines.append(
            f"  cuts followed (a member sending to the bucket was throttled): "
            f"{shares['cuts_followed']}"
        )
    return lines
