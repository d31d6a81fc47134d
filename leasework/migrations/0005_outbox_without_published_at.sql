-- The outbox holds only what is still to be published: the relay deletes each row once Kafka
-- acknowledged it (store.outbox_retire), so nothing is ever marked published and the
-- published_at column of the first design, its indexes and the pruner's outbox retention
-- (LEASEWORK_RETAIN_OUTBOX) go. A row an older relay marked published was already
-- acknowledged: it is deleted here, not published again.
DELETE FROM outbox WHERE published_at IS NOT NULL;
DROP INDEX outbox_pending_idx;  -- 0001: the unpublished rows, by id (now the primary key)
DROP INDEX outbox_published_idx;  -- 0002: the pruner's published rows by age
ALTER TABLE outbox DROP COLUMN published_at;
