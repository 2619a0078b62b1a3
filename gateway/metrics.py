"""Prometheus metrics of the process, in one registry served by the admin listener.

A bottom-layer module (like ``errors`` and ``clock``): every layer may record into it, none
depends on another through it. Counters count since process start (Prometheus convention);
gauges that mirror journal state are refreshed at each scrape by the admin API.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()

# Buckets from 250 µs (an fsync on fast NVMe) to 10 s (a large multipart part).
_LATENCY_BUCKETS_S = (
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)

ACK_LATENCY_S = Histogram(
    "gateway_ack_latency_seconds",
    "Time from request start to the acknowledgement of a write, by S3 operation",
    ["operation"],
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
INGEST_OBJECTS = Counter(
    "gateway_ingest_objects",
    "Write requests acknowledged, by S3 operation (a DeleteObjects request counts once)",
    ["operation"],
    registry=REGISTRY,
)
INGEST_BYTES = Counter(
    "gateway_ingest_bytes",
    "Request body bytes (decoded) acknowledged by PutObject and UploadPart",
    registry=REGISTRY,
)
FLUSH_OBJECTS = Counter(
    "gateway_flush_objects", "Objects (and deletes) made durable upstream", registry=REGISTRY
)
FLUSH_BYTES = Counter("gateway_flush_bytes", "Bytes made durable upstream", registry=REGISTRY)
FLUSH_RETRIES = Counter(
    "gateway_flush_retries",
    "Flush attempts that failed transiently and were rescheduled",
    registry=REGISTRY,
)
FLUSH_THROTTLES = Counter(
    "gateway_flush_throttles",
    "Flush attempts answered 503 SlowDown (or another throttle) by the upstream, by lane",
    ["bucket", "lane"],
    registry=REGISTRY,
)
FLOW_SHARES_TAKEN = Counter(
    "gateway_flow_shares_taken",
    "Shares of a bucket's rate taken over from a fleet member that stopped sending to it",
    ["bucket"],
    registry=REGISTRY,
)
FLOW_SHARES_TAKEN_RATE = Counter(
    "gateway_flow_shares_taken_requests_per_second",
    "Requests/s added to a bucket's rate by shares taken over from fleet members",
    ["bucket"],
    registry=REGISTRY,
)
FLOW_CUTS_FOLLOWED = Counter(
    "gateway_flow_cuts_followed",
    "Cuts of a bucket's rate made because a fleet member sending to it was throttled",
    ["bucket"],
    registry=REGISTRY,
)
FLUSH_FAILURES = Counter(
    "gateway_flush_failures", "Flushes that failed permanently (state failed)", registry=REGISTRY
)
UPSTREAM_REQUESTS = Counter(
    "gateway_upstream_requests",
    "Requests sent to the upstream bucket, by S3 operation and HTTP status",
    ["operation", "status"],
    registry=REGISTRY,
)
LANE_RATE = Gauge(
    "gateway_lane_rate_limit_per_second",
    "Request rate each prefix lane may send now (its bucket's adaptive budget, or its own "
    "when isolated; capped by --lane-rate): a limit, not what it sends",
    ["bucket", "lane"],
    registry=REGISTRY,
)
LANE_ACCEPTED = Gauge(
    "gateway_lane_accepted_per_second",
    "Requests of each prefix lane the upstream accepted per second over the last 10 s "
    "(measured; 0 when idle or paused)",
    ["bucket", "lane"],
    registry=REGISTRY,
)
LANE_PENDING_OBJECTS = Gauge(
    "gateway_lane_pending_objects",
    "Objects of each prefix lane that will flush on their own (failed and held apart)",
    ["bucket", "lane"],
    registry=REGISTRY,
)
LANE_PENDING_BYTES = Gauge(
    "gateway_lane_pending_bytes",
    "Bytes of each prefix lane that will flush on their own (failed and held apart)",
    ["bucket", "lane"],
    registry=REGISTRY,
)
PENDING_OBJECTS = Gauge(
    "gateway_pending_objects",
    "Acknowledged objects not durable upstream yet that will flush on their own (queued, "
    "backing off or flushing); failed and held objects are counted apart",
    registry=REGISTRY,
)
PENDING_BYTES = Gauge(
    "gateway_pending_bytes",
    "Bytes of gateway_pending_objects (failed and held apart)",
    registry=REGISTRY,
)
FAILED_OBJECTS = Gauge(
    "gateway_failed_objects",
    "Objects whose flush failed permanently: they wait for `gateway retry`",
    registry=REGISTRY,
)
FAILED_BYTES = Gauge("gateway_failed_bytes", "Bytes of gateway_failed_objects", registry=REGISTRY)
HELD_OBJECTS = Gauge(
    "gateway_held_objects",
    "Commit markers held back behind a failed object (they flush after `gateway retry`)",
    registry=REGISTRY,
)
UNFLUSHED_OBJECTS = Gauge(
    "gateway_unflushed_objects",
    "Acknowledged objects not durable upstream yet: pending + failed + held",
    registry=REGISTRY,
)
UNFLUSHED_BYTES = Gauge(
    "gateway_unflushed_bytes",
    "Acknowledged bytes not durable upstream yet: pending + failed + held",
    registry=REGISTRY,
)
IN_FLIGHT_SENT_BYTES = Gauge(
    "gateway_flush_in_flight_sent_bytes",
    "Bytes already sent of the uploads in flight (part of gateway_pending_bytes)",
    registry=REGISTRY,
)
FLUSH_RATE = Gauge(
    "gateway_flush_rate_bytes_per_second",
    "Bytes flushed per second over the last 10 s, bytes sent of uploads in flight included "
    "(measured; 0 when idle)",
    registry=REGISTRY,
)
FLUSH_PAUSED = Gauge(
    "gateway_flush_paused", "1 while the flusher is paused (`gateway resume`)", registry=REGISTRY
)
RECOVERY_POINT_S = Gauge(
    "gateway_oldest_unflushed_seconds",
    "Recovery point: age of the oldest acknowledged write not yet durable upstream",
    registry=REGISTRY,
)
FLUSHED_OBJECTS = Gauge(
    "gateway_flushed_objects",
    "Objects made durable upstream since the data directory was created (kept in the journal)",
    registry=REGISTRY,
)
FLUSHED_BYTES = Gauge(
    "gateway_flushed_bytes",
    "Bytes made durable upstream since the data directory was created (kept in the journal)",
    registry=REGISTRY,
)
CACHE_USED_BYTES = Gauge(
    "gateway_cache_used_bytes", "Bytes of object bodies on local disk", registry=REGISTRY
)
EVICTED_OBJECTS = Counter(
    "gateway_cache_evicted_objects",
    "Flushed objects evicted from the local cache (least recently used first)",
    registry=REGISTRY,
)
EVICTED_BYTES = Counter(
    "gateway_cache_evicted_bytes", "Bytes of flushed objects evicted", registry=REGISTRY
)
CAPACITY_REFUSALS = Counter(
    "gateway_capacity_refusals",
    "Writes refused with 503 SlowDown because unflushed bytes would exceed the capacity",
    registry=REGISTRY,
)
DISK_FULL_ERRORS = Counter(
    "gateway_disk_full_errors",
    "Writes that hit ENOSPC/EDQUOT on the data directory (answered 503 SlowDown)",
    registry=REGISTRY,
)
READTHROUGH_CACHED = Counter(
    "gateway_readthrough_cached_objects",
    "Upstream objects kept in the local cache after a full read-through GET",
    registry=REGISTRY,
)
STALE_COPIES_DROPPED = Counter(
    "gateway_stale_copies_dropped",
    "Durable copies dropped because the bucket had another version, written through "
    "another node of the fleet (reads then go to the bucket)",
    registry=REGISTRY,
)
CORRUPT_BLOBS = Counter(
    "gateway_corrupt_blobs",
    "Local bodies found not to match their recorded digest (GET, flush or verify)",
    registry=REGISTRY,
)
READ_VERIFIED_BYTES = Counter(
    "gateway_read_verified_bytes",
    "Bytes of local body files hashed to verify them for GET (once per file until it changes)",
    registry=REGISTRY,
)
GET_BODY_BYTES = Counter(
    "gateway_get_body_bytes",
    "GET body bytes sent, by how: sendfile (zero-copy), splice (zero-copy, a peer's answer), "
    "copy (read and write: TLS), stream (bytes from the upstream or a peer)",
    ["how"],
    registry=REGISTRY,
)
READTHROUGH_BYTES = Counter(
    "gateway_readthrough_bytes",
    "Bytes fetched from the upstream by read-through fills (parallel ranged GETs)",
    registry=REGISTRY,
)

# -- the fleet (issue 20) ---------------------------------------------------------------------
PEER_READ_FALLBACKS = Counter(
    "gateway_peer_read_fallbacks",
    "Reads that left out a peer which may hold an unflushed version (it did not answer in "
    "time): the read was answered from this node and the bucket",
    registry=REGISTRY,
)
PEER_READS = Counter(
    "gateway_peer_reads",
    "GET/HEAD/LIST requests answered with a version or rows another gateway holds unflushed",
    registry=REGISTRY,
)
FLEET_MEMBERS = Gauge(
    "gateway_fleet_members",
    "Other gateways of the fleet, by state (reachable, unreachable, unknown, left)",
    ["state"],
    registry=REGISTRY,
)
FLEET_HELD_MARKERS = Gauge(
    "gateway_fleet_held_markers",
    "Commit markers held until every member of the fleet drained their directory",
    registry=REGISTRY,
)

# -- replicas and takeover (issue 21) --------------------------------------------------------
REPLICA_DEGRADED = Counter(
    "gateway_replica_degraded_acks",
    "Writes acknowledged with fewer replicas than --replicas (--replica-policy degrade)",
    registry=REGISTRY,
)
REPLICA_HELD_BYTES = Gauge(
    "gateway_replica_held_bytes",
    "Bytes of replicas this node holds for other gateways of its fleet (staged or committed)",
    registry=REGISTRY,
)
REPLICA_LAG_S = Histogram(
    "gateway_replica_lag_seconds",
    "Time a write spends making its replicas: from its local commit to its last replica "
    "commit (the part of the ack latency replicas add after the body)",
    buckets=_LATENCY_BUCKETS_S,
    registry=REGISTRY,
)
REPLICAS_REMADE = Counter(
    "gateway_replicas_remade",
    "Versions of this node sent to a new replica holder after one of their holders was lost "
    "(silent for --peer-timeout, or back with an empty disk)",
    registry=REGISTRY,
)
TAKEOVERS = Counter(
    "gateway_takeovers",
    "Versions of a lost gateway this node uploaded from its replicas (it won their claim)",
    registry=REGISTRY,
)
