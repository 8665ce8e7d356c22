//! The gateway's own tables, next to fencecheck's layout in the same
//! database (SQLite file or PostgreSQL database): what the publish protocol
//! does not keep about a blob, and the index its hot path needs.
//!
//! - `fencecheck_gateway_meta`: the store id, the prefix of every blob name
//!   (two gateways sharing one upstream never name a blob alike).
//! - `fencecheck_gateway_objects`: per staged blob, its length, SHA-256,
//!   Content-Type, Idempotency-Key, S3 ETag (`etag`: the MD5, or the
//!   multipart form, of a blob written through the S3 front; NULL for one
//!   written through `/objects`, added by [`SQLITE_ETAG`] and
//!   [`POSTGRES_ETAG`] to stores made before it) and S3 user metadata
//!   (`metadata`, a JSON object; added likewise); written after the upload,
//!   before the publish, and deleted with its object (trigger).
//! - `fencecheck_gateway_ops`: per key, the body hash each recent
//!   Idempotency-Key was applied with, written by a trigger in the publish's
//!   own transaction (so it is exact: no crash can separate the two), pruned
//!   to the 64 latest per key (the component's idempotency window holds 32).
//! - `fencecheck_gateway_parts`: the parts of the S3 front's multipart
//!   uploads. An upload is a staged object named `upload TOKEN` (its id is
//!   the UploadId), each part a staged object named `part UPLOAD` with its
//!   facts in `fencecheck_gateway_objects`; none is ever visible, so the
//!   collector takes them after `--retention` like any unpublished blob,
//!   and a trigger drops an upload's rows with the upload's object.
//! - `fencecheck_gateway_completed`: uploads Complete published (the
//!   version and ETag it answered), so a Complete retried after its answer
//!   was lost gets that answer again instead of `NoSuchUpload`; pruned by
//!   the collector `--retention` after the completion.
//! - An index on `fencecheck_scopes (visible_object)`: "is this object
//!   referenced?" (discard, the collector) without scanning every pointer.

