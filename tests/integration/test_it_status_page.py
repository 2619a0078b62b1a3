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

# The lane bar colour of status.html (#3b6fd8).
BAR_RGB = (0x3B, 0x6F, 0xD8)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail("chromium is missing in CI: .ci/run must install it (apt-get install chromium)")
    pytest.skip("chromium not installed (apt-get install chromium); CI installs it")


def _run_chromium(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
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
        "--window-size=1000,900",
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
    """A gateway with one failed object (13 bytes) and 1,000,000 bytes pending in two lanes,
    flusher paused. The failure: its bucket is deleted upstream before the flusher runs.
    Pending counts every object not yet durable upstream, the failed one included."""
    gw = gateway_factory()
    s3 = gw.client()
    doomed = bucket + "-gone"
    upstream.create_bucket(Bucket=doomed)
    with gw.flush_paused():
        s3.put_object(Bucket=doomed, Key="lost/object", Body=b"never arrives")
        upstream.delete_bucket(Bucket=doomed)
    for _ in range(600):  # NoSuchBucket is permanent: the object turns failed, not retried
        if gw.status()["failed_objects"] == 1:
            break
        gw.drain(timeout=0.1, wait=True)
    assert gw.status()["failed_objects"] == 1
    gw.pause_flush()
    s3.put_object(Bucket=bucket, Key="ckpt/step_3/rank_0/shard.pt", Body=payload(300_000, 1))
    s3.put_object(Bucket=bucket, Key="ckpt/step_3/rank_1/shard.pt", Body=payload(700_000, 2))
    return gw


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
    assert _text_of(dom, "pending-bytes") == "976.6 KiB"  # 1,000,013 bytes
    assert _text_of(dom, "pending-objects") == "3 objects (0 flushing)"
    assert _text_of(dom, "failed-objects") == "1"
    assert 'class="value bad" id="failed-objects"' in dom
    assert _text_of(dom, "flush-state") == "flusher paused"
    assert _text_of(dom, "eta") == "paused: no ETA"
    assert _text_of(dom, "rate") == "-"
    assert _text_of(dom, "error") == ""
    lanes = re.findall(r'<tr class="lane">(.*?)</tr>', dom)
    cells = [re.findall(r"<td[^>]*>([^<]*)", row) for row in lanes]
    assert [c[:4] for c in cells if c[0] == bucket] == [
        [bucket, "ckpt/step_3/rank_0/", "1", "293.0 KiB"],
        [bucket, "ckpt/step_3/rank_1/", "1", "683.6 KiB"],
    ]
    # The chart was drawn from the history endpoint: a polyline with real points.
    for line in ("rate-line", "pending-line"):
        points = re.search(rf'id="{line}"[^>]*points="([^"]+)"', dom)
        assert points and len(points.group(1).split()) >= 2, line


def test_status_page_screenshot_has_real_content(busy_gateway: Any, tmp_path: Path) -> None:
    shot = tmp_path / "status.png"
    _run_chromium(busy_gateway.admin + "/", tmp_path, f"--screenshot={shot}")
    width, height, pixels = _decode_png(shot.read_bytes())
    assert (width, height) == (1000, 900)
    colours = {pixels[i : i + 3] for i in range(0, len(pixels), 3)}
    assert len(colours) > 50, "the screenshot is (nearly) uniform"
    # The two lane bars are drawn: many pixels of their exact colour.
    bar = bytes(BAR_RGB)
    assert sum(1 for i in range(0, len(pixels), 3) if pixels[i : i + 3] == bar) > 500


def test_history_endpoint_samples_totals(busy_gateway: Any) -> None:
    doc = http_request("GET", busy_gateway.admin + "/admin/v1/history").json()
    assert doc["interval_seconds"] > 0
    last = doc["samples"][-1]
    assert last["pending_bytes"] == 1_000_013
    assert last["pending_objects"] == 3
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
    assert _text_of(dom, "flushed-objects") == "2 objects"
    assert _text_of(dom, "pending-objects") == "1 objects (0 flushing)"  # the failed one
    assert _text_of(dom, "flush-state") == "flusher running"
    # The rate of the current drain (since the resume: 0 B/s once a sample was taken after
    # it ended), not a minute's average; and no ETA for what only an operator can unstick.
    rate = _text_of(dom, "rate")
    assert rate.endswith("/s"), rate
    assert _text_of(dom, "eta") == "only failed objects left"
    # The chart's scale is the highest per-interval rate: non-zero once bytes flushed.
    assert _text_of(dom, "chart-max") not in ("-", "1 B/s")
