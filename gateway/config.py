"""Settings: one frozen object, loaded once from flags, ``GATEWAY_*`` env and a YAML file.

Precedence: command-line flag > environment variable > config file > default. Every option
has all three spellings: ``--flush-concurrency`` / ``GATEWAY_FLUSH_CONCURRENCY`` /
``flush_concurrency:`` (dashes also accepted in the file).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": KiB, "M": MiB, "G": GiB, "T": TiB}


class ConfigError(ValueError):
    """A setting is missing or malformed; the message names it."""


def parse_size(value: str | int) -> int:
    """Bytes from ``1073741824``, ``64MiB``, ``1G``, ``1.5TiB`` (binary units)."""
    if isinstance(value, int):
        return value
    m = _SIZE.match(str(value))
    if not m:
        raise ConfigError(f"not a size: {value!r}")
    unit = (m.group(2) or "").upper()[:1]
    return int(float(m.group(1)) * _UNITS[unit if unit != "B" else ""])


def _bool(value: str | bool) -> bool:
    if isinstance(value, bool):
        return value
    if value.lower() in ("1", "true", "yes", "on"):
        return True
    if value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"not a boolean: {value!r}")


def _patterns(value: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """Globs from ``"a,b"`` (flag, env) or a YAML list; empty entries dropped."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(i).strip() for i in items if str(i).strip())


def _host_port(value: str) -> str:
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"expected HOST:PORT (port 0-65535), got {value!r}")
    return value


