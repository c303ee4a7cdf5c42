-- idempotent-jobs, schema version 5: the messages relays hold right now. Every relay round looks for
-- leases that lapsed (their relay stopped) and reads back the messages it leased, by lease_owner:
-- through this index it reads those messages alone, not every undelivered one (a backlog of
-- 1,000,000 due messages cost a round 3.8 s on MariaDB without it). Messages not leased share its
-- one NULL prefix, which those reads skip. Built in place (ALGORITHM=INPLACE, LOCK=NONE on MariaDB
-- 10.11 and MySQL 8): pushes go on while it builds (on Galera, DDL in total order holds the cluster
-- while it runs; a COMPACT or REDUNDANT outbox refuses the 1,020-byte key: docs/operating.md).
CREATE INDEX outbox_leased ON outbox (lease_owner, lease_until);
-- IGNORE: a migration on another Galera node may have recorded this step first.
INSERT IGNORE INTO idempotent_schema (version, description, applied_at) VALUES (5, 'outbox_leased', UTC_TIMESTAMP(6));
