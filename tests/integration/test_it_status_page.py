"""The admin status page in a real headless browser (Debian's chromium).

The page is static HTML whose script polls the admin JSON API; these tests load it in
chromium with a virtual-time budget (the polling timers run, the network is real), dump
the DOM and take a screenshot, and check the live figures against what was written.

Without chromium the test is skipped locally and fails in CI (``CI`` set): .ci/run installs
it with apt-get.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest
from harness import http_request, payload

# The lane bar colour of status.html (#3b6fd8), and the failed banner's background (#fde8e6).
BAR_RGB = (0x3B, 0x6F, 0xD8)
FAILED_RGB = (0xFD, 0xE8, 0xE6)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is missing in CI: .ci/run must install it (apt-get install chromium)")
    pytest.skip("chromium not installed (apt-get install chromium); CI installs it")


def _run_chromium(
    url: str, tmp_path: Path, *extra: str, height: int = 900
) -> subprocess.CompletedProcess[str]:
    cmd = [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--virtual-time-budget=5000",
        f"--window-size=1000,{height}",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


def _text_of(dom: str, element_id: str) -> str:
    m = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert m, f"no element #{element_id} in the DOM"
    return m.group(1)


@pytest.fixture
def busy_gateway(gateway_factory: Any, upstream: Any, bucket: str) -> Any:
    """A gateway with one failed object (13 bytes) holding a commit marker (4 bytes) back,
    and 1,000,000 bytes pending in two lanes of a complete checkpoint, flusher paused. The
    failure: its bucket is deleted upstream before the flusher runs. Pending, failed and
    held are disjoint: 2 pending objects, 1 failed, 1 held."""
    gw = gateway_factory()
    s3 = gw.client()
    doomed = bucket + "-gone"
    upstream.create_bucket(Bucket=doomed)
    with gw.flush_paused():
        s3.put_object(Bucket=doomed, Key="lost/step_1/object", Body=b"never arrives")
        s3.put_object(Bucket=doomed, Key="lost/step_1/.metadata", Body=b"meta")
        upstream.delete_bucket(Bucket=doomed)
    for _ in range(600):  # NoSuchBucket is permanent: the object turns failed, not retried
        if gw.status()["held_objects"] == 1:
            break
        gw.drain(timeout=0.1, wait=True)
    assert gw.status()["failed_objects"] == 1
    gw.pause_flush()
    s3.put_object(Bucket=bucket, Key="ckpt/step_3/rank_0/shard.pt", Body=payload(300_000, 1))
    s3.put_object(Bucket=bucket, Key="ckpt/step_3/rank_1/shard.pt", Body=payload(700_000, 2))
    s3.put_object(Bucket=bucket, Key="ckpt/step_3/.metadata", Body=b"m3")
    return gw


def _checkpoint_rows(dom: str) -> list[list[str]]:
    rows = re.findall(r'<tr class="checkpoint"[^>]*>(.*?)</tr>', dom)
    return [re.findall(r"<td[^>]*>([^<]*)", row) for row in rows]


def test_status_page_shows_live_pending_lanes_and_failures(
    busy_gateway: Any, bucket: str, tmp_path: Path
) -> None:
    gw = busy_gateway
    page = http_request("GET", gw.admin + "/")
    assert page.status == 200
    assert page.header("content-type").startswith("text/html")
    assert b"http://" not in page.body and b"https://" not in page.body  # nothing external

    dom = _run_chromium(gw.admin + "/", tmp_path, "--dump-dom").stdout
    assert 'data-loaded="true"' in dom, dom[:2000]
    # Paused and failed first, prominent, each with the command that resolves it.
    banner = re.search(r'<div id="banner">(.*?)</div></div>', dom)
    assert banner, dom[:3000]
    assert '<div class="paused" data-state="paused">PAUSED: flusher paused' in banner.group(1)
    assert "<code>gateway resume</code>" in banner.group(1)
    assert '<div class="failed" data-state="failed">FAILED: 1 object failed permanently' in (
        banner.group(1)
    )
    assert "<code>gateway retry</code>" in banner.group(1)
    # The checkpoints at the top: states in words; the held marker is not a pending row.
    assert _checkpoint_rows(dom) == [
        [bucket, "ckpt/step_3/", "complete on this node", "3 objects, 976.6 KiB", "-", "-"],
        [bucket + "-gone", "lost/step_1/",
         "held: its commit marker waits behind 1 object that failed", "-", "1 object, 13 B", "-"],
    ]  # fmt: skip
    assert "failed: lost/step_1/object (NoSuchBucket" in dom
    assert _text_of(dom, "pending-bytes") == "976.6 KiB"  # 1,000,002 bytes: 2 shards, a marker
    assert _text_of(dom, "pending-objects") == "3 objects (0 flushing)"
    assert _text_of(dom, "failed-objects") == "1"
    assert _text_of(dom, "held-objects") == "1 commit markers held behind them"
    assert 'class="value bad" id="failed-objects"' in dom
    assert _text_of(dom, "flush-state") == "flusher paused"
    assert _text_of(dom, "eta") == "no ETA: flusher paused: `gateway resume`"
    assert _text_of(dom, "rate") == "0 B/s"
    assert _text_of(dom, "error") == ""
    lanes = re.findall(r'<tr class="lane">(.*?)</tr>', dom)
    cells = [re.findall(r"<td[^>]*>([^<]*)", row) for row in lanes]
    # objects, bytes, (bar), failed, held, in flight, measured req/s, limit/s, 503s
    assert [c for c in cells if c[0] == bucket] == [
        [bucket, "ckpt/step_3/", "1", "2 B", "", "0", "0", "0", "0", "3500", "0"],
        [bucket, "ckpt/step_3/rank_0/", "1", "293.0 KiB", "", "0", "0", "0", "0", "3500", "0"],
        [bucket, "ckpt/step_3/rank_1/", "1", "683.6 KiB", "", "0", "0", "0", "0", "3500", "0"],
    ]
    [gone] = [c for c in cells if c[0] == bucket + "-gone"]
    assert gone[1:4] == ["lost/step_1/", "0", "0 B"] and gone[5:7] == ["1", "1"]
    # The chart was drawn from the history endpoint: a polyline with real points, under a
    # title that says the span its samples cover (not a fixed "15 minutes").
    for line in ("rate-line", "pending-line"):
        points = re.search(rf'id="{line}"[^>]*points="([^"]+)"', dom)
        assert points and len(points.group(1).split()) >= 2, line
    title = _text_of(dom, "chart-title")
    assert re.fullmatch(r"Flush rate over the last \d+s \(up to 15m00s are kept\)", title), title


def test_status_page_screenshot_has_real_content(busy_gateway: Any, tmp_path: Path) -> None:
    shot = tmp_path / "status.png"
    _run_chromium(busy_gateway.admin + "/", tmp_path, f"--screenshot={shot}", height=1500)
    width, height, pixels = _decode_png(shot.read_bytes())
    assert (width, height) == (1000, 1500)
    colours = {pixels[i : i + 3] for i in range(0, len(pixels), 3)}
    assert len(colours) > 50, "the screenshot is (nearly) uniform"

    def count(rgb: tuple[int, int, int], rows: range) -> int:
        want = bytes(rgb)
        return sum(
            1
            for y in rows
            for i in range(y * width * 3, (y + 1) * width * 3, 3)
            if pixels[i : i + 3] == want
        )

    # The failed banner is prominent: a wide band of its colour near the top of the page.
    assert count(FAILED_RGB, range(0, 250)) > 20_000
    # The lane bars are drawn: many pixels of their exact colour.
    assert count(BAR_RGB, range(height)) > 500


def test_history_endpoint_samples_totals(busy_gateway: Any) -> None:
    doc = http_request("GET", busy_gateway.admin + "/admin/v1/history").json()
    assert doc["interval_seconds"] > 0 and doc["kept_seconds"] == 900
    last = doc["samples"][-1]
    assert last["unflushed_bytes"] == 1_000_002 + 13 + 4  # everything not durable yet
    assert last["unflushed_objects"] == 5
    assert last["paused"] is True
    times = [s["t"] for s in doc["samples"]]
    assert times == sorted(times)


def _decode_png(data: bytes) -> tuple[int, int, bytes]:
    """RGB bytes of an 8-bit RGB or RGBA, non-interlaced PNG (what chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        header = body if kind == b"IHDR" else header
        idat += body if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour_type in (2, 6) and interlace == 0
    channels = 3 if colour_type == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytearray] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        _unfilter(kind, line, prev, channels)
        rows.append(line)
        prev = line
    rgb = bytearray()
    for line in rows:
        for x in range(width):
            rgb += line[x * channels : x * channels + 3]
    return width, height, bytes(rgb)


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> None:
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + a) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + b) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (a + b) // 2) & 0xFF
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            line[i] = (line[i] + pred) & 0xFF


