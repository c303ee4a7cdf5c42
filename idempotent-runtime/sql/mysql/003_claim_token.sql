-- idempotent-jobs, schema version 3: which run claimed each key, so that a run whose transaction
-- the database ended under it (an implicit commit, or a rollback it did not report) takes back its
-- own claim and never another run's. A nullable column with no default: added without rewriting
-- or locking the table for long (MariaDB 10.3+ and MySQL 8 add it in place, instantly).
ALTER TABLE done_jobs ADD COLUMN claim_token BIGINT NULL;
-- IGNORE: a migration on another Galera node may have recorded this step first.
INSERT IGNORE INTO idempotent_schema (version, description, applied_at) VALUES (3, 'done_jobs.claim_token', UTC_TIMESTAMP(6));
