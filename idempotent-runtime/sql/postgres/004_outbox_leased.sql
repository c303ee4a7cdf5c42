-- idempotent-jobs, schema version 4: the messages relays hold right now, in the order their leases
-- lapse. Every relay round looks for leases that lapsed (their relay stopped): through this index it
-- reads those messages alone, not every undelivered one (a backlog of 1,000,000 due messages cost a
-- round 0.4 s without it). Only leased messages are in it, and every terminal update clears
-- lease_owner, so it stays as small as the relays' leases. This step takes a SHARE lock on outbox
-- while it builds (pushes wait): an operator may build it first with CREATE INDEX CONCURRENTLY, and
-- migrate then finds it made and records the step. One that failed half-way is left invalid: it is
-- not taken for made, and this statement fails on its name until it is dropped.
CREATE INDEX outbox_leased ON outbox (lease_until, id) WHERE lease_owner IS NOT NULL;
INSERT INTO idempotent_schema (version, description, applied_at) VALUES (4, 'outbox_leased', clock_timestamp() AT TIME ZONE 'UTC');