def test_status_page_shows_the_flush_rate_after_flushing(
    busy_gateway: Any, bucket: str, tmp_path: Path
) -> None:
    gw = busy_gateway
    gw.resume_flush()
    gw.drained(bucket=bucket)
    dom = _run_chromium(gw.admin + "/", tmp_path, "--dump-dom").stdout
    assert _text_of(dom, "flushed-bytes") == "976.6 KiB"
    assert _text_of(dom, "flushed-objects") == "3 objects"
    assert _text_of(dom, "pending-objects") == "0 objects (0 flushing)"  # failed/held apart
    assert _text_of(dom, "flush-state") == "flusher running"
    # The rate measured over the last 10 s (non-zero right after the drain; it decays to 0),
    # and no ETA for what only an operator can unstick.
    rate = _text_of(dom, "rate")
    assert rate.endswith("/s") and rate != "0 B/s", rate
    assert _text_of(dom, "eta") == (
        "no ETA: only failed objects are left: fix the cause, then `gateway retry`"
    )
    assert "PAUSED" not in dom and "FAILED: 1 object failed permanently" in dom
    rows = _checkpoint_rows(dom)
    assert rows[0] == [bucket, "ckpt/step_3/", "durable in the bucket", "-", "-", "-"]
    # The chart's scale is the highest per-interval rate: non-zero once bytes flushed.
    assert _text_of(dom, "chart-max") not in ("-", "1 B/s")