def _endpoint_url(value: str) -> str:
    """An upstream endpoint: ``http(s)://host[:port][/path]``."""
    try:
        url = urllib.parse.urlsplit(value)
        is_port_zero = url.port == 0  # .port raises ValueError: not a number, out of range
    except ValueError as exc:
        raise ConfigError(f"not an endpoint URL: {value!r} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.hostname or is_port_zero:
        raise ConfigError(f"expected http(s)://HOST[:PORT], got {value!r}")
    return value


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if value not in allowed:
            raise ConfigError(f"expected one of {', '.join(allowed)}, got {value!r}")
        return value

    return check


@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob of ``gateway serve``. Defaults are the documented ones (README)."""

    # S3 listener; clients set endpoint_url to it.
    listen: str = "127.0.0.1:9000"
    # Admin listener (health, status, drain, metrics). Loopback by default.
    admin_listen: str = "127.0.0.1:9001"
    # Bodies and the journal live here: put it on the node's local NVMe.
    data_dir: Path = Path("gateway-data")
    # The real S3 endpoint. None: start an embedded demo upstream (moto) on loopback.
    upstream_endpoint: str | None = None
    upstream_region: str = "us-east-1"
    # path | virtual | auto (botocore's choice); S3-compatible stores often need path.
    upstream_addressing_style: str = "auto"
    # Client credentials (what jobs sign with); never used towards the upstream.
    access_key: str | None = None
    secret_key: str | None = None
    # fsync: an ack survives kill -9 and power loss. none: survives kill -9 only.
    durability: str = "fsync"
    # Local cache size reported in status; 0 means the data dir's filesystem size.
    capacity_bytes: int = 0
    # Base domain for virtual-hosted-style requests (bucket.<domain>); None: path-style only.
    domain: str | None = None
    # Requests in flight to the upstream at first; the window adapts from there (grows
    # while more in flight add throughput, shrinks when they stop or S3 throttles) up to
    # flush_max_concurrency, which is also the upstream connection pool's share for flushes.
    flush_concurrency: int = 32
    flush_max_concurrency: int = 1024
    # Full-jitter backoff of failed uploads: first retry within base, capped at max.
    flush_retry_base_s: float = 0.2
    flush_retry_max_s: float = 30.0
    # Token buckets on upstream requests/s and bytes/s for the whole flusher; 0 = unlimited.
    flush_rate: float = 0.0
    flush_bandwidth_bytes: int = 0
    # Burst sizes of those buckets (requests, bytes); 0 = one second's worth.
    flush_rate_burst: float = 0.0
    flush_bandwidth_burst_bytes: int = 0
    # Each bucket's adaptive budget (requests/s, shared by its lanes): slow start begins at
    # the initial rate (a fresh bucket; S3 asks clients to ramp up), and no cut goes below
    # the minimum (one request a second keeps seeing when an outage of S3 ends).
    flush_initial_rate: float = 10.0
    flush_min_rate: float = 0.1
    # Prefix lanes: keys are partitioned by bucket and their first N path segments.
    lane_depth: int = 3
    # Per-lane hard caps: requests/s (S3 accepts 3,500 writes/s per prefix) and bytes/s
    # (0 = unlimited), whatever the bucket's budget allows.
    lane_rate: float = 3500.0
    lane_bandwidth_bytes: int = 0
    # Lowest rate of a lane S3 throttles on its own (it then has an adaptive rate of its own).
    lane_min_rate: float = 0.1
    # Uploads in flight at once in one lane; 0: as many as the flusher's window of requests
    # in flight (it adapts), so that one lane alone can fill it.
    lane_concurrency: int = 0
    # Write-back delay: an object becomes eligible this long after its ack, so an overwrite,
    # delete or rename that follows quickly is coalesced instead of uploaded.
    write_back_delay_s: float = 0.5
    # Keys matching these glob patterns (temp files that are renamed) wait longer.
    temp_patterns: tuple[str, ...] = ("*.tmp",)
    temp_hold_s: float = 10.0
    # Commit markers: flushed only after everything acknowledged earlier under their parent.
    commit_markers: tuple[str, ...] = (".metadata", "_SUCCESS")
    # A single PutObject body above this is flushed as a multipart upload.
    multipart_threshold_bytes: int = 64 * MiB
    # Start a client's multipart upload upstream at its first acked part and send parts as
    # they land (the client's Complete is still flushed after the write-back delay).
    early_multipart: bool = True
    # A PutObject body of at most this many bytes is stored inside the journal: durable with
    # the (grouped) journal commit alone, no file, no file or directory fsync. 0: never.
    inline_threshold_bytes: int = 64 * KiB
    # Largest single PutObject body or part accepted (S3's limit is 5 GiB).
    max_object_bytes: int = 5 * GiB
    # Smallest non-last part CompleteMultipartUpload accepts (S3: 5 MiB). The flusher
    # re-uploads parts as they are, so this must not be below the upstream's own minimum.
    min_part_bytes: int = 5 * MiB
    # On SIGTERM keep flushing this long before exiting (what is left resumes next start).
    shutdown_drain_timeout_s: float = 30.0
    # Serve the S3 listener over https with this certificate chain and key (PEM files).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # Bucket created in the embedded demo upstream.
    demo_bucket: str = "demo"
    log_level: str = "info"
    # --- Hostile input, admin auth and client credentials (tests/faults) ---
    # Whole request header section (names + values); over it: RequestHeaderSectionTooLarge.
    # S3 itself allows 8 KiB; we are laxer by default. Also bounds any single header line.
    max_header_size_bytes: int = 16 * KiB
    # Request line (method, path, query) aiohttp's parser accepts; over it: the same error.
    max_line_size_bytes: int = 16 * KiB
    # Number of header lines aiohttp's parser accepts.
    max_headers: int = 128
    # XML request bodies (CompleteMultipartUpload, DeleteObjects); over it: MalformedXML.
    max_xml_body_bytes: int = 4 * MiB
    # Bearer token of the admin API; required when admin_listen is not loopback.
    admin_token: str | None = None
    admin_token_file: Path | None = None
    # YAML/JSON mapping access_key -> secret, or a directory (Kubernetes Secret mount) whose
    # file names are access keys and contents secrets; re-read when it changes.
    credentials_file: Path | None = None

    # --- logs (issue 6) ---
    # text: one human line per record; json: one JSON object per line (log shippers).
    log_format: str = "text"
    # One line per S3 request (Combined log format + request id, operation, bytes, duration)
    # on the ``gateway.access`` logger; signatures and credentials are never in it.
    access_log: bool = True

    # -- cache capacity and eviction (issue 5) -----------------------------------------------
    # Fractions of the capacity: when used bytes (every local body) pass the high watermark,
    # flushed objects are evicted least recently used first, down to the low watermark.
    # Unflushed bytes are never evicted; writes that would push them past the capacity get
    # 503 SlowDown.
    cache_high_watermark: float = 0.9
    cache_low_watermark: float = 0.8

    # -- reads of remote objects (issue 15) --------------------------------------------------
    # A remote object is fetched once per node with parallel ranged GETs of this size ...
    read_part_size_bytes: int = 8 * MiB
    # ... at most this many at once over all objects (one object: up to half of them).
    read_concurrency: int = 32

    @property
    def fsync(self) -> bool:
        return self.durability == "fsync"

    @property
    def is_demo(self) -> bool:
        return self.upstream_endpoint is None


# name -> (converter, flag help). Names match Settings fields; flags drop _bytes / _s.
_OPTIONS: dict[str, tuple[Callable[[Any], Any], str]] = {
    "listen": (_host_port, "S3 listener HOST:PORT"),
    "admin_listen": (_host_port, "admin listener HOST:PORT"),
    "data_dir": (Path, "directory for bodies and the journal (local NVMe)"),
    "upstream_endpoint": (
        _endpoint_url,
        "real S3 endpoint URL; omit for the embedded demo upstream",
    ),
    "upstream_region": (str, "upstream region"),
    "upstream_addressing_style": (_choice("auto", "path", "virtual"), "upstream addressing style"),
    "access_key": (str, "client access key id"),
    "secret_key": (str, "client secret key"),
    "durability": (_choice("fsync", "none"), "fsync (default) or none"),
    "capacity_bytes": (parse_size, "local cache capacity (e.g. 500GiB)"),
    "domain": (str, "base domain for virtual-hosted-style addressing"),
    "flush_concurrency": (int, "upstream requests in flight at first (the window adapts)"),
    "flush_max_concurrency": (int, "most upstream requests in flight (the window's ceiling)"),
    "flush_retry_base_s": (float, "first retry backoff ceiling, seconds"),
    "flush_retry_max_s": (float, "backoff cap, seconds"),
    "flush_rate": (float, "upstream requests/s, all lanes (0 = unlimited)"),
    "flush_bandwidth_bytes": (parse_size, "upstream bytes/s, all lanes (0 = unlimited)"),
    "flush_rate_burst": (float, "burst of --flush-rate in requests (0 = 1 s worth)"),
    "flush_bandwidth_burst_bytes": (parse_size, "burst of --flush-bandwidth (0 = 1 s worth)"),
    "flush_initial_rate": (float, "requests/s a bucket's adaptive budget slow-starts from"),
    "flush_min_rate": (float, "floor of a bucket's adaptive requests/s"),
    "lane_depth": (int, "path segments of a key that name its prefix lane"),
    "lane_rate": (float, "hard cap of each lane's requests/s"),
    "lane_bandwidth_bytes": (parse_size, "bytes/s per lane (0 = unlimited)"),
    "lane_min_rate": (float, "floor of the own rate of a lane throttled on its own"),
    "lane_concurrency": (int, "uploads in flight per lane (0: the flusher's window)"),
    "write_back_delay_s": (float, "seconds an object waits before it may flush (coalescing)"),
    "temp_patterns": (_patterns, "comma-separated globs of temp keys held longer"),
    "temp_hold_s": (float, "seconds temp keys wait before they may flush"),
    "commit_markers": (_patterns, "comma-separated globs of commit-marker file names"),
    "multipart_threshold_bytes": (parse_size, "single PUTs above this flush as multipart"),
    "early_multipart": (_bool, "send multipart parts upstream as they land (true/false)"),
    "inline_threshold_bytes": (parse_size, "PUT bodies up to this live in the journal (0: off)"),
    "max_object_bytes": (parse_size, "largest PutObject body or part"),
    "min_part_bytes": (parse_size, "smallest non-last multipart part"),
    "shutdown_drain_timeout_s": (float, "seconds to keep flushing after SIGTERM"),
    "tls_cert": (Path, "PEM certificate chain: serve S3 over https"),
    "tls_key": (Path, "PEM private key for --tls-cert"),
    "demo_bucket": (str, "bucket created in the embedded demo upstream"),
    "log_level": (_choice("debug", "info", "warning", "error"), "log level"),
    # --- logs (issue 6) ---
    "log_format": (_choice("text", "json"), "log format: text or json (one object a line)"),
    "access_log": (_bool, "log one line per S3 request (true/false)"),
    # -- cache capacity and eviction (issue 5)
    "cache_high_watermark": (float, "fraction of --capacity that starts eviction (0.9)"),
    "cache_low_watermark": (float, "fraction of --capacity eviction stops at (0.8)"),
    # -- reads of remote objects (issue 15)
    "read_part_size_bytes": (parse_size, "bytes of each ranged GET of a remote object (8MiB)"),
    "read_concurrency": (int, "ranged GETs of remote objects in flight at once (32)"),
    # --- Hostile input, admin auth and client credentials (tests/faults) ---
    "max_header_size_bytes": (parse_size, "largest request header section (e.g. 16KiB)"),
    "max_line_size_bytes": (parse_size, "largest request line: method, path and query"),
    "max_headers": (int, "most header lines in one request"),
    "max_xml_body_bytes": (parse_size, "largest XML request body (CompleteMultipartUpload, ...)"),
    "admin_token": (str, "bearer token of the admin API (required off loopback)"),
    "admin_token_file": (Path, "file holding the admin API bearer token"),
    "credentials_file": (Path, "client credentials: YAML/JSON key->secret or a Secret dir"),
}


def flag_name(field_name: str) -> str:
    """The flag for a field: units dropped, dashes (``capacity_bytes`` -> ``capacity``)."""
    base = re.sub(r"_(bytes|s)$", "", field_name)
    return base.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML config file")
    for name, (_, help_text) in _OPTIONS.items():
        flag = flag_name(name)
        parser.add_argument(
            f"--{flag}",
            dest=name,
            default=None,
            help=f"{help_text} [env GATEWAY_{flag.upper().replace('-', '_')}]",
        )


def load(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Merge flags, env and file into Settings. Raises ConfigError naming the bad setting."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    config_path = getattr(args, "config", None) or env.get("GATEWAY_CONFIG")
    if config_path:
        values.update(_from_file(Path(config_path)))
    for name in _OPTIONS:
        env_name = "GATEWAY_" + flag_name(name).upper().replace("-", "_")
        if env_name in env:
            values[name] = env[env_name]
        flag_value = getattr(args, name, None) if args is not None else None
        if flag_value is not None:
            values[name] = flag_value
    converted: dict[str, Any] = {}
    for name, raw in values.items():
        try:
            converted[name] = _OPTIONS[name][0](raw) if raw is not None else None
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{flag_name(name)}: {exc}") from exc
    settings = Settings(**converted)
    _validate(settings)
    return settings


def _from_file(path: Path) -> dict[str, Any]:
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"config file {path}: expected a mapping")
    by_flag = {flag_name(n): n for n in _OPTIONS}
    out: dict[str, Any] = {}
    for key, value in doc.items():
        name = str(key).replace("-", "_")
        name = name if name in _OPTIONS else by_flag.get(str(key).replace("_", "-"), "")
        if not name:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        out[name] = value
    return out


def _validate(settings: Settings) -> None:
    if (settings.access_key is None) != (settings.secret_key is None):
        raise ConfigError("access-key and secret-key go together")
    if not settings.is_demo and settings.access_key is None and settings.credentials_file is None:
        raise ConfigError(
            "access-key/secret-key or credentials-file are required with an upstream endpoint"
        )
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConfigError("tls-cert and tls-key go together")
    if settings.listen == settings.admin_listen:
        raise ConfigError(f"listen and admin-listen are the same address ({settings.listen})")
    if not 1 <= settings.flush_concurrency <= settings.flush_max_concurrency:
        raise ConfigError("need 1 <= flush-concurrency <= flush-max-concurrency")
    if settings.lane_concurrency < 0:
        raise ConfigError("lane-concurrency must be 0 (the window) or more")
    if settings.lane_rate <= 0 or settings.lane_min_rate <= 0:
        raise ConfigError("lane-rate and lane-min-rate must be positive")
    if not 0 < settings.flush_min_rate <= settings.flush_initial_rate:
        raise ConfigError("need 0 < flush-min-rate <= flush-initial-rate")
    if not 0 < settings.cache_low_watermark <= settings.cache_high_watermark <= 1:
        raise ConfigError("need 0 < cache-low-watermark <= cache-high-watermark <= 1")
    _validate_limits(settings)
    if settings.multipart_threshold_bytes < 5 * MiB:
        raise ConfigError("multipart-threshold must be at least 5MiB (S3's smallest part)")
    if settings.read_part_size_bytes < 64 * KiB or settings.read_concurrency < 1:
        raise ConfigError("read-part-size must be at least 64KiB, read-concurrency at least 1")
    if not 0 <= settings.inline_threshold_bytes <= 1 * MiB:
        raise ConfigError("inline-threshold must be between 0 and 1MiB")


def _validate_limits(settings: Settings) -> None:
    """Hostile-input limits and the admin token rule (loopback or a token)."""
    if settings.max_header_size_bytes < 1 * KiB or settings.max_line_size_bytes < 1 * KiB:
        raise ConfigError("max-header-size and max-line-size must be at least 1KiB")
    if settings.max_headers < 16:
        raise ConfigError("max-headers must be at least 16")
    if settings.max_xml_body_bytes < 1 * KiB:
        raise ConfigError("max-xml-body must be at least 1KiB")
    for name in ("credentials_file", "admin_token_file", "tls_cert", "tls_key"):
        path = getattr(settings, name)
        if path is not None and not path.exists():
            raise ConfigError(f"{flag_name(name)}: {path} does not exist")
    host = settings.admin_listen.rpartition(":")[0].strip("[]")
    has_token = settings.admin_token is not None or settings.admin_token_file is not None
    if not has_token and not is_loopback(host):
        raise ConfigError(
            f"admin-listen {settings.admin_listen} is not loopback: set admin-token "
            "(GATEWAY_ADMIN_TOKEN) or admin-token-file"
        )


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (``127.0.0.0/8``, ``::1``); a host name
    may resolve to anything, so it is not."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
