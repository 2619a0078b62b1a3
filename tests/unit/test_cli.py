"""gateway.cli and gateway.cli_status: formatting of the status table and the drain
progress (no gateway needed)."""

from __future__ import annotations

import argparse
import http.server
import io
import json
import threading
from pathlib import Path

import pytest

from gateway import cli, cli_status


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (5 << 20, "5.0 MiB"), (3 << 40, "3.0 TiB")],
)
def test_human_bytes(n: int, text: str) -> None:
    assert cli.human_bytes(n) == text


@pytest.mark.parametrize(
    ("s", "text"), [(None, "-"), (2.345, "2.3s"), (42, "42s"), (75, "1m15s"), (3725, "1h02m")]
)
def test_human_duration(s: float | None, text: str) -> None:
    assert cli.human_duration(s) == text


def _status(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "pending_objects": 3,
        "pending_bytes": 3 << 30,
        "flushing_objects": 1,
        "in_flight_sent_bytes": 12 << 20,
        "failed_objects": 2,
        "failed_bytes": 10,
        "held_objects": 1,
        "held_bytes": 4,
        "unflushed_objects": 6,
        "unflushed_bytes": (3 << 30) + 14,
        "flushed_objects": 10,
        "flushed_bytes": 2048,
        "oldest_pending_seconds": 75.0,
        "flush_state": "running",
        "flush_rate_bytes_per_s": float(1 << 30),
        "eta_seconds": 3.0,
        "eta_note": None,
        "cache_used_bytes": 1 << 30,
        "cache_capacity_bytes": 4 << 30,
        "throttled": 7,
        "last_error": "b/k: AccessDenied",
        "attention": [],
        "lanes": [
            {
                "bucket": "ckpts",
                "prefix": "run1/step_9/rank_0/",
                "pending_objects": 2,
                "pending_bytes": 2 << 30,
                "failed_objects": 1,
                "held_objects": 0,
                "in_flight": 1,
                "accepted_per_s": 12.5,
                "rate_limit_per_s": 875.5,
                "throttled_503": 4,
            },
            {
                "bucket": "ckpts",
                "prefix": "",
                "pending_objects": 1,
                "pending_bytes": 1 << 30,
                "failed_objects": 0,
                "held_objects": 1,
                "in_flight": 0,
                "accepted_per_s": 0,
                "rate_limit_per_s": 3500.0,
                "throttled_503": 0,
            },
        ],
    }
    doc.update(over)
    return doc


def test_format_status_totals_and_lane_rows() -> None:
    lines = cli_status.format_status(_status()).splitlines()
    assert lines[:14] == [
        "flush state       running",
        "pending           3 objects, 3.0 GiB (1 flushing, 12.0 MiB of it sent)",
        "failed            2 objects, 10 B",
        "held              1 commit markers, 4 B (behind failed objects)",
        "unflushed         6 objects, 3.0 GiB (not durable upstream yet)",
        "flushed           10 objects, 2.0 KiB",
        "flush rate        1.0 GiB/s, ETA 3.0s",
        "oldest unflushed  1m15s",
        "cache             1.0 GiB of 4.0 GiB (25%)",
        "503 throttles     7",
        "last error        b/k: AccessDenied",
        "",
        "bucket  prefix               objects    bytes  failed  held  in flight  req/s  limit/s"
        "  503s",
        "ckpts   run1/step_9/rank_0/        2  2.0 GiB       1     0          1   12.5    875.5"
        "     4",
    ]
    # The measured rate and the limit are separate columns: an idle lane shows 0 and its cap.
    assert lines[14].split() == ["ckpts", "/", "1", "1.0", "GiB", "0", "1", "0", "0", "3500", "0"]


def test_what_needs_an_operator_comes_first_with_its_command() -> None:
    attention = [
        {
            "state": "paused",
            "message": "flusher paused: nothing is uploaded",
            "command": "gateway resume",
        },
        {"state": "waiting", "message": "waiting for the upstream: refused", "command": None},
    ]
    lines = cli_status.format_status(_status(attention=attention)).splitlines()
    assert lines[:3] == [
        "PAUSED  flusher paused: nothing is uploaded -> run `gateway resume`",
        "WAITING waiting for the upstream: refused",
        "",
    ]


@pytest.mark.parametrize(
    ("over", "text"),
    [
        ({"flush_rate_bytes_per_s": 0.0, "eta_seconds": None,
          "eta_note": "flusher paused: `gateway resume`"},
         "0 B/s (no ETA: flusher paused: `gateway resume`)"),
        ({"flush_rate_bytes_per_s": 0.0, "eta_seconds": None,
          "eta_note": "waiting for the upstream: Could not connect"},
         "0 B/s (no ETA: waiting for the upstream: Could not connect)"),
        ({"pending_objects": 0, "pending_bytes": 0, "eta_seconds": 0.0}, "1.0 KiB/s"),
    ],
)  # fmt: skip
def test_format_status_gives_no_eta_when_none_can_be_given(
    over: dict[str, object], text: str
) -> None:
    doc = _status(flush_rate_bytes_per_s=1024.0, eta_seconds=9.0)
    assert f"flush rate        {text}\n" in cli_status.format_status({**doc, **over})


