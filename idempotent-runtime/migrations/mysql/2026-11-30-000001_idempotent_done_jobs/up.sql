-- idempotent: one row per job that committed; the claim that makes reruns skip.
CREATE TABLE done_jobs (
    -- SHA-256 of the job key: fixed size and binary, so any key fits the index and no collation
    -- folds two keys into one.
    key_digest  BINARY(32) NOT NULL PRIMARY KEY,
    -- The readable key, control characters percent-encoded.
    job_key     LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    job_name    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The handler's Ok value as JSON; NULL for () and null.
    result      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    fingerprint VARBINARY(64),
    -- UTC, from the worker's clock.
    done_at     DATETIME(6) NOT NULL,
    expires_at  DATETIME(6) NULL,
    INDEX done_jobs_expires_at (expires_at)
) ENGINE = InnoDB;
