-- idempotent-jobs, schema version 2: messages recorded in a job's transaction, sent after it commits by a relay.
CREATE TABLE outbox (
    id           BIGSERIAL PRIMARY KEY,
    -- Stable across reruns of the job that pushed it: receivers drop duplicates by it.
    message_id   TEXT NOT NULL UNIQUE,
    topic        TEXT NOT NULL,
    -- JSON.
    payload      TEXT NOT NULL,
    -- The pushing job's key, as shown in done_jobs.
    job_key      TEXT,
    -- UTC, from the database's clock.
    created_at   TIMESTAMP NOT NULL,
    -- Not sent before this (a failed delivery backs off).
    available_at TIMESTAMP NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT,
    -- A relay holds the message while it sends it.
    lease_owner  TEXT,
    lease_until  TIMESTAMP,
    delivered_at TIMESTAMP,
    -- Set after too many failed attempts; cleared by a retry by hand.
    parked_at    TIMESTAMP
);

CREATE INDEX outbox_pending ON outbox (available_at, id) WHERE delivered_at IS NULL AND parked_at IS NULL;
CREATE INDEX outbox_delivered ON outbox (delivered_at) WHERE delivered_at IS NOT NULL;
INSERT INTO idempotent_schema (version, description, applied_at) VALUES (2, 'outbox', clock_timestamp() AT TIME ZONE 'UTC');
