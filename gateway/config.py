"""Settings: one frozen object, loaded once from flags, ``GATEWAY_*`` env and a YAML file.

Precedence: command-line flag > environment variable > config file > default. Every option
has all three spellings: ``--flush-concurrency`` / ``GATEWAY_FLUSH_CONCURRENCY`` /
``flush_concurrency:`` (dashes also accepted in the file).
"""

from __future__ import annotations

import argparse
import os
import re
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


def _host_port(value: str) -> str:
    _, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
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
    # Uploads in flight to the upstream at once.
    flush_concurrency: int = 8
    # Full-jitter backoff of failed uploads: first retry within base, capped at max.
    flush_retry_base_s: float = 0.2
    flush_retry_max_s: float = 30.0
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
    "upstream_endpoint": (str, "real S3 endpoint URL; omit for the embedded demo upstream"),
    "upstream_region": (str, "upstream region"),
    "upstream_addressing_style": (_choice("auto", "path", "virtual"), "upstream addressing style"),
    "access_key": (str, "client access key id"),
    "secret_key": (str, "client secret key"),
    "durability": (_choice("fsync", "none"), "fsync (default) or none"),
    "capacity_bytes": (parse_size, "local cache capacity (e.g. 500GiB)"),
    "domain": (str, "base domain for virtual-hosted-style addressing"),
    "flush_concurrency": (int, "uploads in flight at once"),
    "flush_retry_base_s": (float, "first retry backoff ceiling, seconds"),
    "flush_retry_max_s": (float, "backoff cap, seconds"),
    "max_object_bytes": (parse_size, "largest PutObject body or part"),
    "min_part_bytes": (parse_size, "smallest non-last multipart part"),
    "shutdown_drain_timeout_s": (float, "seconds to keep flushing after SIGTERM"),
    "tls_cert": (Path, "PEM certificate chain: serve S3 over https"),
    "tls_key": (Path, "PEM private key for --tls-cert"),
    "demo_bucket": (str, "bucket created in the embedded demo upstream"),
    "log_level": (_choice("debug", "info", "warning", "error"), "log level"),
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
    if not settings.is_demo and settings.access_key is None:
        raise ConfigError("access-key/secret-key are required with an upstream endpoint")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ConfigError("tls-cert and tls-key go together")
    if settings.flush_concurrency < 1:
        raise ConfigError("flush-concurrency must be at least 1")
