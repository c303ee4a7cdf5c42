-- idempotent-jobs: the schema version of the runtime's own tables, one row per applied step.
-- Kept beside the runtime's tables; the application's own migration table is never written.
CREATE TABLE idempotent_schema (
    version     INTEGER NOT NULL PRIMARY KEY,
    description VARCHAR(255) NOT NULL,
    applied_at  DATETIME(6) NOT NULL
) ENGINE = InnoDB;
