-- idempotent-jobs, schema version 1: one row per job that committed; the claim that makes reruns skip.
CREATE TABLE done_jobs (
    -- SHA-256 of the job key: fixed size, so any key fits the index (a btree entry is capped near 2.7 kB).
    key_digest  BYTEA PRIMARY KEY CHECK (octet_length(key_digest) = 32),
    -- The readable key, control characters percent-encoded (text cannot hold NUL).
    job_key     TEXT NOT NULL,
    job_name    TEXT NOT NULL,
    -- The handler's Ok value as JSON; NULL for () and null.
    result      TEXT,
    fingerprint BYTEA,
    -- UTC, from the database's clock.
    done_at     TIMESTAMP NOT NULL,
    expires_at  TIMESTAMP
);

CREATE INDEX done_jobs_expires_at ON done_jobs (expires_at) WHERE expires_at IS NOT NULL;
INSERT INTO idempotent_schema (version, description, applied_at) VALUES (1, 'done_jobs', clock_timestamp() AT TIME ZONE 'UTC');
