"""Small pure pieces behind the hostile-input handling."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.http_exceptions import BadHttpMessage, ContentLengthError, LineTooLong

from gateway.admin.auth import AdminTokenError, _is_authorized, is_loopback, resolve_admin_token
from gateway.errors import MetadataTooLarge
from gateway.s3.dispatch import check_header_section
from gateway.s3.metadata import user_metadata
from gateway.s3.server import parse_error
from gateway.s3.xml import error_document, xml_safe


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (LineTooLong("x", "8190"), "RequestHeaderSectionTooLarge"),
        (BadHttpMessage("Too many headers received"), "RequestHeaderSectionTooLarge"),
        (ContentLengthError("Not enough data"), "IncompleteBody"),
        (BadHttpMessage("Missing 'Host' header in request."), "BadRequest"),
        (None, "BadRequest"),
    ],
)
def test_parse_error_codes(exc: BaseException | None, code: str) -> None:
    assert parse_error(exc).code == code


def test_xml_safe_never_raises_on_lone_surrogates() -> None:
    assert xml_safe("a\udcfeb") == "a%FEb"
    assert xml_safe("\ud800") == "%ED%A0%80"
    assert xml_safe("nul\x00") == "nul%00"
    assert b"%FE" in error_document("C", "m", "r", {"Key": "\udcfe"})


def test_user_metadata_limit_is_2kb() -> None:
    assert user_metadata({"x-amz-meta-a": "v" * 2047}) == {"a": "v" * 2047}
    with pytest.raises(MetadataTooLarge):
        user_metadata({"x-amz-meta-a": "v" * 2048})


def test_header_section_limit() -> None:
    check_header_section([(b"a", b"b" * 99)], 100)
    with pytest.raises(Exception) as exc:
        check_header_section([(b"a", b"b" * 99), (b"c", b"")], 100)
    assert getattr(exc.value, "code", "") == "RequestHeaderSectionTooLarge"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("::", False),
        ("gateway.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_resolve_admin_token(tmp_path: Path) -> None:
    assert resolve_admin_token("127.0.0.1", None, None) is None
    assert resolve_admin_token("0.0.0.0", "t", None) == "t"
    token_file = tmp_path / "t"
    token_file.write_text(" from-file\n")
    assert resolve_admin_token("0.0.0.0", None, token_file) == "from-file"
    with pytest.raises(AdminTokenError):
        resolve_admin_token("0.0.0.0", None, None)
    token_file.write_text("\n")
    with pytest.raises(AdminTokenError):
        resolve_admin_token("127.0.0.1", None, token_file)
    with pytest.raises(AdminTokenError):
        resolve_admin_token("0.0.0.0", None, tmp_path / "missing")


def test_bearer_header_parsing() -> None:
    assert _is_authorized("Bearer tok", b"tok")
    assert _is_authorized("bearer  tok ", b"tok")
    assert not _is_authorized("Bearer tok2", b"tok")
    assert not _is_authorized("Basic tok", b"tok")
    assert not _is_authorized("tok", b"tok")
    assert not _is_authorized("", b"tok")
