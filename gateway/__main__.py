"""Command line: ``gateway serve`` and ``gateway verify`` here; ``gateway drain`` in cli.py;
``gateway status``, ``pause``, ``resume`` and ``retry`` in cli_status.py; ``gateway
checkpoints`` in cli_checkpoints.py; ``gateway prefetch`` and ``gateway latest`` in
cli_restore.py.

Exit codes: 0 success; 1 admin API unreachable (every admin command) or damage found
(verify); 2 configuration error or start-up failure (serve: one line on stderr naming the
cause); 3 drain, prefetch or checkpoints --wait not finished by its timeout (checkpoints:
or held behind failed objects); 4 prefetch refused or incomplete, latest found no
checkpoint, checkpoints --wait found no complete checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from gateway import cli, cli_checkpoints, cli_fleet, cli_restore, cli_status, config, logs


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gateway", description="S3 write-back gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    config.add_arguments(serve)
    cli_status.add_arguments(sub)
    cli.add_arguments(sub)
    cli_checkpoints.add_arguments(sub)
    cli_restore.add_arguments(sub)
    cli_fleet.add_arguments(sub)
    verify = sub.add_parser("verify", help="re-hash local bodies against the journal (scrub)")
    verify.add_argument("--data-dir", required=True, help="the gateway's data directory")
    args = parser.parse_args(argv)
    if args.command == "verify":
        from gateway.store.verify import run_cli

        return run_cli(args.data_dir)
    if args.command == "serve":
        return _serve(args)
    if args.command in cli_status.COMMANDS:
        return cli_status.run(args)
    if args.command in cli_checkpoints.COMMANDS:
        return cli_checkpoints.run(args)
    if args.command in cli_restore.COMMANDS:
        return cli_restore.run(args)
    if args.command in cli_fleet.COMMANDS:
        return cli_fleet.run(args)
    return cli.run_drain(args)


def _serve(args: argparse.Namespace) -> int:
    try:
        settings = config.load(args)
    except config.ConfigError as exc:
        sys.stderr.write(f"gateway: configuration error: {exc}\n")
        return 2
    logs.configure(settings.log_level, settings.log_format, access_log=settings.access_log)
    # The embedded demo upstream's per-request lines drown the gateway's own.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    import uvloop

    from gateway.admin.auth import AdminTokenError
    from gateway.app import serve
    from gateway.s3.credentials import CredentialsError
    from gateway.startup import StartupError

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(settings))
    except (CredentialsError, AdminTokenError) as exc:
        # Read at start-up, after the flags were parsed: still a configuration error.
        logs.flush()  # the last line is the cause, after what was logged before it
        sys.stderr.write(f"gateway: configuration error: {exc}\n")
        return 2
    except StartupError as exc:  # everything it had started is undone by now
        logs.flush()
        sys.stderr.write(f"gateway: cannot start: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
