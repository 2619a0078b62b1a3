"""The peer client: the only module that speaks to other gateways (an edge, like
``upstream/``). HTTP to their peer API (``api.py``) on their S3 listeners, every request
signed with the fleet secret (``auth.py``), every call with a deadline; any failure is a
``PeerUnavailable`` (or, for a read, the peer's S3 error as ``PeerError``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import urllib.parse
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp
import yarl

from gateway.clock import Clock
from gateway.fleet import auth
from gateway.fleet.transport import (
    AttributesPage,
    PeerError,
    PeerHead,
    PeerRead,
    PeerUnavailable,
    SocketSpan,
    crc32c_sum,
)
from gateway.fleet.wire import (
    PATH_PREFIX,
    DirChange,
    DrainAnswer,
    DrainRequest,
    LeaseGrant,
    LeaseRequest,
    NodeInfo,
    PeerRow,
    ReplicaCommit,
    SupersedeAnswer,
    SupersedeRequest,
    WireError,
    supersede_answers,
)
from gateway.models import ObjectAttributes, ObjectMeta, PartAttributes

HEAD_HEADER = "x-gateway-peer-head"  # base64url JSON of the version a read answers with
HELD_HEADER = "x-gateway-peer-held"  # "none": the peer holds no unflushed version
# The answer is an S3 error of the peer's version: base64url JSON of it (a HEAD's answer
# has no body; "1" from a gateway before this: the JSON is in the body).
ERROR_HEADER = "x-gateway-peer-error"
# A body from a peer is passed on as it arrives (``iter_any``: no re-chunking copy), with
# up to this much buffered (aiohttp's default, 64 KiB, paused the socket far more often).
READ_CHUNK_BYTES = 4 << 20
# Headers of a GET/HEAD that a peer evaluates against its version.
FORWARDED = ("Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since")
PART_HEADER = "x-gateway-part-number"
REPLICA_HEADER = "x-gateway-replica"  # read the replica held for another, not one's own
# A commit this long (JSON) or shorter goes in the query of a small body's request (well
# within the listener's 16 KiB request line once base64url-encoded).
_QUERY_DOC_BYTES = 8 << 10


def encode_head(head: PeerHead, extra: Mapping[str, Any]) -> str:
    m = head.meta
    doc = {
        "node": head.node_id,
        "state": head.state,
        "acked_s": head.acked_s,
        "is_delete": head.is_delete,
        "meta": {
            "bucket": m.bucket,
            "key": m.key,
            "size": m.size_bytes,
            "etag": m.etag,
            "last_modified_s": m.last_modified_s,
            "content_type": m.content_type,
            "user_metadata": dict(m.user_metadata),
            "headers": dict(m.headers),
            "checksums": dict(m.checksums),
        },
        **extra,
    }
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def encode_attributes(a: ObjectAttributes) -> dict[str, Any]:
    """GetObjectAttributes of a version, for the ``version`` op's answer."""
    return {
        "etag": a.etag,
        "size": a.size_bytes,
        "last_modified_s": a.last_modified_s,
        "checksums": dict(a.checksums),
        "storage_class": a.storage_class,
        "parts_count": a.parts_count,
        "parts": [[p.part_number, p.size_bytes, p.checksum] for p in a.parts],
        "marker": a.part_number_marker,
        "max_parts": a.max_parts,
        "is_truncated": a.is_truncated,
    }


