-- idempotent-jobs, schema version 2: messages recorded in a job's transaction, sent after it commits by a relay.
CREATE TABLE outbox (
    id           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- Stable across reruns of the job that pushed it: receivers drop duplicates by it.
    message_id   VARCHAR(100) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    topic        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- JSON.
    payload      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The pushing job's key, as shown in done_jobs.
    job_key      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    -- UTC, from the database's clock.
    created_at   DATETIME(6) NOT NULL,
    -- Not sent before this (a failed delivery backs off).
    available_at DATETIME(6) NOT NULL,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    -- A relay holds the message while it sends it.
    lease_owner  VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    lease_until  DATETIME(6) NULL,
    delivered_at DATETIME(6) NULL,
    -- Set after too many failed attempts; cleared by a retry by hand.
    parked_at    DATETIME(6) NULL,
    UNIQUE KEY outbox_message_id (message_id),
    INDEX outbox_pending (delivered_at, parked_at, available_at, id),
    INDEX outbox_delivered (delivered_at)
) ENGINE = InnoDB;
-- IGNORE: a migration on another Galera node may have recorded this step first.
INSERT IGNORE INTO idempotent_schema (version, description, applied_at) VALUES (2, 'outbox', UTC_TIMESTAMP(6));
