-- idempotent-jobs, schema version 1: one row per job that committed; the claim that makes reruns skip.
CREATE TABLE done_jobs (
    -- SHA-256 of the job key: fixed size, so any key fits the index.
    key_digest  BLOB PRIMARY KEY NOT NULL CHECK (length(key_digest) = 32),
    -- The readable key, control characters percent-encoded.
    job_key     TEXT NOT NULL,
    job_name    TEXT NOT NULL,
    -- The handler's Ok value as JSON; NULL for () and null.
    result      TEXT,
    fingerprint BLOB,
    -- UTC, from the database's clock.
    done_at     TIMESTAMP NOT NULL,
    expires_at  TIMESTAMP
) WITHOUT ROWID;

CREATE INDEX done_jobs_expires_at ON done_jobs (expires_at) WHERE expires_at IS NOT NULL;
INSERT INTO idempotent_schema (version, description, applied_at) VALUES (1, 'done_jobs', strftime('%Y-%m-%d %H:%M:%f', 'now'));
