"""Small helpers shared by the third-party client tests (no fixtures here: see conftest)."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

from harness import upstream_objects

MiB = 1024 * 1024


def random_bytes(size: int, seed: int | str) -> bytes:
    """Deterministic pseudo-random bytes; fast enough for tens of MiB."""
    return random.Random(str(seed)).randbytes(size)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def multipart_etag(parts: list[bytes]) -> str:
    """The quoted ETag S3 gives a multipart object made of ``parts``."""
    digest = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest()
    return f'"{digest}-{len(parts)}"'


def split(data: bytes, part_size: int) -> list[bytes]:
    return [data[i : i + part_size] for i in range(0, len(data), part_size)]


def upstream_body(upstream: Any, bucket: str, key: str) -> tuple[str, bytes]:
    """(ETag, body) of an object read straight from the upstream bucket."""
    resp = upstream.get_object(Bucket=bucket, Key=key)
    return resp["ETag"], resp["Body"].read()


def upstream_keys(upstream: Any, bucket: str, prefix: str = "") -> list[str]:
    return sorted(upstream_objects(upstream, bucket, prefix))