def test_format_status_of_an_older_gateway_uses_the_last_minute() -> None:
    old = {k: v for k, v in _status().items() if k not in ("flush_rate_bytes_per_s", "eta_seconds")}
    text = cli_status.format_status(old, rate_bytes_per_s=float(1 << 30))
    assert "flush rate        1.0 GiB/s over the last minute, ETA 3.0s\n" in text


def test_flush_rate_over_the_last_minute() -> None:
    samples = [
        {"t": 1000.0, "flushed_bytes": 0},
        {"t": 1030.0, "flushed_bytes": 100},  # outside the last 60 s of t=1100
        {"t": 1050.0, "flushed_bytes": 1000},
        {"t": 1100.0, "flushed_bytes": 6000},
    ]
    assert cli_status.flush_rate(samples) == pytest.approx(5000 / 50)
    assert cli_status.flush_rate(samples, span_s=1000) == pytest.approx(60.0)
    assert cli_status.flush_rate(samples[:1]) is None


def test_format_status_without_lanes() -> None:
    doc = _status(lanes=[], oldest_pending_seconds=None, last_error=None, held_objects=0)
    text = cli_status.format_status(doc)
    assert "oldest unflushed  -\n" in text
    assert "last error" not in text
    assert "held" not in text
    assert text.endswith("no lane has anything pending\n")


def test_drain_progress_rate_and_eta() -> None:
    p = cli.DrainProgress(started_s=0.0)
    p.update(0.0, 1000 << 20)
    assert p.eta_s() is None  # no rate yet
    assert "0% 1000.0 MiB left in 4 objects, -, ETA -" in p.line(4)
    p.update(2.0, 800 << 20)  # 100 MiB/s
    assert p.rate_bytes_per_s == 100 << 20
    assert p.eta_s() == pytest.approx(8.0)
    p.update(4.0, 800 << 20)  # stalled: the average decays, not to zero at once
    assert p.rate_bytes_per_s == pytest.approx(0.7 * (100 << 20))
    line = p.line(3, "flusher paused")
    assert line.startswith("[" + "#" * 6 + "-" * 24 + "]  20% 800.0 MiB left in 3 objects")
    assert line.endswith("70.0 MiB/s, ETA 11s (flusher paused)")
    p.no_eta = True  # the gateway says why there is none (paused, waiting for the upstream)
    assert p.eta_s() is None
    p.no_eta = False
    p.update(5.0, 0)
    assert p.eta_s() == 0.0
    assert p.line(0).startswith("[" + "#" * 30 + "] 100% 0 B left")


def test_drain_progress_rate_is_zero_once_nothing_moved_for_ten_seconds() -> None:
    p = cli.DrainProgress(started_s=0.0)
    p.update(0.0, 1000)
    p.update(1.0, 500)  # 500 B/s
    for t in range(2, 11):
        p.update(float(t), 500)
        assert p.rate_bytes_per_s is not None and p.rate_bytes_per_s > 0  # decaying
    p.update(11.0, 500)  # 10 s without a byte moving: 0, and no ETA
    assert p.rate_bytes_per_s == 0.0
    assert p.eta_s() is None
    assert p.line(1).endswith("0 B/s, ETA -")


def test_progress_sink_plain_lines_are_periodic() -> None:
    now = [0.0]
    out = io.StringIO()
    sink = cli.ProgressSink(out, "auto", lambda: now[0])  # StringIO is not a TTY
    assert sink.mode == "plain"
    for t in (0.0, 1.0, 9.0, 10.0, 12.0):
        now[0] = t
        sink.show(f"at {t}")
    sink.show("done", final=True)
    assert out.getvalue().splitlines() == ["at 0.0", "at 10.0", "done"]


def test_progress_sink_bar_redraws_in_place() -> None:
    out = io.StringIO()
    sink = cli.ProgressSink(out, "bar", lambda: 0.0)
    sink.show("one")
    sink.show("two", final=True)
    assert out.getvalue() == "\r\x1b[2Kone\r\x1b[2Ktwo\n"


def test_admin_token_from_flag_file_or_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    monkeypatch.delenv("GATEWAY_ADMIN_TOKEN", raising=False)
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN_FILE", str(token_file))
    monkeypatch.setenv("GATEWAY_ADMIN", "http://10.0.0.1:9001/")

    def args(**kw: object) -> argparse.Namespace:
        base = {"admin": None, "admin_token": None, "admin_token_file": None}
        return argparse.Namespace(**{**base, **kw})

    assert cli.AdminClient.from_args(args()) == cli.AdminClient("http://10.0.0.1:9001", "from-file")
    assert cli.AdminClient.from_args(args(admin_token="flag")).token == "flag"
    monkeypatch.delenv("GATEWAY_ADMIN_TOKEN_FILE")
    monkeypatch.setenv("GATEWAY_ADMIN_TOKEN", "from-env")
    assert cli.AdminClient.from_args(args(admin="http://x:1")) == cli.AdminClient(
        "http://x:1", "from-env"
    )
    with pytest.raises(cli.AdminError):
        cli.AdminClient.from_args(args(admin_token_file=str(token_file) + ".missing"))


def test_admin_client_sends_the_bearer_token() -> None:
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            body = json.dumps({"ok": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        client = cli.AdminClient(f"http://127.0.0.1:{server.server_port}", "s3cr3t")
        assert client.get("/admin/v1/status") == {"ok": "/admin/v1/status"}
    finally:
        server.shutdown()
        server.server_close()
    assert seen == ["Bearer s3cr3t"]
