"""gateway.logs: redaction, the text and JSON formats, and configure()."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from gateway import logs

SIG = "a" * 64
PRESIGNED_QUERY = (
    "X-Amz-Algorithm=AWS4-HMAC-SHA256"
    "&X-Amz-Credential=AKIDEXAMPLE%2F20261123%2Fus-east-1%2Fs3%2Faws4_request"
    "&X-Amz-Date=20261123T224000Z&X-Amz-Expires=3600&X-Amz-SignedHeaders=host"
    f"&X-Amz-Security-Token=FQoGZXIvYXdzEJr&X-Amz-Signature={SIG}"
)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    access, ours = logging.getLogger(logs.ACCESS_LOGGER), logging.getLogger("gateway")
    saved_access, saved_ours = access.level, ours.level
    # A library's loggers as a fresh gateway process finds them: another test in this
    # worker (an in-process client) may have set botocore's level, which made the tests
    # of debug and trace depend on the order the tests ran in.
    libraries = [logging.getLogger(n) for n in ("botocore", "botocore.endpoint")]
    saved_libraries = [(lg.level, lg.disabled) for lg in libraries]
    for lg in libraries:
        lg.setLevel(logging.NOTSET)
        lg.disabled = False
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])
    access.setLevel(saved_access)
    ours.setLevel(saved_ours)
    for lg, (level, disabled) in zip(libraries, saved_libraries, strict=True):
        lg.setLevel(level)
        lg.disabled = disabled


def test_redact_query_masks_secret_values_and_keeps_the_rest() -> None:
    out = logs.redact_query(PRESIGNED_QUERY + "&partNumber=3&uploadId=xyz")
    assert SIG not in out and "AKIDEXAMPLE" not in out and "FQoGZXIvYXdzEJr" not in out
    assert "X-Amz-Signature=REDACTED" in out
    assert "X-Amz-Credential=REDACTED" in out
    assert "X-Amz-Security-Token=REDACTED" in out
    assert "X-Amz-Date=20261123T224000Z" in out and "partNumber=3&uploadId=xyz" in out


def test_redact_query_masks_sigv2_presigned_parameters() -> None:
    out = logs.redact_query("AWSAccessKeyId=demo&Signature=zDhIK3Md%3D&Expires=1795477151")
    assert out == "AWSAccessKeyId=REDACTED&Signature=REDACTED&Expires=1795477151"


def test_redact_masks_urls_and_authorization_headers_in_free_text() -> None:
    header = (
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20261123/us-east-1/s3/aws4_request, "
        f"SignedHeaders=host;x-amz-date, Signature={SIG}"
    )
    text = logs.redact(f"GET /b/k?{PRESIGNED_QUERY} failed; Authorization: {header}")
    assert SIG not in text and "AKIDEXAMPLE" not in text
    assert "Authorization: REDACTED" in text
    assert logs.redact(f"Credential=AKIDEXAMPLE/x, Signature={SIG}") == (
        "Credential=REDACTED, Signature=REDACTED"
    )
    assert logs.redact("nothing secret here") == "nothing secret here"


def test_json_format_one_object_per_line_with_extras(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("info", "json", stream=stream)
    token = logs.REQUEST_ID.set("RID123")
    try:
        logging.getLogger("gateway.test").info("put %s?X-Amz-Signature=%s", "/b/k", SIG)
        logging.getLogger("gateway.test").debug("not at info")
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("gateway.test").exception("failed", extra={"bucket": "b"})
    finally:
        logs.REQUEST_ID.reset(token)
    logs.flush()  # lines are written by the log thread
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["level"] == "info" and first["logger"] == "gateway.test"
    assert first["msg"] == "put /b/k?X-Amz-Signature=REDACTED"
    assert first["request_id"] == "RID123"
    assert first["ts"].endswith("+00:00")
    assert second["bucket"] == "b" and second["level"] == "error"
    assert "ValueError: boom" in second["exc"]


def test_text_format_and_access_log_switch(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("warning", "text", access_log=True, stream=stream)
    logging.getLogger("gateway.x").info("hidden below warning")
    logging.getLogger("gateway.x").warning("Authorization: Bearer s3cr3t")
    logging.getLogger(logs.ACCESS_LOGGER).info('1.2.3.4 - - [x] "GET / HTTP/1.1" 200 0')
    logging.getLogger("aiohttp.access").info("raw aiohttp line with ?Signature=abc")
    logs.flush()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].endswith("WARNING gateway.x [-]: Authorization: REDACTED")
    assert lines[1] == '1.2.3.4 - - [x] "GET / HTTP/1.1" 200 0'

    stream = io.StringIO()
    logs.configure("info", "text", access_log=False, stream=stream)
    logging.getLogger(logs.ACCESS_LOGGER).info("an access line")
    logging.getLogger("gateway.x").info("kept")
    logs.flush()
    assert [line.split(": ", 1)[1] for line in stream.getvalue().splitlines()] == ["kept"]


def test_lines_are_written_off_the_calling_thread(restore_logging: None) -> None:
    """The loop never blocks on a log write: the stream is written by the log thread."""
    writers: list[str] = []

    class Recording(io.StringIO):
        def write(self, text: str) -> int:
            writers.append(threading.current_thread().name)
            return super().write(text)

    stream = Recording()
    logs.configure("info", "text", stream=stream)
    logging.getLogger(logs.ACCESS_LOGGER).info("%s %s", "GET", "/b/k")
    logs.flush()
    assert stream.getvalue() == "GET /b/k\n"
    assert writers and threading.current_thread().name not in writers


def test_debug_is_the_gateways_own(restore_logging: None) -> None:
    """--log-level debug traces this gateway (each version committed, each cross-node read's
    source); botocore would log every request's bytes, so the libraries stay at info."""
    stream = io.StringIO()
    logs.configure("debug", "text", stream=stream)
    logging.getLogger("gateway.core.peers").debug("read from b")
    logging.getLogger("botocore.endpoint").debug("a request's bytes")
    logging.getLogger("botocore.endpoint").info("kept")
    logs.flush()
    lines = stream.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == ["read from b", "kept"]


def test_trace_is_everyones(restore_logging: None) -> None:
    stream = io.StringIO()
    logs.configure("trace", "text", stream=stream)
    logging.getLogger("botocore.endpoint").debug("a request's bytes")
    logs.flush()
    assert (
        stream.getvalue().splitlines()[0].endswith("DEBUG botocore.endpoint [-]: a request's bytes")
    )
