-- idempotent-jobs: the schema version of the runtime's own tables, one row per applied step.
-- Kept beside the runtime's tables; the application's own migration table is never written.
CREATE TABLE idempotent_schema (
    version     INTEGER PRIMARY KEY NOT NULL,
    description TEXT NOT NULL,
    applied_at  TIMESTAMP NOT NULL
);
