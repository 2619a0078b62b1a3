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
import shutil
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
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


def _peers(value: str) -> str:
    """``HOST:PORT,...`` (``http(s)://`` allowed) or ``dns:NAME:PORT``."""
    text = value.strip()
    items = [text[4:]] if text.startswith("dns:") else text.split(",")
    items = [i.strip().removeprefix("http://").removeprefix("https://").rstrip("/") for i in items]
    if not any(items) or not all(_is_host_port(i) for i in items if i):
        raise ConfigError(f"expected HOST:PORT,... or dns:NAME:PORT, got {value!r}")
    return text


def _is_host_port(item: str) -> bool:
    host, sep, port = item.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)


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
    # Flush the writes a data dir holds for another (or an unrecorded) upstream to this
    # --upstream-endpoint. Off: such a data dir is refused (never the demo's writes).
    adopt_data_dir: bool = False
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

    # -- the fleet (issue 20; docs/fleet.md) -------------------------------------------------
    # This gateway's name in the fleet; None: $NODE_NAME, else the host name.
    node_id: str | None = None
    # The other gateways' S3 listeners: "host:port,..." or "dns:NAME:PORT" (a headless
    # Service: every address NAME resolves to). None: this gateway is alone.
    peers: str | None = None
    # The fleet secret that signs peer requests; None: derived from the upstream credentials.
    peer_secret: str | None = None
    peer_secret_file: Path | None = None
    # Leases on the peers' directories (renewed every third of it) and how often discovery
    # is asked again.
    peer_lease_s: float = 3.0
    peer_refresh_s: float = 10.0
    # A peer read's deadline (its answer's head): past it the read does without that peer.
    peer_read_timeout_s: float = 2.0
    # -- node loss (issue 21; docs/fleet.md) -------------------------------------------------
    # Acknowledge a write only when it is fsynced here and on this many members (0: here).
    replicas: int = 0
    # Fewer members than --replicas can take a replica: strict answers 503 SlowDown,
    # degrade acknowledges with fewer copies (counted, and said in the PUT's answer).
    replica_policy: str = "strict"
    # This node's failure domain: replicas go to members of other zones first.
    zone: str | None = None
    # A member silent this long is lost: the members holding its replicas upload them.
    peer_timeout_s: float = 30.0
    # The fleet's own objects in each bucket (claims of takeovers): never listed to clients.
    control_prefix: str = ".gateway/"

    @property
    def fsync(self) -> bool:
        return self.durability == "fsync"

    @property
    def is_demo(self) -> bool:
        return self.upstream_endpoint is None


@dataclass(frozen=True, slots=True)
class Option:
    """One option of ``gateway serve``: how a flag, env or file value becomes the field's
    value, the placeholder --help shows for it, and its --help line (the README's
    Configuration table has the long form). The default shown is the Settings field's."""

    convert: Callable[[Any], Any]
    metavar: str
    help: str


_SIZE_ARG, _SECONDS, _BOOL = "SIZE", "SECS", "true|false"

