"""Splitting a large single-PUT body into upstream multipart parts."""

from __future__ import annotations

import asyncio
import hashlib
import io
import random
from pathlib import Path

import pytest
from awscrt import checksums as crt_checksums
from hypothesis import given
from hypothesis import strategies as st

from gateway.flush.parts import FileWindow, part_size_bytes, split_parts
from gateway.store.integrity import BodyDigest
from gateway.upstream.classify import Corrupt

MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40


def _parts_needed(size: int, step: int) -> int:
    return -(-size // step)


@pytest.mark.parametrize(
    ("size", "step"),
    [
        (0, 16 * MiB),
        (1, 16 * MiB),
        (16 * MiB, 16 * MiB),
        (100 * GiB, 16 * MiB),
        (10_000 * 16 * MiB, 16 * MiB),  # exactly 10,000 parts of the minimum
        (10_000 * 16 * MiB + 1, 17 * MiB),
        (5 * TiB, 525 * MiB),
    ],
)
def test_part_size_examples(size: int, step: int) -> None:
    assert part_size_bytes(size) == step


@given(st.integers(min_value=0, max_value=5 * TiB))
def test_part_size_rules(size: int) -> None:
    step = part_size_bytes(size)
    assert step >= 16 * MiB
    assert step % MiB == 0
    assert _parts_needed(size, step) <= 10_000
    # And it is the smallest such size: one MiB less would need more parts (or be < 16 MiB).
    smaller = step - MiB
    assert smaller < 16 * MiB or _parts_needed(size, smaller) > 10_000


def test_part_size_for_five_tib() -> None:
    step = part_size_bytes(5 * TiB)
    assert _parts_needed(5 * TiB, step) == 9987


# -- FileWindow -----------------------------------------------------------------------------


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data"
    path.write_bytes(bytes(range(256)) * 4)  # 1024 bytes, every offset's value known
    return path


def test_file_window_reads_its_slice_only(data_file: Path) -> None:
    data = data_file.read_bytes()
    with data_file.open("rb") as f:
        window = FileWindow(f.fileno(), 100, 300)
        assert len(window) == 300
        assert window.readable() and window.seekable()
        assert window.read() == data[100:400]
        assert window.read() == b""
        assert window.tell() == 300


def test_file_window_seek_and_partial_reads(data_file: Path) -> None:
    data = data_file.read_bytes()
    with data_file.open("rb") as f:
        window = FileWindow(f.fileno(), 10, 50)
        assert window.read(5) == data[10:15]
        assert window.seek(10, io.SEEK_CUR) == 15
        assert window.read(5) == data[25:30]
        assert window.seek(-5, io.SEEK_END) == 45
        assert window.read(100) == data[55:60]
        assert window.seek(1000) == 50  # clamped to the window
        assert window.read(1) == b""
        assert window.seek(-1000) == 0
        assert window.read(3) == data[10:13]


def test_file_window_does_not_move_the_file_position(data_file: Path) -> None:
    with data_file.open("rb") as f:
        f.seek(7)
        FileWindow(f.fileno(), 500, 100).read()
        assert f.tell() == 7
        assert f.read(1) == bytes([7])


def test_file_windows_interleaved_are_independent(data_file: Path) -> None:
    data = data_file.read_bytes()
    with data_file.open("rb") as f:
        a = FileWindow(f.fileno(), 0, 512)
        b = FileWindow(f.fileno(), 512, 512)
        got_a, got_b = bytearray(), bytearray()
        for _ in range(64):
            got_a += a.read(8)
            got_b += b.read(8)
        assert bytes(got_a) == data[:512]
        assert bytes(got_b) == data[512:]


def test_file_window_past_end_of_file_reads_what_exists(data_file: Path) -> None:
    with data_file.open("rb") as f:
        window = FileWindow(f.fileno(), 1000, 100)  # the file has only 24 more bytes
        assert len(window.read()) == 24


# -- split_parts ----------------------------------------------------------------------------


def _body(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def _multipart_etag(pieces: list[bytes]) -> str:
    joined = b"".join(hashlib.md5(p).digest() for p in pieces)
    return f"{hashlib.md5(joined).hexdigest()}-{len(pieces)}"


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    data = _body(2 * 16 * MiB + 12_345)  # three parts: 16 MiB, 16 MiB, 12,345 bytes
    path = tmp_path_factory.mktemp("parts") / "blob"
    path.write_bytes(data)
    return path, data


async def test_split_parts_windows_cover_the_file_exactly(big_file: tuple[Path, bytes]) -> None:
    path, data = big_file
    with path.open("rb") as f:
        sources, _ = await split_parts(f, len(data))
        assert [s.size_bytes for s in sources] == [16 * MiB, 16 * MiB, 12_345]
        assert sum(s.size_bytes for s in sources) == len(data)
        for source in sources:
            assert source.body.tell() == 0  # rewound after hashing, ready to upload
        assert b"".join(s.body.read() for s in sources) == data
        assert f.tell() == 0


async def test_split_parts_md5s_and_etag_match_hashlib(big_file: tuple[Path, bytes]) -> None:
    path, data = big_file
    step = 16 * MiB
    pieces = [data[i : i + step] for i in range(0, len(data), step)]
    with path.open("rb") as f:
        sources, etag = await split_parts(f, len(data))
    assert [s.md5_hex for s in sources] == [hashlib.md5(p).hexdigest() for p in pieces]
    assert etag == _multipart_etag(pieces)
    assert etag.endswith("-3")


async def test_split_parts_checks_the_whole_body_in_the_same_read(
    big_file: tuple[Path, bytes],
) -> None:
    path, data = big_file
    crc = crt_checksums.crc32c(data)
    md5 = hashlib.md5(data).hexdigest()
    with path.open("rb") as f:
        sources, _ = await split_parts(f, len(data), require=BodyDigest(len(data), crc, md5))
        assert len(sources) == 3
        with pytest.raises(Corrupt, match=r"^local corruption: body CRC32C"):
            await split_parts(f, len(data), require=BodyDigest(len(data), crc ^ 1, md5))
        # A row from before CRC32C was stored: checked by MD5 in the same read.
        await split_parts(f, len(data), require=BodyDigest(len(data), None, md5))
        with pytest.raises(Corrupt, match=r"^local corruption: body MD5"):
            await split_parts(f, len(data), require=BodyDigest(len(data), None, "0" * 32))


async def test_split_parts_windows_read_concurrently(big_file: tuple[Path, bytes]) -> None:
    path, data = big_file
    step = 16 * MiB

    def read_all(window: FileWindow) -> bytes:
        out = bytearray()
        while piece := window.read(256 * 1024):
            out += piece
        return bytes(out)

    with path.open("rb") as f:
        sources, _ = await split_parts(f, len(data))
        got = await asyncio.gather(
            *(asyncio.to_thread(read_all, s.body) for s in sources)  # type: ignore[arg-type]
        )
    assert list(got) == [data[i : i + step] for i in range(0, len(data), step)]


async def test_split_parts_reread_after_a_retry(big_file: tuple[Path, bytes]) -> None:
    # A part that failed half-way is sent again from its start.
    path, data = big_file
    with path.open("rb") as f:
        sources, _ = await split_parts(f, len(data))
        last = sources[-1].body
        last.read(1000)
        last.seek(0)
        assert last.read() == data[2 * 16 * MiB :]


async def test_split_parts_of_a_body_exactly_one_part(tmp_path: Path) -> None:
    data = _body(16 * MiB)
    path = tmp_path / "one"
    path.write_bytes(data)
    with path.open("rb") as f:
        sources, etag = await split_parts(f, len(data))
    assert [s.size_bytes for s in sources] == [16 * MiB]
    assert etag == _multipart_etag([data])


async def test_split_parts_of_a_small_body(tmp_path: Path) -> None:
    path = tmp_path / "small"
    path.write_bytes(b"abc")
    with path.open("rb") as f:
        sources, etag = await split_parts(f, 3)
        assert [(s.size_bytes, s.md5_hex) for s in sources] == [
            (3, hashlib.md5(b"abc").hexdigest())
        ]
        assert sources[0].body.read() == b"abc"
    assert etag == _multipart_etag([b"abc"])
