-- idempotent-jobs, schema version 4 (MySQL and MariaDB only): a job's transaction opened and
-- closed in one round trip each. `idempotent_begin_job` opens the transaction with the job's
-- savepoint; `idempotent_finish_job` releases the savepoint and commits. A body that ended the
-- transaction behind the job's back (an implicit commit, `COMMIT`, `START TRANSACTION`) took the
-- savepoint with it: the release fails (1305) and the procedure stops before `COMMIT`.
-- Without these procedures (or without `EXECUTE` on them) jobs still run correctly, with the
-- savepoint and its release as statements of their own: 6 round trips for a job of one statement
-- instead of 4.
-- Sent as one batch (Diesel's `batch_execute`, most migration tools); the `mysql` command-line
-- client needs `DELIMITER //` around the two `CREATE PROCEDURE` statements.
DROP PROCEDURE IF EXISTS idempotent_begin_job;
CREATE PROCEDURE idempotent_begin_job() SQL SECURITY INVOKER
BEGIN
  START TRANSACTION;
  SAVEPOINT idempotent_job;
END;
DROP PROCEDURE IF EXISTS idempotent_finish_job;
CREATE PROCEDURE idempotent_finish_job() SQL SECURITY INVOKER
BEGIN
  RELEASE SAVEPOINT idempotent_job;
  COMMIT;
END;
-- IGNORE: a migration on another Galera node may have recorded this step first.
INSERT IGNORE INTO idempotent_schema (version, description, applied_at) VALUES (4, 'idempotent_begin_job, idempotent_finish_job', UTC_TIMESTAMP(6));
