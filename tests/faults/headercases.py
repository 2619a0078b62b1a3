"""Hostile stored headers, shared by the fuzz and fault suites (with fuzzcases.py).

Every header the gateway stores and sends upstream on flush (user metadata, Content-Type,
Expires, Cache-Control, Content-Disposition, Content-Encoding, Content-Language), crossed
with values an S3 client, a broken client or an older gateway's journal can hold: UTF-8 and
undecodable bytes, control characters, header injection, garbage and extreme dates, sizes.

- ``CASES``: every (field, value) pair, as text (what the journal stores: undecodable bytes
  are lone surrogates, as aiohttp decodes them with surrogateescape).
- ``header_values``: a Hypothesis strategy of further values of the same kinds.
- ``http_bytes`` / ``sign_raw``: how a case goes over the wire as raw bytes, signed with
  SigV4 over those exact bytes (botocore cannot sign undecodable values).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import urllib.parse
from dataclasses import dataclass

from harness import GATEWAY_ACCESS_KEY, GATEWAY_SECRET_KEY, REGION
from hypothesis import strategies as st

# Stored fields: "x-amz-meta-<name>" is user metadata; the rest are system headers.
FIELDS = (
    "x-amz-meta-a",
    "x-amz-meta-",  # an empty metadata name
    "x-amz-meta-café",  # a UTF-8 name (not an HTTP token)
    "x-amz-meta-a b",  # not an HTTP token
    "content-type",
    "expires",
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
)
VALUES = (
    "café",  # UTF-8 non-ASCII (botocore refuses it in metadata)
    "caf\udce9",  # latin-1 é: not valid UTF-8, a lone surrogate once decoded
    "\udcff\udcfe\udcc3",
    "😀 emoji",
    "line\u2028separator",
    "\ufeffbom",
    "nul\x00byte",
    "ctl\x01\x1f\x7fchars",
    "tab\tinside",
    "  padded  ",
    "",
    "m" * 1900,
    "=?UTF-8?B?Y2Fmw6k=?=",
    "a\r\nx-injected: 1",  # header injection (only a journal row can hold it)
    "garbage",
    "0",
    "-1",
    "99999999999999999999",
    "Fri, 31 Dec 9999 23:59:59 GMT",
    "Thu, 01 Jan 1970 00:00:00 GMT",
    "Mon, 32 Foo 2020 99:99:99 GMT",
)


@dataclass(frozen=True, slots=True)
class HeaderCase:
    field: str
    value: str

    @property
    def ident(self) -> str:
        """A short, printable id (a key suffix and a test id)."""
        digest = hashlib.sha256(f"{self.field}\n{self.value}".encode("utf-8", "surrogatepass"))
        name = "".join(c if (c.isascii() and c.isalnum()) or c == "-" else "_" for c in self.field)
        return f"{name}-{digest.hexdigest()[:10]}"

    @property
    def is_metadata(self) -> bool:
        return self.field.startswith("x-amz-meta-")

    def fields(self) -> dict[str, str]:
        """The case as ObjectMeta parts: ``user_metadata``, ``headers``, ``content_type``."""
        if self.is_metadata:
            return {"user_metadata": {self.field[11:]: self.value}}  # type: ignore[dict-item]
        if self.field == "content-type":
            return {"content_type": self.value}
        return {"headers": {self.field: self.value}}  # type: ignore[dict-item]


CASES = [HeaderCase(f, v) for f in FIELDS for v in VALUES]

# Further values of the same kinds: any code point (control characters, surrogates standing
# for undecodable bytes, non-BMP), or dates with a random day.
header_values = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=40),
    st.text(st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF), min_size=1, max_size=8),
    st.builds(
        "{}, {:02d} Dec 2030 00:00:00 GMT".format,
        st.text("MoTuXx", max_size=3),
        st.integers(-1, 99),
    ),
)


def http_bytes(text: str) -> bytes:
    """A stored value as the request bytes that produce it (aiohttp decodes surrogateescape)."""
    return text.encode("utf-8", "surrogateescape")


def is_utf8(text: str) -> bool:
    """Whether ``text`` holds no lone surrogate (an undecodable byte)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def can_send(case: HeaderCase) -> bool:
    """Whether http.client sends the case as one header (it refuses a bare CR or LF), and
    whether any request bytes produce it at all (a surrogate outside surrogateescape's
    range, such as U+D800, is no decoding of any byte)."""
    try:
        raw = http_bytes(case.field) + http_bytes(case.value)
    except UnicodeEncodeError:
        return False
    return b"\r" not in raw and b"\n" not in raw and b":" not in http_bytes(case.field)


def _key(secret: str, date: str) -> bytes:
    k = hmac.new(f"AWS4{secret}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (REGION, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def sign_raw(method: str, url: str, headers: dict[str, bytes], body: bytes) -> dict[bytes, bytes]:
    """SigV4 header auth over raw header bytes, canonicalised as S3 (and the gateway) do:
    names lower-cased, values with runs of whitespace folded. Returns every header to send
    (names and values as bytes, for ``http.client``'s ``putheader``)."""
    parts = urllib.parse.urlsplit(url)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    sha = hashlib.sha256(body).hexdigest()
    out = {
        "host": parts.netloc.encode(),
        "x-amz-date": now.encode(),
        "x-amz-content-sha256": sha.encode(),
        **{k.lower(): v for k, v in headers.items()},
    }
    names = sorted(out)

    def fold(value: bytes) -> str:
        return " ".join(value.decode("utf-8", "surrogateescape").split())

    canonical_headers = "".join(f"{n}:{fold(out[n])}\n" for n in names)
    canonical = "\n".join(
        [method, parts.path, parts.query, canonical_headers, ";".join(names), sha]
    )
    scope = f"{now[:8]}/{REGION}/s3/aws4_request"
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogateescape")).hexdigest()
    string_to_sign = f"AWS4-HMAC-SHA256\n{now}\n{scope}\n{digest}"
    signature = hmac.new(
        _key(GATEWAY_SECRET_KEY, now[:8]), string_to_sign.encode(), hashlib.sha256
    ).hexdigest()
    out["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={GATEWAY_ACCESS_KEY}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    ).encode("utf-8", "surrogateescape")
    return {http_bytes(n): v for n, v in out.items()}