pub(crate) const SQLITE: &str = "
CREATE TABLE IF NOT EXISTS fencecheck_gateway_meta (
    key   TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fencecheck_gateway_objects (
    object       INTEGER PRIMARY KEY,
    length       INTEGER NOT NULL,
    sha256       BLOB    NOT NULL,
    content_type TEXT    NOT NULL,
    op_id        TEXT,
    etag         TEXT,
    metadata     TEXT
);
CREATE TABLE IF NOT EXISTS fencecheck_gateway_ops (
    scope   TEXT    NOT NULL,
    op_id   TEXT    NOT NULL,
    version INTEGER NOT NULL,
    sha256  BLOB    NOT NULL,
    PRIMARY KEY (scope, op_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS fencecheck_gateway_ops_version
    ON fencecheck_gateway_ops (scope, version);
CREATE INDEX IF NOT EXISTS fencecheck_gateway_visible
    ON fencecheck_scopes (visible_object);
CREATE TRIGGER IF NOT EXISTS fencecheck_gateway_published_update
    AFTER UPDATE OF visible_object ON fencecheck_scopes
    WHEN NEW.visible_object IS NOT NULL
BEGIN
    INSERT OR REPLACE INTO fencecheck_gateway_ops (scope, op_id, version, sha256)
        SELECT NEW.scope, g.op_id, NEW.version, g.sha256
          FROM fencecheck_gateway_objects g
         WHERE g.object = NEW.visible_object AND g.op_id IS NOT NULL;
    DELETE FROM fencecheck_gateway_ops
     WHERE scope = NEW.scope
       AND version <= (SELECT version FROM fencecheck_gateway_ops
                        WHERE scope = NEW.scope
                        ORDER BY version DESC LIMIT 1 OFFSET 64);
END;
CREATE TRIGGER IF NOT EXISTS fencecheck_gateway_published_insert
    AFTER INSERT ON fencecheck_scopes
    WHEN NEW.visible_object IS NOT NULL
BEGIN
    INSERT OR REPLACE INTO fencecheck_gateway_ops (scope, op_id, version, sha256)
        SELECT NEW.scope, g.op_id, NEW.version, g.sha256
          FROM fencecheck_gateway_objects g
         WHERE g.object = NEW.visible_object AND g.op_id IS NOT NULL;
END;
CREATE TRIGGER IF NOT EXISTS fencecheck_gateway_collected
    AFTER DELETE ON fencecheck_objects
BEGIN
    DELETE FROM fencecheck_gateway_objects WHERE object = OLD.id;
END;
CREATE TABLE IF NOT EXISTS fencecheck_gateway_parts (
    upload INTEGER NOT NULL,
    part   INTEGER NOT NULL,
    object INTEGER NOT NULL,
    PRIMARY KEY (upload, part, object)
) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS fencecheck_gateway_upload_gone
    AFTER DELETE ON fencecheck_objects
BEGIN
    DELETE FROM fencecheck_gateway_parts WHERE upload = OLD.id;
END;
CREATE TABLE IF NOT EXISTS fencecheck_gateway_completed (
    upload       INTEGER NOT NULL PRIMARY KEY,
    scope        TEXT    NOT NULL,
    version      INTEGER NOT NULL,
    etag         TEXT    NOT NULL,
    completed_ms INTEGER NOT NULL
);
";

pub(crate) const POSTGRES: &str = "
CREATE TABLE IF NOT EXISTS fencecheck_gateway_meta (
    key   text NOT NULL PRIMARY KEY,
    value text NOT NULL
);
CREATE TABLE IF NOT EXISTS fencecheck_gateway_objects (
    object       bigint NOT NULL PRIMARY KEY,
    length       bigint NOT NULL,
    sha256       bytea  NOT NULL,
    content_type text   NOT NULL,
    op_id        text,
    etag         text,
    metadata     text
);
CREATE TABLE IF NOT EXISTS fencecheck_gateway_ops (
    scope   text   NOT NULL,
    op_id   text   NOT NULL,
    version bigint NOT NULL,
    sha256  bytea  NOT NULL,
    PRIMARY KEY (scope, op_id)
);
CREATE INDEX IF NOT EXISTS fencecheck_gateway_ops_version
    ON fencecheck_gateway_ops (scope, version);
CREATE INDEX IF NOT EXISTS fencecheck_gateway_visible
    ON fencecheck_scopes (visible_object);
CREATE INDEX IF NOT EXISTS fencecheck_gateway_scopes_c
    ON fencecheck_scopes (scope COLLATE \"C\");
CREATE OR REPLACE FUNCTION fencecheck_gateway_published() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fencecheck_gateway_ops (scope, op_id, version, sha256)
        SELECT NEW.scope, g.op_id, NEW.version, g.sha256
          FROM fencecheck_gateway_objects g
         WHERE g.object = NEW.visible_object AND g.op_id IS NOT NULL
    ON CONFLICT (scope, op_id)
        DO UPDATE SET version = EXCLUDED.version, sha256 = EXCLUDED.sha256;
    DELETE FROM fencecheck_gateway_ops
     WHERE scope = NEW.scope
       AND version <= (SELECT version FROM fencecheck_gateway_ops
                        WHERE scope = NEW.scope
                        ORDER BY version DESC LIMIT 1 OFFSET 64);
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER fencecheck_gateway_published
    AFTER INSERT OR UPDATE OF visible_object ON fencecheck_scopes
    FOR EACH ROW WHEN (NEW.visible_object IS NOT NULL)
    EXECUTE FUNCTION fencecheck_gateway_published();
CREATE OR REPLACE FUNCTION fencecheck_gateway_collected() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM fencecheck_gateway_objects WHERE object = OLD.id;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER fencecheck_gateway_collected
    AFTER DELETE ON fencecheck_objects
    FOR EACH ROW EXECUTE FUNCTION fencecheck_gateway_collected();
CREATE TABLE IF NOT EXISTS fencecheck_gateway_parts (
    upload bigint  NOT NULL,
    part   integer NOT NULL,
    object bigint  NOT NULL,
    PRIMARY KEY (upload, part, object)
);
CREATE OR REPLACE FUNCTION fencecheck_gateway_upload_gone() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM fencecheck_gateway_parts WHERE upload = OLD.id;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER fencecheck_gateway_upload_gone
    AFTER DELETE ON fencecheck_objects
    FOR EACH ROW EXECUTE FUNCTION fencecheck_gateway_upload_gone();
CREATE TABLE IF NOT EXISTS fencecheck_gateway_completed (
    upload       bigint NOT NULL PRIMARY KEY,
    scope        text   NOT NULL,
    version      bigint NOT NULL,
    etag         text   NOT NULL,
    completed_ms bigint NOT NULL
);
";

/// Stores made before the S3 front: the `etag` column (SQLite has no
/// `ADD COLUMN IF NOT EXISTS`: run only when the column is missing).
pub(crate) const SQLITE_ETAG: &str = "ALTER TABLE fencecheck_gateway_objects ADD COLUMN etag TEXT";
pub(crate) const POSTGRES_ETAG: &str =
    "ALTER TABLE fencecheck_gateway_objects ADD COLUMN IF NOT EXISTS etag text";

/// Stores made before S3 user metadata was kept: the `metadata` column
/// (a JSON object of the `x-amz-meta-*` a writer sent, but its token).
pub(crate) const SQLITE_METADATA: &str =
    "ALTER TABLE fencecheck_gateway_objects ADD COLUMN metadata TEXT";
pub(crate) const POSTGRES_METADATA: &str =
    "ALTER TABLE fencecheck_gateway_objects ADD COLUMN IF NOT EXISTS metadata text";

/// The visible state of one key: the scope's version (0: never written),
/// and its visible object with the gateway's facts about it.
pub(crate) const SQLITE_HEAD: &str = "
SELECT s.version, s.published_at_ms, o.id, o.name, g.length, g.content_type, g.etag, g.metadata
  FROM fencecheck_scopes s
  LEFT JOIN fencecheck_objects o ON o.id = s.visible_object
  LEFT JOIN fencecheck_gateway_objects g ON g.object = s.visible_object
 WHERE s.scope = ?1";

pub(crate) const POSTGRES_HEAD: &str = "
SELECT s.version, s.published_at_ms, o.id, o.name, g.length, g.content_type, g.etag, g.metadata
  FROM fencecheck_scopes s
  LEFT JOIN fencecheck_objects o ON o.id = s.visible_object
  LEFT JOIN fencecheck_gateway_objects g ON g.object = s.visible_object
 WHERE s.scope = $1";

/// One page of visible blobs, by key (byte order), from `lower` (exclusive
/// if `after`), under `upper` if any.
pub(crate) const SQLITE_LIST: &str = "
SELECT s.scope, s.version, s.published_at_ms, o.name, g.length, g.content_type, g.etag
  FROM fencecheck_scopes s
  JOIN fencecheck_objects o ON o.id = s.visible_object
  LEFT JOIN fencecheck_gateway_objects g ON g.object = s.visible_object
 WHERE s.scope >= ?1 AND s.scope > ?2 AND (?3 IS NULL OR s.scope < ?3)
   AND substr(o.name, 1, 5) = 'blob '
 ORDER BY s.scope
 LIMIT ?4";

pub(crate) const POSTGRES_LIST: &str = "
SELECT s.scope, s.version, s.published_at_ms, o.name, g.length, g.content_type, g.etag
  FROM fencecheck_scopes s
  JOIN fencecheck_objects o ON o.id = s.visible_object
  LEFT JOIN fencecheck_gateway_objects g ON g.object = s.visible_object
 WHERE s.scope COLLATE \"C\" >= $1 AND s.scope COLLATE \"C\" > $2
   AND ($3::text IS NULL OR s.scope COLLATE \"C\" < $3)
   AND left(o.name, 5) = 'blob '
 ORDER BY s.scope COLLATE \"C\"
 LIMIT $4";

/// Discard an unpublished object: one statement, the reference re-checked
/// through the `visible_object` index (fencecheck-sqlite's `discard` tests
/// membership against every pointer).
pub(crate) const SQLITE_DISCARD: &str = "
DELETE FROM fencecheck_objects
 WHERE id = ?1
   AND NOT EXISTS (SELECT 1 FROM fencecheck_scopes WHERE visible_object = ?1)";

/// One bounded collector batch (SQLite: one writer at a time, so one
/// statement decides and deletes). `?1` is the later of the two cutoffs
/// (the index's range), `?3` the blobs' and `?4` the S3 uploads' (an
/// upload and its parts are kept for `--upload-retention`: a large upload
/// takes longer than a PUT's staging should be kept).
pub(crate) const SQLITE_COLLECT: &str = "
DELETE FROM fencecheck_objects WHERE id IN (
    SELECT o.id FROM fencecheck_objects o
     WHERE o.staged_at_ms <= ?1
       AND CASE WHEN substr(o.name, 1, 7) = 'upload ' OR substr(o.name, 1, 5) = 'part '
                THEN o.staged_at_ms <= ?4 ELSE o.staged_at_ms <= ?3 END
       AND NOT EXISTS (SELECT 1 FROM fencecheck_scopes s WHERE s.visible_object = o.id)
     ORDER BY o.id LIMIT ?2)
RETURNING id";

/// PostgreSQL: lock candidates (a publish pointing at one holds KEY SHARE:
/// skipped), then re-check in a later statement (fencecheck-postgres's
/// module docs explain why the two steps).
pub(crate) const POSTGRES_LOCK_GARBAGE: &str = "
SELECT o.id FROM fencecheck_objects o
 WHERE o.staged_at_ms <= $1
   AND CASE WHEN left(o.name, 7) = 'upload ' OR left(o.name, 5) = 'part '
            THEN o.staged_at_ms <= $4 ELSE o.staged_at_ms <= $3 END
   AND NOT EXISTS (SELECT 1 FROM fencecheck_scopes s WHERE s.visible_object = o.id)
 ORDER BY o.id
 LIMIT $2
 FOR UPDATE SKIP LOCKED";

pub(crate) const POSTGRES_DELETE_UNREFERENCED: &str = "
DELETE FROM fencecheck_objects o
 WHERE o.id = ANY($1)
   AND NOT EXISTS (SELECT 1 FROM fencecheck_scopes s WHERE s.visible_object = o.id)
RETURNING o.id";

/// An upload's scope and name (`upload TOKEN`), if it is still kept.
pub(crate) const SQLITE_UPLOAD: &str = "
SELECT o.scope, o.name, g.content_type, g.op_id, g.metadata
  FROM fencecheck_objects o
  LEFT JOIN fencecheck_gateway_objects g ON g.object = o.id
 WHERE o.id = ?1 AND substr(o.name, 1, 7) = 'upload '";

pub(crate) const POSTGRES_UPLOAD: &str = "
SELECT o.scope, o.name, g.content_type, g.op_id, g.metadata
  FROM fencecheck_objects o
  LEFT JOIN fencecheck_gateway_objects g ON g.object = o.id
 WHERE o.id = $1 AND left(o.name, 7) = 'upload '";

/// An upload's parts whose objects are still kept, by part number and
/// then staging order (the last upload of a part number wins).
pub(crate) const SQLITE_PARTS: &str = "
SELECT p.part, p.object, g.length, g.etag, o.staged_at_ms
  FROM fencecheck_gateway_parts p
  JOIN fencecheck_gateway_objects g ON g.object = p.object
  JOIN fencecheck_objects o ON o.id = p.object
 WHERE p.upload = ?1
 ORDER BY p.part, p.object";

pub(crate) const POSTGRES_PARTS: &str = "
SELECT p.part, p.object, g.length, g.etag, o.staged_at_ms
  FROM fencecheck_gateway_parts p
  JOIN fencecheck_gateway_objects g ON g.object = p.object
  JOIN fencecheck_objects o ON o.id = p.object
 WHERE p.upload = $1
 ORDER BY p.part, p.object";

/// The uploads of the S3 front begun since `?1` (ms) whose keys start
/// with `?2` (and sort below `?3`, if given), after the upload `?5` of key
/// `?4` in (key, UploadId) order: ListMultipartUploads' pages. The staging
/// time bounds the scan through `fencecheck_objects_staged` (an upload
/// older than `--retention` is the collector's), not every object kept.
pub(crate) const SQLITE_UPLOADS: &str = "
SELECT o.id, o.scope, o.staged_at_ms
  FROM fencecheck_objects o
 WHERE o.staged_at_ms > ?1
   AND substr(o.name, 1, 7) = 'upload '
   AND o.scope >= ?2 AND (?3 IS NULL OR o.scope < ?3)
   AND (o.scope > ?4 OR (o.scope = ?4 AND o.id > ?5))
 ORDER BY o.scope, o.id
 LIMIT ?6";

pub(crate) const POSTGRES_UPLOADS: &str = "
SELECT o.id, o.scope, o.staged_at_ms
  FROM fencecheck_objects o
 WHERE o.staged_at_ms > $1
   AND left(o.name, 7) = 'upload '
   AND o.scope COLLATE \"C\" >= $2
   AND ($3::text IS NULL OR o.scope COLLATE \"C\" < $3)
   AND (o.scope COLLATE \"C\" > $4 OR (o.scope = $4 AND o.id > $5))
 ORDER BY o.scope COLLATE \"C\", o.id
 LIMIT $6";
