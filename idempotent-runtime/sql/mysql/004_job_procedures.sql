-- idempotent-jobs, schema version 4 (MySQL and MariaDB only): a job's transaction opened and
-- closed in one round trip each. `idempotent_begin_job` opens the transaction with the job's
-- savepoint; `idempotent_begin_and_claim` opens it, inserts the job's claim and sets the savepoint
-- after it; on the claim's duplicate-key error it rolls back (nothing is left open) and raises
-- that error again with the message the caller recognises, which then reads the key's row
-- outside any transaction: a replay in two round trips;
-- `idempotent_finish_job` releases the savepoint and commits. A body that ended the transaction
-- behind the job's back (an implicit commit, `COMMIT`, `START TRANSACTION`) took the savepoint
-- with it: the release fails (1305) and the procedure stops before `COMMIT`.
-- Both begin by refusing a session that holds a transaction of its own (a `BEGIN` sent as text,
-- or `autocommit = 0` after any statement): their `START TRANSACTION` would commit it. Setting the
-- next transaction's isolation level to the session's own (no change) is refused by the server
-- then (1568, SQLSTATE 25001), and raised again with the message the caller recognises; nothing
-- is left open, and the caller's transaction is as it was. On the key's duplicate,
-- `idempotent_begin_and_claim` says when the session has `autocommit = 0`: a read outside any
-- transaction would open one there, so the caller reads the row with a claim instead.
-- Each ends its transaction `AND NO CHAIN NO RELEASE`: a session's `completion_type` neither
-- opens the next transaction nor ends the session there.
-- Without these procedures (or without `EXECUTE` on them) jobs still run correctly, with the
-- savepoint, its release and the check that the session holds no transaction as statements of
-- their own: 7 round trips for a job of one statement instead of 3.
-- Sent as one batch (Diesel's `batch_execute`, most migration tools); the `mysql` command-line
-- client needs `DELIMITER //` around the `CREATE PROCEDURE` statements.
-- A routine runs with the `sql_mode` it was created with: strict, so that the claim refuses a
-- value too long for its column, whatever the migrating session's mode; the session's own mode
-- is put back at the end.
SET @idempotent_jobs_sql_mode = @@SESSION.sql_mode;
SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';
DROP PROCEDURE IF EXISTS idempotent_begin_job;
CREATE PROCEDURE idempotent_begin_job() SQL SECURITY INVOKER
BEGIN
  DECLARE EXIT HANDLER FOR 1568
    RESIGNAL SET MESSAGE_TEXT = 'idempotent-jobs: the session holds a transaction of its own; nothing was done in it';
  SET /*M! @@tx_isolation = @@SESSION.tx_isolation */ /*!80000 @@transaction_isolation = @@SESSION.transaction_isolation */;
  START TRANSACTION;
  SAVEPOINT idempotent_job;
END;
DROP PROCEDURE IF EXISTS idempotent_begin_and_claim;
CREATE PROCEDURE idempotent_begin_and_claim(
  IN p_digest LONGBLOB,
  IN p_job_key LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  IN p_job_name LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
  IN p_fingerprint LONGBLOB,
  IN p_claim_token BIGINT,
  IN p_result LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
) SQL SECURITY INVOKER
BEGIN
  -- The key is taken: the transaction ends here, empty, and the caller gets the duplicate-key
  -- error (1062, SQLSTATE 23000) with this message, which tells it that nothing is open.
  DECLARE EXIT HANDLER FOR 1062
  BEGIN
    ROLLBACK AND NO CHAIN NO RELEASE;
    IF @@autocommit = 0 THEN
      RESIGNAL SET MESSAGE_TEXT = 'idempotent-jobs: the key is taken; the claim''s transaction was rolled back; autocommit = 0';
    END IF;
    RESIGNAL SET MESSAGE_TEXT = 'idempotent-jobs: the key is taken; the claim''s transaction was rolled back';
  END;
  DECLARE EXIT HANDLER FOR 1568
    RESIGNAL SET MESSAGE_TEXT = 'idempotent-jobs: the session holds a transaction of its own; nothing was done in it';
  SET /*M! @@tx_isolation = @@SESSION.tx_isolation */ /*!80000 @@transaction_isolation = @@SESSION.transaction_isolation */;
  START TRANSACTION;
  INSERT INTO done_jobs (key_digest, job_key, job_name, fingerprint, claim_token, result, done_at)
  VALUES (p_digest, p_job_key, p_job_name, p_fingerprint, p_claim_token, p_result, UTC_TIMESTAMP(6));
  -- After the claim: a body that rolls back to the job's savepoint cannot take the claim with it.
  SAVEPOINT idempotent_job;
END;
DROP PROCEDURE IF EXISTS idempotent_finish_job;
CREATE PROCEDURE idempotent_finish_job() SQL SECURITY INVOKER
BEGIN
  RELEASE SAVEPOINT idempotent_job;
  COMMIT AND NO CHAIN NO RELEASE;
END;
SET SESSION sql_mode = @idempotent_jobs_sql_mode;
-- IGNORE: a migration on another Galera node may have recorded this step first.
INSERT IGNORE INTO idempotent_schema (version, description, applied_at) VALUES (4, 'idempotent_begin_job, idempotent_begin_and_claim, idempotent_finish_job', UTC_TIMESTAMP(6));