def decode_attributes(doc: Any) -> ObjectAttributes:
    """``encode_attributes``'s answer; raises WireError when malformed."""
    try:
        count = doc["parts_count"]
        return ObjectAttributes(
            str(doc["etag"]),
            int(doc["size"]),
            float(doc["last_modified_s"]),
            {str(k): str(v) for k, v in doc["checksums"].items()},
            str(doc["storage_class"]),
            None if count is None else int(count),
            tuple(
                PartAttributes(int(n), int(size), None if sum_ is None else str(sum_))
                for n, size, sum_ in doc["parts"]
            ),
            int(doc["marker"]),
            int(doc["max_parts"]),
            bool(doc["is_truncated"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WireError(f"bad attributes: {exc}") from None


def encode_error(code: str, message: str, fields: Mapping[str, str]) -> str:
    doc = {"code": code, "message": message, "fields": dict(fields)}
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).decode()


def decode_head(value: str) -> tuple[PeerHead, dict[str, Any]]:
    """The version a peer's read answered with; raises WireError when malformed."""
    try:
        doc = json.loads(base64.urlsafe_b64decode(value.encode()))
        m = doc["meta"]
        meta = ObjectMeta(
            bucket=str(m["bucket"]),
            key=str(m["key"]),
            size_bytes=int(m["size"]),
            etag=str(m["etag"]),
            last_modified_s=float(m["last_modified_s"]),
            content_type=str(m["content_type"]),
            user_metadata={str(k): str(v) for k, v in m["user_metadata"].items()},
            headers={str(k): str(v) for k, v in m["headers"].items()},
            checksums={str(k): str(v) for k, v in m["checksums"].items()},
        )
        head = PeerHead(
            str(doc["node"]), meta, str(doc["state"]), float(doc["acked_s"]), bool(doc["is_delete"])
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WireError(f"bad {HEAD_HEADER}: {exc}") from None
    return head, doc


class PeerClient:
    """``PeerTransport`` over HTTP. One connection pool for every peer; MUST be closed."""

    def __init__(self, node_id: str, secret: bytes, clock: Clock, *, scheme: str = "http") -> None:
        self._node_id = node_id
        self._secret = secret
        self._clock = clock
        self._scheme = scheme
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ssl=False)
            self._session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, read_bufsize=READ_CHUNK_BYTES
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _signed(self, method: str, path: str, query: str, body: bytes | None) -> dict[str, str]:
        return auth.sign(self._secret, method, path, query, self._node_id, self._clock.wall(), body)

    async def _call(self, address: str, op: str, doc: Mapping[str, Any], timeout_s: float) -> Any:
        """POST ``doc`` to ``op``; the decoded JSON answer (None for 204)."""
        path = PATH_PREFIX + op
        body = json.dumps(doc).encode()
        headers = self._signed("POST", path, "", body)
        headers["Content-Type"] = "application/json"
        url = f"{self._scheme}://{address}{path}"
        try:
            async with self._client().post(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                payload = await resp.read()
                if resp.status == 204:
                    return None
                if resp.status != 200:
                    raise PeerUnavailable(f"{op}: HTTP {resp.status} {payload[:200]!r}")
                return json.loads(payload)
        except PeerUnavailable:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise PeerUnavailable(f"{op}: {type(exc).__name__}: {exc}") from None

    async def hello(self, address: str, timeout_s: float) -> NodeInfo:
        return _decoded(NodeInfo.from_json, await self._call(address, "hello", {}, timeout_s))

    async def lease(self, address: str, request: LeaseRequest, timeout_s: float) -> LeaseGrant:
        answer = await self._call(address, "lease", request.to_json(), timeout_s)
        return _decoded(LeaseGrant.from_json, answer)

    async def announce(self, address: str, change: DirChange, timeout_s: float) -> None:
        await self._call(address, "directory", change.to_json(), timeout_s)

    async def drain(self, address: str, request: DrainRequest, timeout_s: float) -> DrainAnswer:
        answer = await self._call(address, "drain", request.to_json(), timeout_s)
        return _decoded(DrainAnswer.from_json, answer)

    async def bye(self, address: str, node: NodeInfo, timeout_s: float) -> None:
        await self._call(address, "bye", node.to_json(), timeout_s)

    async def supersede(
        self, address: str, request: SupersedeRequest, timeout_s: float
    ) -> list[SupersedeAnswer]:
        answer = await self._call(address, "supersede", request.to_json(), timeout_s)
        return _decoded(lambda raw: supersede_answers(raw, len(request.versions)), answer)

    async def version(
        self,
        address: str,
        bucket: str,
        key: str,
        timeout_s: float,
        *,
        replica: bool = False,
        attributes: AttributesPage | None = None,
    ) -> PeerHead | None:
        doc: dict[str, Any] = {"bucket": bucket, "key": key}
        if replica:
            doc["replica"] = True
        if attributes is not None:
            doc["attributes"] = {"max_parts": attributes[0], "marker": attributes[1]}
        answer = await self._call(address, "version", doc, timeout_s)
        if not isinstance(answer, dict) or answer.get("head") is None:
            return None
        try:
            head = decode_head(str(answer["head"]))[0]
            found = answer.get("attributes")
            if found is None:
                return head
            return dataclasses.replace(head, attributes=decode_attributes(found))
        except WireError as exc:
            raise PeerUnavailable(str(exc)) from None

    async def figures(
        self, address: str, bucket: str, paths: Sequence[str], timeout_s: float
    ) -> dict[str, dict[str, Any]]:
        answer = await self._call(
            address, "figures", {"bucket": bucket, "paths": list(paths)}, timeout_s
        )
        if not isinstance(answer, dict) or not isinstance(answer.get("paths"), dict):
            raise PeerUnavailable("figures: bad answer")
        return {str(k): v for k, v in answer["paths"].items() if isinstance(v, dict)}

    async def replica_body(
        self,
        address: str,
        owner: str,
        stage_id: str,
        bucket: str,
        key: str,
        upload: tuple[str, int] | None,
        body: AsyncIterator[bytes],
        timeout_s: float,
        size_bytes: int | None = None,
        by_crc32c: bool = False,
    ) -> tuple[str, int]:
        path = PATH_PREFIX + "replica/body"
        params = {"owner": owner, "stage": stage_id, "bucket": bucket, "key": key}
        if upload is not None:
            params.update({"upload": upload[0], "part": str(upload[1])})
        if by_crc32c:
            params["sum"] = "crc32c"
        query = urllib.parse.urlencode(params)
        headers = self._signed("PUT", path, query, None)  # streamed: its digests protect it
        url = yarl.URL(f"{self._scheme}://{address}{path}?{query}", encoded=True)
        timeout = aiohttp.ClientTimeout(connect=timeout_s, sock_read=timeout_s)
        try:
            async with self._client().put(url, data=body, headers=headers, timeout=timeout) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise PeerUnavailable(f"replica: HTTP {resp.status} {payload[:200]!r}")
                doc = json.loads(payload)
                if "crc32c" in doc:  # staged by its CRC32C (an older holder: by MD5)
                    return crc32c_sum(int(doc["crc32c"])), int(doc["size"])
                return str(doc["md5"]), int(doc["size"])
        except PeerUnavailable:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError) as exc:
            raise PeerUnavailable(f"replica: {type(exc).__name__}: {exc}") from None

    async def replica_commit(
        self, address: str, commit: ReplicaCommit, timeout_s: float
    ) -> list[str]:
        doc = json.dumps(dataclasses.replace(commit, body=None).to_json()).encode()
        if commit.body is not None and len(doc) <= _QUERY_DOC_BYTES:
            # The body raw (no base64 JSON to build, sign and parse), the commit in the query.
            answer = await self._commit_with_body(address, doc, commit.body, timeout_s)
        else:
            answer = await self._call(address, "replica/commit", commit.to_json(), timeout_s)
        missing = answer.get("missing") if isinstance(answer, dict) else None
        if not isinstance(missing, list):
            raise PeerUnavailable("replica commit: bad answer")
        return [str(m) for m in missing]

    async def _commit_with_body(
        self, address: str, doc: bytes, body: bytes, timeout_s: float
    ) -> Any:
        path = PATH_PREFIX + "replica/commit"
        query = "commit=" + base64.urlsafe_b64encode(doc).decode("ascii")
        headers = self._signed("PUT", path, query, None)  # the body: checked by its MD5
        url = yarl.URL(f"{self._scheme}://{address}{path}?{query}", encoded=True)
        try:
            async with self._client().put(
                url, data=body, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                payload = await resp.read()
                if resp.status != 200:
                    raise PeerUnavailable(f"replica commit: HTTP {resp.status} {payload[:200]!r}")
                return json.loads(payload)
        except PeerUnavailable:
            raise
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
            raise PeerUnavailable(f"replica commit: {type(exc).__name__}: {exc}") from None

    async def replica_drop(
        self, address: str, owner: str, datadir_id: str, seqs: Sequence[int], timeout_s: float
    ) -> None:
        doc = {"owner": owner, "datadir_id": datadir_id, "seqs": list(seqs)}
        await self._call(address, "replica/drop", doc, timeout_s)

    async def replica_needed(
        self, address: str, owner: str, datadir_id: str, seqs: Sequence[int], timeout_s: float
    ) -> list[int] | None:
        doc = {"owner": owner, "datadir_id": datadir_id, "seqs": list(seqs)}
        answer = await self._call(address, "replica/needed", doc, timeout_s)
        if not isinstance(answer, dict) or "needed" not in answer:
            raise PeerUnavailable("replica needed: bad answer")
        needed = answer["needed"]
        if needed is None:
            return None  # not its data dir: that incarnation is gone
        if not isinstance(needed, list):
            raise PeerUnavailable("replica needed: bad answer")
        return [int(n) for n in needed]

    async def list_rows(
        self, address: str, bucket: str, prefix: str, after: str, limit: int, timeout_s: float
    ) -> tuple[list[PeerRow], bool]:
        doc = {"bucket": bucket, "prefix": prefix, "after": after, "limit": limit}
        answer = await self._call(address, "rows", doc, timeout_s)
        try:
            rows = [PeerRow.from_json(r) for r in answer["rows"]]
            return rows, bool(answer["truncated"])
        except (WireError, KeyError, TypeError) as exc:
            raise PeerUnavailable(f"rows: bad answer: {exc}") from None

    async def read(
        self,
        address: str,
        bucket: str,
        key: str,
        *,
        method: str,
        headers: Mapping[str, str],
        timeout_s: float,
        zero_copy: bool = False,
    ) -> PeerRead | None:
        path = PATH_PREFIX + "object"
        query = urllib.parse.urlencode({"bucket": bucket, "key": key})
        signed = self._signed(method, path, query, b"")
        wanted = (*FORWARDED, PART_HEADER, REPLICA_HEADER)
        signed.update({k: v for k, v in headers.items() if k in wanted})
        # encoded: the query goes out exactly as signed (yarl would normalise %2F).
        url = yarl.URL(f"{self._scheme}://{address}{path}?{query}", encoded=True)
        # The head must come within timeout_s; the body's chunks each within it too.
        timeout = aiohttp.ClientTimeout(connect=timeout_s, sock_read=timeout_s)
        try:
            resp = await self._client().request(method, url, headers=signed, timeout=timeout)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PeerUnavailable(f"read: {type(exc).__name__}: {exc}") from None
        try:
            return await _read_answer(resp, method, timeout_s if zero_copy else None)
        except BaseException:
            resp.release()
            raise


async def _read_answer(
    resp: aiohttp.ClientResponse, method: str, splice_timeout_s: float | None
) -> PeerRead | None:
    """``splice_timeout_s``: the body may end in a ``SocketSpan`` (None: bytes only)."""
    if resp.headers.get(HELD_HEADER) == "none":
        resp.release()
        return None
    error = resp.headers.get(ERROR_HEADER)
    if error:
        try:
            raw = await resp.read() if error == "1" else base64.urlsafe_b64decode(error.encode())
            doc = json.loads(raw)
            raise PeerError(resp.status, str(doc["code"]), str(doc["message"]), doc["fields"])
        except (ValueError, KeyError, TypeError, aiohttp.ClientError) as exc:
            raise PeerUnavailable(f"read: bad error answer: {exc}") from None
    value = resp.headers.get(HEAD_HEADER)
    if resp.status not in (200, 206, 304) or value is None:
        raise PeerUnavailable(f"read: HTTP {resp.status} without a version")
    try:
        head, doc = decode_head(value)
    except WireError as exc:
        raise PeerUnavailable(str(exc)) from None
    rng = doc.get("byte_range")
    has_body = method == "GET" and resp.status != 304
    if not has_body:
        resp.release()
    return PeerRead(
        head,
        byte_range=(int(rng[0]), int(rng[1]), int(rng[2])) if rng else None,
        parts_count=doc.get("parts_count"),
        is_not_modified=resp.status == 304,
        body=_body(resp, splice_timeout_s) if has_body else None,
    )


def _body(
    resp: aiohttp.ClientResponse, splice_timeout_s: float | None
) -> AsyncIterator[bytes | SocketSpan]:
    sock = _spliceable(resp) if splice_timeout_s is not None else None
    if sock is None:
        return _chunks(resp)
    return _socket_pieces(resp, sock, splice_timeout_s or 0.0)


def _spliceable(resp: aiohttp.ClientResponse) -> Any:
    """The connection's socket when the rest of the body can be taken from it as it is: a
    plain TCP connection, a body of known length sent as is (no chunked coding, no
    compression). None otherwise."""
    conn = resp.connection
    transport = conn.transport if conn is not None else None
    if transport is None or transport.get_extra_info("ssl_object") is not None:
        return None
    if resp.content_length is None or "Transfer-Encoding" in resp.headers:
        return None
    if "Content-Encoding" in resp.headers:
        return None
    return transport.get_extra_info("socket")


async def _socket_pieces(
    resp: aiohttp.ClientResponse, sock: Any, timeout_s: float
) -> AsyncIterator[bytes | SocketSpan]:
    """What aiohttp has already read of the body, then the rest as a span of the socket.

    Taking what is buffered and pausing the transport happen in one step (no await
    between), so aiohttp never reads a byte of the span; the connection is closed after,
    never reused (its parser did not see the span's bytes)."""
    conn = resp.connection
    assert conn is not None and conn.transport is not None and resp.content_length is not None
    try:
        head = resp.content.read_nowait()
    except Exception as exc:
        resp.close()
        raise PeerUnavailable(f"read: body: {type(exc).__name__}: {exc}") from None
    left = resp.content_length - len(head)
    if left <= 0:  # it had all arrived
        try:
            if head:
                yield head
        finally:
            resp.release()
        return
    conn.transport.pause_reading()
    fd = os.dup(sock.fileno())
    try:
        if head:
            yield head
        yield SocketSpan(fd, left, timeout_s)
    finally:
        os.close(fd)
        resp.close()


async def _chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The body in pieces; a peer that stops sending raises (the client's connection is
    then cut by the protocol layer, never completed short)."""
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        raise PeerUnavailable(f"read: body: {type(exc).__name__}: {exc}") from None
    finally:
        resp.release()


T = TypeVar("T")


def _decoded(parse: Callable[[Any], T], answer: Any) -> T:
    try:
        return parse(answer)
    except WireError as exc:
        raise PeerUnavailable(f"bad answer: {exc}") from None