# --help groups, in order; an option belongs to exactly one. Adding an option is one line
# in its group (and a Settings field of the same name); a new family is a new group. Keep
# each text short: with its default it should fit 44 columns (one line at 80).
GROUPS: tuple[tuple[str, dict[str, Option]], ...] = (
    (
        "listeners",
        {
            "listen": Option(_host_port, "HOST:PORT", "S3 listener"),
            "admin_listen": Option(_host_port, "HOST:PORT", "admin API"),
            "domain": Option(str, "DOMAIN", "BUCKET.DOMAIN addressing"),
            "tls_cert": Option(Path, "FILE", "PEM chain: S3 over https"),
            "tls_key": Option(Path, "FILE", "PEM key of --tls-cert"),
        },
    ),
    (
        "upstream (its credentials: the AWS chain, never the clients')",
        {
            "upstream_endpoint": Option(_endpoint_url, "URL", "S3 endpoint; none: a demo"),
            "upstream_region": Option(str, "REGION", "also told to clients"),
            "upstream_addressing_style": Option(
                _choice("auto", "path", "virtual"), "STYLE", "auto|path|virtual"
            ),
            "demo_bucket": Option(str, "NAME", "bucket of the demo upstream"),
            "adopt_data_dir": Option(_bool, _BOOL, "flush another upstream's writes"),
        },
    ),
    (
        "durability and cache",
        {
            "data_dir": Option(Path, "DIR", "on the node's NVMe"),
            "durability": Option(_choice("fsync", "none"), "fsync|none", "none: no fsync"),
            "capacity_bytes": Option(parse_size, _SIZE_ARG, "cache size; 0: the disk's"),
            "cache_high_watermark": Option(float, "RATIO", "of capacity: start evicting"),
            "cache_low_watermark": Option(float, "RATIO", "of capacity: stop evicting"),
            "inline_threshold_bytes": Option(parse_size, _SIZE_ARG, "bodies kept in the journal"),
        },
    ),
    (
        "flush engine: rates and lanes",
        {
            "flush_concurrency": Option(int, "N", "requests in flight at first (adapts)"),
            "flush_max_concurrency": Option(int, "N", "most requests in flight"),
            "flush_rate": Option(float, "N", "req/s, all lanes; 0: no cap"),
            "flush_rate_burst": Option(float, "N", "0: one second's worth"),
            "flush_bandwidth_bytes": Option(parse_size, _SIZE_ARG, "bytes/s, all lanes; 0: no cap"),
            "flush_bandwidth_burst_bytes": Option(parse_size, _SIZE_ARG, "0: one second's worth"),
            "flush_initial_rate": Option(float, "N", "a bucket's slow start, req/s"),
            "flush_min_rate": Option(float, "N", "a bucket's floor, req/s"),
            "flush_retry_base_s": Option(float, _SECONDS, "first backoff ceiling"),
            "flush_retry_max_s": Option(float, _SECONDS, "backoff cap"),
            "lane_depth": Option(int, "N", "key segments naming a lane"),
            "lane_rate": Option(float, "N", "a lane's cap, req/s"),
            "lane_min_rate": Option(float, "N", "floor of a lane alone, req/s"),
            "lane_bandwidth_bytes": Option(parse_size, _SIZE_ARG, "bytes/s per lane; 0: no cap"),
            "lane_concurrency": Option(int, "N", "uploads per lane; 0: the window"),
        },
    ),
    (
        "flush engine: what goes up when",
        {
            "write_back_delay_s": Option(float, _SECONDS, "after the ack (coalescing)"),
            "temp_patterns": Option(_patterns, "GLOBS", "temp keys, held longer"),
            "temp_hold_s": Option(float, _SECONDS, "how long temp keys wait"),
            "commit_markers": Option(_patterns, "GLOBS", "go up last"),
            "multipart_threshold_bytes": Option(
                parse_size, _SIZE_ARG, "bigger PUTs go up in parts"
            ),
            "early_multipart": Option(_bool, _BOOL, "parts go up as they land"),
            "shutdown_drain_timeout_s": Option(float, _SECONDS, "flushing after SIGTERM"),
        },
    ),
    (
        "reads of objects only upstream",
        {
            "read_part_size_bytes": Option(parse_size, _SIZE_ARG, "each ranged GET"),
            "read_concurrency": Option(int, "N", "ranged GETs in flight"),
        },
    ),
    (
        "limits and security",
        {
            "access_key": Option(str, "KEY", "clients' key; demo: demo"),
            "secret_key": Option(str, "SECRET", "clients' secret"),
            "credentials_file": Option(Path, "FILE", "more keys: map or Secret dir"),
            "admin_token": Option(str, "TOKEN", "admin bearer token"),
            "admin_token_file": Option(Path, "FILE", "file holding it"),
            "max_object_bytes": Option(parse_size, _SIZE_ARG, "largest body or part"),
            "min_part_bytes": Option(parse_size, _SIZE_ARG, "smallest part but the last"),
            "max_header_size_bytes": Option(parse_size, _SIZE_ARG, "largest header section"),
            "max_line_size_bytes": Option(parse_size, _SIZE_ARG, "largest request line"),
            "max_headers": Option(int, "N", "most header lines"),
            "max_xml_body_bytes": Option(parse_size, _SIZE_ARG, "largest XML body"),
        },
    ),
    (
        "the fleet (docs/fleet.md)",
        {
            "node_id": Option(str, "NAME", "none: $NODE_NAME, else host"),
            "peers": Option(_peers, "PEERS", "H:P,... or dns:NAME:PORT; none: alone"),
            "peer_secret": Option(str, "SECRET", "none: from upstream keys"),
            "peer_secret_file": Option(Path, "FILE", "file holding it"),
            "peer_lease_s": Option(float, _SECONDS, "lease on a peer's directory"),
            "peer_refresh_s": Option(float, _SECONDS, "re-resolve --peers"),
            "peer_read_timeout_s": Option(float, _SECONDS, "a read waits for a peer"),
            "replicas": Option(int, "N", "copies on members before the ack"),
            "replica_policy": Option(_choice("strict", "degrade"), "POLICY", "strict|degrade"),
            "zone": Option(str, "ZONE", "failure domain; none: one"),
            "peer_timeout_s": Option(float, _SECONDS, "silent this long: lost"),
            "control_prefix": Option(str, "PREFIX", "the fleet's objects in buckets"),
        },
    ),
    (
        "logging",
        {
            "log_level": Option(
                _choice("trace", "debug", "info", "warning", "error"),
                "LEVEL",
                "trace|debug|info|warning|error (debug: the gateway's; trace: its libraries' too)",
            ),
            "log_format": Option(_choice("text", "json"), "text|json", "json: one object a line"),
            "access_log": Option(_bool, _BOOL, "a line per S3 request"),
        },
    ),
)
_OPTIONS: dict[str, Option] = {name: opt for _, group in GROUPS for name, opt in group.items()}


