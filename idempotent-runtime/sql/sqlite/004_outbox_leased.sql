-- idempotent-jobs, schema version 4: the messages relays hold right now. Every relay round looks for
-- leases that lapsed (their relay stopped), in the order they lapse, and reads back the messages it
-- leased, by lease_owner: through these indexes it reads those messages alone, not every
-- undelivered one (a backlog of 1,000,000 due messages cost a round 0.25 s without them, under the
-- write lock jobs wait for). Only leased messages are in them, and every terminal update clears
-- lease_owner, so they stay as small as the relays' leases.
CREATE INDEX IF NOT EXISTS outbox_leased ON outbox (lease_until, id) WHERE lease_owner IS NOT NULL;
CREATE INDEX IF NOT EXISTS outbox_lease_owner ON outbox (lease_owner) WHERE lease_owner IS NOT NULL;
INSERT INTO idempotent_schema (version, description, applied_at) VALUES (4, 'outbox_leased, outbox_lease_owner', strftime('%Y-%m-%d %H:%M:%f', 'now'));
