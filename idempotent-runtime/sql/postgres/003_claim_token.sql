-- idempotent-jobs, schema version 3: which run claimed each key, so that a run whose transaction
-- the database ended under it (an implicit commit, or a rollback it did not report) takes back its
-- own claim and never another run's. A nullable column with no default: added without rewriting
-- or locking the table for long.
ALTER TABLE done_jobs ADD COLUMN claim_token BIGINT;
INSERT INTO idempotent_schema (version, description, applied_at) VALUES (3, 'done_jobs.claim_token', clock_timestamp() AT TIME ZONE 'UTC');