def flag_name(field_name: str) -> str:
    """The flag for a field: units dropped, dashes (``capacity_bytes`` -> ``capacity``)."""
    base = re.sub(r"_(bytes|s)$", "", field_name)
    return base.replace("_", "-")


def env_name(field_name: str) -> str:
    """The environment variable of a field: ``GATEWAY_`` + its flag, in capitals."""
    return "GATEWAY_" + flag_name(field_name).upper().replace("-", "_")


def shown_default(field_name: str) -> str:
    """A Settings default as --help shows it: sizes in binary units (``64MiB``), numbers
    without a trailing ``.0``, lists comma-separated, booleans as ``true``/``false``, and
    ``none`` for an unset value."""
    value = _DEFAULTS[field_name]
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    if field_name.endswith("_bytes"):
        return format_size(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def format_size(value: int) -> str:
    """``64MiB`` for 64 * MiB: the largest binary unit that divides it (what parse_size
    reads back to the same number); ``0`` for 0."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if value and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(Settings)}
_DESCRIPTION = """\
Run the gateway. Each option is also read from GATEWAY_<OPTION>
(GATEWAY_DATA_DIR, ...) and from a key of the --config YAML file
(data_dir: ...); flags beat environment beat file. Sizes in binary units
(64MiB, 1.5TiB). More in README.md, section Configuration."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The description as written; the option column wide enough for most flags to keep
    their text on the same line; no wider than 100 columns on a wide terminal."""

    def __init__(self, prog: str) -> None:
        width = min(shutil.get_terminal_size().columns, 100) - 2
        super().__init__(prog, max_help_position=34, width=width)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every option of ``gateway serve`` on ``parser``, in its --help group with its
    default. Flags default to None: ``load`` fills what was not given from env, file and
    Settings, in that order."""
    parser.usage = "%(prog)s [--config FILE] [OPTION ...]"
    parser.description = _DESCRIPTION
    parser.formatter_class = _HelpFormatter
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML config file")
    for title, options in GROUPS:
        group = parser.add_argument_group(title)
        for name, option in options.items():
            text = f"{option.help} (default: {shown_default(name)})"
            group.add_argument(
                f"--{flag_name(name)}",
                dest=name,
                default=None,
                metavar=option.metavar,
                help=text.replace("%", "%%"),  # argparse %-formats help strings
            )


def load(args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Merge flags, env and file into Settings. Raises ConfigError naming the bad setting."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    config_path = getattr(args, "config", None) or env.get("GATEWAY_CONFIG")
    if config_path:
        values.update(_from_file(Path(config_path)))
    for name in _OPTIONS:
        variable = env_name(name)
        if variable in env:
            values[name] = env[variable]
        flag_value = getattr(args, name, None) if args is not None else None
        if flag_value is not None:
            values[name] = flag_value
    converted: dict[str, Any] = {}
    for name, raw in values.items():
        try:
            converted[name] = _OPTIONS[name].convert(raw) if raw is not None else None
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
    if settings.peer_lease_s <= 0 or settings.peer_refresh_s <= 0:
        raise ConfigError("peer-lease and peer-refresh must be positive")
    if settings.peer_read_timeout_s <= 0:
        raise ConfigError("peer-read-timeout must be positive")
    if settings.replicas < 0 or (settings.replicas > 0 and settings.peers is None):
        raise ConfigError("replicas must be 0, or at least 1 with --peers (members to hold them)")
    if settings.peer_timeout_s < 3 * settings.peer_lease_s:
        raise ConfigError("peer-timeout must be at least 3 times peer-lease")
    if not settings.control_prefix.endswith("/") or len(settings.control_prefix) < 2:
        raise ConfigError("control-prefix must be a prefix ending in / (e.g. .gateway/)")
    for name in ("credentials_file", "admin_token_file", "tls_cert", "tls_key", "peer_secret_file"):
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
