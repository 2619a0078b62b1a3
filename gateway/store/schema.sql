-- The journal: one row per (bucket, key) holding the newest acknowledged version or delete.
-- seq is the global acknowledgement order (and the version's generation): a flush result is
-- applied only if the row still has the seq that was uploaded.
CREATE TABLE IF NOT EXISTS objects (
    bucket          TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    seq             INTEGER NOT NULL,
    state           TEXT    NOT NULL,          -- pending | flushing | durable | failed
    is_delete       INTEGER NOT NULL DEFAULT 0,-- 1: a tombstone (delete not yet upstream)
    blob_id         TEXT,                      -- single-part body; NULL for tombstones
    parts           TEXT,                      -- multipart: JSON [[blob_id, size, etag, checksum], ...]
    size_bytes      INTEGER NOT NULL,
    etag            TEXT    NOT NULL,
    last_modified_s REAL    NOT NULL,
    content_type    TEXT    NOT NULL,
    user_metadata   TEXT    NOT NULL,          -- JSON object
    headers         TEXT    NOT NULL,          -- JSON object
    checksums       TEXT    NOT NULL,          -- JSON object
    attempts        INTEGER NOT NULL DEFAULT 0,
    last_error      TEXT,
    not_before_s    REAL    NOT NULL DEFAULT 0,-- wall clock: earliest next flush attempt
    acked_s         REAL    NOT NULL,          -- wall clock of the acknowledgement
    flushed_before  INTEGER NOT NULL DEFAULT 0,-- 1: an older version was sent upstream by us
    -- Drain fence: seq of the oldest acknowledged version of this key not yet durable
    -- upstream (carried over while superseded versions are pending; = seq otherwise).
    -- Added by a migration in Journal.open() for journals created without it (NULL = seq).
    fence_seq       INTEGER,
    PRIMARY KEY (bucket, key)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS objects_by_state ON objects (state, seq);

CREATE TABLE IF NOT EXISTS buckets (
    name      TEXT PRIMARY KEY,
    created_s REAL NOT NULL
) WITHOUT ROWID;

-- The upstream this data dir's rows were acknowledged for (store/origin.py): 'demo' (the
-- embedded, in-memory demo upstream) or a real endpoint's normalised URL. One row, written
-- before the first write is acknowledged; changed only when nothing is left to flush there.
CREATE TABLE IF NOT EXISTS upstream (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    endpoint    TEXT NOT NULL,
    recorded_s  REAL NOT NULL                  -- wall clock of the record
);

CREATE TABLE IF NOT EXISTS counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

-- Multipart uploads in progress. Parts are durable on ack; completing moves the part list
-- into the object's row (no data is copied) and deletes these rows.
CREATE TABLE IF NOT EXISTS uploads (
    upload_id       TEXT PRIMARY KEY,
    bucket          TEXT NOT NULL,
    key             TEXT NOT NULL,
    created_s       REAL NOT NULL,
    content_type    TEXT NOT NULL,
    user_metadata   TEXT NOT NULL,
    headers         TEXT NOT NULL,
    checksum_algorithm TEXT,                   -- x-amz-checksum-algorithm at create, lower-case
    checksum_type   TEXT                       -- COMPOSITE | FULL_OBJECT
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS uploads_by_key ON uploads (bucket, key, upload_id);

CREATE TABLE IF NOT EXISTS parts (
    upload_id       TEXT    NOT NULL,
    part_number     INTEGER NOT NULL,
    blob_id         TEXT    NOT NULL,
    size_bytes      INTEGER NOT NULL,
    etag            TEXT    NOT NULL,
    checksums       TEXT    NOT NULL,
    last_modified_s REAL    NOT NULL,
    PRIMARY KEY (upload_id, part_number)
) WITHOUT ROWID;

-- Upstream multipart uploads the flusher has created and not yet completed or aborted.
-- A row left behind by a crash is aborted at the next start (never left to accrue cost).
CREATE TABLE IF NOT EXISTS upstream_uploads (
    upload_id  TEXT PRIMARY KEY,
    bucket     TEXT NOT NULL,
    key        TEXT NOT NULL,
    created_s  REAL NOT NULL
) WITHOUT ROWID;

-- Multipart uploads completed recently: a repeated CompleteMultipartUpload (an SDK retrying
-- after a lost response) answers as the first did while the key's row is still the version
-- that completion made (its seq). Rows older than the retention are pruned at each completion.
CREATE TABLE IF NOT EXISTS completed_uploads (
    upload_id    TEXT PRIMARY KEY,
    bucket       TEXT    NOT NULL,
    key          TEXT    NOT NULL,
    seq          INTEGER NOT NULL,             -- objects.seq of the version it made
    etag         TEXT    NOT NULL,
    size_bytes   INTEGER NOT NULL,
    checksums    TEXT    NOT NULL,             -- JSON object, as in objects.checksums
    completed_s  REAL    NOT NULL              -- wall clock of the completion
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS completed_uploads_by_time ON completed_uploads (completed_s);

-- Body files a read has verified against their recorded digest, as they were then (inode,
-- size, mtime, ctime): a restarted gateway trusts them until the file changes, as the
-- running one does (core/integrity.py). The newest entries only (pruned when saving).
CREATE TABLE IF NOT EXISTS verified_files (
    id          INTEGER PRIMARY KEY,
    blob_id     TEXT    NOT NULL,
    ino         INTEGER NOT NULL,
    size_bytes  INTEGER NOT NULL,
    mtime_ns    INTEGER NOT NULL,
    ctime_ns    INTEGER NOT NULL
);

-- The fleet (docs/fleet.md): the other gateways this one has known, remembered so that a
-- restart, or a node that drops out of discovery, does not make it forget a node that may
-- hold acknowledged writes. A row goes only when the node says goodbye (has_left) or an
-- operator forgets it.
CREATE TABLE IF NOT EXISTS fleet_members (
    node_id     TEXT PRIMARY KEY,
    address     TEXT NOT NULL,
    datadir_id  TEXT,                          -- the node's data-dir id when last seen
    has_left    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- This data dir's identity: one row, drawn when the journal is created. A node that comes
-- back with an empty disk has a new one, which its peers can tell.
CREATE TABLE IF NOT EXISTS datadir_identity (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    datadir_id  TEXT NOT NULL
);

-- Replicas this node holds for other gateways of its fleet (docs/fleet.md, "Node loss").
-- A body arrives *staged* (durable here, its writer has not committed it yet); the writer's
-- commit turns it into a replica: the version's row in ``replicas``, its bodies kept in
-- ``replica_bodies`` (committed = 1). A replica goes when its writer says the version is
-- durable upstream or superseded, or once it was taken over and uploaded.
CREATE TABLE IF NOT EXISTS replica_bodies (
    stage_id    TEXT PRIMARY KEY,              -- the writer's id for this body
    owner       TEXT NOT NULL,                 -- the writer's node id
    bucket      TEXT NOT NULL,
    key         TEXT NOT NULL,
    upload_id   TEXT,                          -- a part of a multipart upload; NULL: a body
    part_number INTEGER,
    blob_id     TEXT,                          -- its file; NULL when small: then ``body``
    body        BLOB,                          -- a small body itself (one journal commit)
    size_bytes  INTEGER NOT NULL,
    md5         TEXT NOT NULL,                 -- hex
    crc32c      INTEGER,
    committed   INTEGER NOT NULL DEFAULT 0,
    created_s   REAL NOT NULL
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS replica_bodies_by_upload ON replica_bodies (owner, upload_id);

CREATE TABLE IF NOT EXISTS replicas (
    owner       TEXT NOT NULL,                 -- the writer's node id ...
    datadir_id  TEXT NOT NULL,                 -- ... and data dir: a version's identity
    seq         INTEGER NOT NULL,              -- with its sequence number on the writer
    bucket      TEXT NOT NULL,
    key         TEXT NOT NULL,
    is_delete   INTEGER NOT NULL,
    meta        TEXT NOT NULL,                 -- JSON: the version's metadata
    stage_ids   TEXT NOT NULL,                 -- JSON: its bodies, in part order
    parts       TEXT,                          -- JSON [[size, etag], ...]: multipart
    size_bytes  INTEGER NOT NULL,
    acked_s     REAL NOT NULL,                 -- the writer's acknowledgement (wall clock)
    uploaded    INTEGER NOT NULL DEFAULT 0,    -- taken over and uploaded by this node
    -- Committed here beside the writer's own commit, before it (a PutObject's early
    -- commit): it may never have committed there, so it supersedes nothing here.
    is_early    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, datadir_id, seq)
) WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS replicas_by_key ON replicas (bucket, key);

-- Versions of this node acknowledged with fewer replicas than --replicas asked for
-- (--replica-policy degrade): said in their reads' x-gateway-replicas until they are
-- durable upstream or have their copies after all (store/copies.py).
CREATE TABLE IF NOT EXISTS short_copies (
    bucket      TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    copies      INTEGER NOT NULL,              -- holders that committed it
    wanted      INTEGER NOT NULL,              -- --replicas when it was written
    PRIMARY KEY (bucket, key)
) WITHOUT ROWID;

-- What the flusher learnt of each bucket's request rate (flush/memory.py): a restarted
-- gateway slow-starts to it in a fraction of a second instead of finding it again.
CREATE TABLE IF NOT EXISTS bucket_rates (
    bucket      TEXT PRIMARY KEY,
    rate_per_s  REAL NOT NULL,                 -- what the upstream accepted when it last throttled
    recorded_s  REAL NOT NULL                  -- wall clock of the record
) WITHOUT ROWID;
