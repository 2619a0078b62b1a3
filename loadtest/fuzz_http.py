"""Long fuzz runs of the gateway's HTTP surface: the checks of tests/faults/fuzzcases.py
(keys of arbitrary bytes, Range values, mutated aws-chunked bodies, XML documents) with many
more hypothesis examples than CI runs, against a real gateway process and a moto upstream.

    .venv/bin/python loadtest/fuzz_http.py --examples 2000

Prints the number of cases each property ran; exits non-zero on the first violation (with
hypothesis's minimal failing example).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests" / "faults"), str(ROOT / "tests")]

from conftest import Sandbox, signed  # noqa: E402
from fuzzcases import (  # noqa: E402
    BUCKET,
    OBJECT,
    check_chunked,
    check_key,
    check_range,
    check_xml,
    key_bytes,
    mutations,
    payloads,
    range_values,
    xml_fragments,
)
from harness import GatewayProcess, start_moto, upstream_client  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

LIMITS = ["--max-xml-body", "64KiB", "--max-header-size", "8KiB"]


def run(examples: int, root: Path) -> dict[str, int]:
    moto, url = start_moto()
    upstream_client(url).create_bucket(Bucket=BUCKET)
    gw = GatewayProcess(root / "data", url, extra_args=LIMITS)
    gw.start()
    try:
        sandbox = Sandbox(gw, root)
        assert signed(gw, "PUT", f"/{BUCKET}/ranged", OBJECT).status == 200
        created = signed(gw, "POST", f"/{BUCKET}/fuzz-mpu?uploads").body
        upload_id = created.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
        return _properties(sandbox, upload_id, examples)
    finally:
        gw.stop()
        moto.stop()


def _properties(sandbox: Sandbox, upload_id: str, examples: int) -> dict[str, int]:
    gw = sandbox.gw
    counts: dict[str, int] = {}
    names = iter(range(10**9))
    props = {
        "keys": (key_bytes, lambda k: check_key(gw, k)),
        "ranges": (range_values, lambda v: check_range(gw, v)),
        "aws-chunked": (
            st.tuples(payloads, mutations),
            lambda dm: check_chunked(gw, dm[0], dm[1], f"chunked/{next(names)}"),
        ),
        "xml": (xml_fragments, lambda d: check_xml(gw, d, upload_id)),
    }
    config = settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    for name, (strategy, check) in props.items():
        counts[name] = 0
        started = time.monotonic()
        config(given(strategy)(_property(sandbox, name, check, counts)))()
        print(f"{name}: {counts[name]} cases in {time.monotonic() - started:.0f}s", flush=True)
    return counts


def _property(
    sandbox: Sandbox, name: str, check: Callable[[Any], None], counts: dict[str, int]
) -> Callable[[Any], None]:
    def prop(value: Any) -> None:
        check(value)
        ok = signed(sandbox.gw, "GET", f"/{BUCKET}/ranged")
        assert ok.status == 200 and ok.body == OBJECT
        sandbox.assert_contained()
        counts[name] += 1

    return prop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=1000, help="hypothesis examples each")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gw-fuzz-") as tmp:
        counts = run(args.examples, Path(tmp))
    print(f"total: {sum(counts.values())} cases, no violation")
    return 0


if __name__ == "__main__":
    sys.exit(main())
