"""Raw S3 requests for the cases a real SDK refuses to send: header values that are not
ASCII (or not even UTF-8), other transfer codings, odd ``Expect`` values.

The request is signed with botocore's SigV4 signer over its ordinary headers; the extra
``raw_headers`` are sent as exact bytes after signing (S3 does not require every header to
be signed, and botocore could not sign bytes that are not UTF-8).
"""

from __future__ import annotations

import http.client
import socket
from typing import Any

from harness import HttpResponse, sign_request


def signed_raw(
    gw: Any,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    headers: dict[str, str] | None = None,
    raw_headers: dict[str, bytes] | None = None,
    **sign_kwargs: Any,
) -> HttpResponse:
    """Send ``method path`` signed with the gateway's client credentials, plus raw headers."""
    req = sign_request(method, gw.endpoint + path, body=body, headers=headers, **sign_kwargs)
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        sent = {k.lower() for k in req.headers}
        for name, value in req.headers.items():
            conn.putheader(name, value)
        if "host" not in sent:
            conn.putheader("Host", f"127.0.0.1:{gw.port}")
        if "content-length" not in sent:
            conn.putheader("Content-Length", str(len(body)))
        for name, raw in (raw_headers or {}).items():
            conn.putheader(name, raw)
        conn.endheaders()
        if body:
            conn.send(body)
        resp = conn.getresponse()
        return HttpResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def raw_exchange(
    port: int, data: bytes, timeout_s: float = 30
) -> tuple[int, dict[str, str], bytes]:
    """Send exact request bytes on a new connection; (status, headers, body) of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()


def signed_head(gw: Any, method: str, path: str, body: bytes = b"", **kw: Any) -> bytes:
    """The request line and signed headers of a request, as bytes ending in the blank line
    minus its final CRLF (append more header lines, then ``\\r\\n`` and the body)."""
    req = sign_request(method, gw.endpoint + path, body=body, **kw)
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{gw.port}\r\n"
    for name, value in req.headers.items():
        if name.lower() not in ("host", "content-length"):
            head += f"{name}: {value}\r\n"
    return head.encode()