def test_status_page_shows_the_fleet_and_what_a_held_marker_waits_on(
    moto_server: str, bucket: str, tmp_path: Path
) -> None:
    from fleetutil import fleet_of, until, wait_joined

    a, b = fleet_of(tmp_path / "fleet", moto_server, ("a", "b"))
    try:
        a.start()
        b.start()
        wait_joined([a, b], ("a", "b"))
        b.pause_flush()
        b.client().put_object(Bucket=bucket, Key="ck/1/shard_b", Body=b"on b")
        a.client().put_object(Bucket=bucket, Key="ck/1/.metadata", Body=b"meta")
        b.kill()
        until(lambda: "unreachable" in str(a.admin_get("/admin/v1/fleet")["held_markers"]))
        dom = _run_chromium(f"{a.admin}/", tmp_path, "--dump-dom").stdout
        rows = re.findall(r"<table id=\"fleet\">.*?<tbody>(.*?)</tbody>", dom, re.S)
        assert rows and ">b<" in rows[0] and ">unreachable<" in rows[0], rows
        note = _text_of(dom, "fleet-note")
        assert note.startswith("this node: a · 1 other gateways · HELD:"), note
        assert f"{bucket}/ck/1/.metadata waiting on b: unreachable for" in note
    finally:
        a.stop()
        b.stop()
