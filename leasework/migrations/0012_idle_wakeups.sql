-- Wake-ups only for an idle relay, and for idle workers (docs/design-decisions.md, "NOTIFY
-- only an idle relay" and "A lone job is woken by Postgres, delivered by Kafka").
--
-- A NOTIFY makes every notifying transaction's commit wait for the others' (Postgres takes
-- one lock for the notification queue from the commit until the transaction ends, WAL flush
-- included): with one NOTIFY per outbox insert, sixteen connections each committing a job
-- committed a third as fast as without it (pgbench, 2,100 against 3,700-4,100 tps). So an
-- insert now tells nobody unless a relay is idle: an idle relay holds the advisory lock
-- (7305004, 1) exclusively on its listening connection (leasework/relay/outbox.py,
-- IdleGate), and only an insert whose shared try on it fails notifies. Otherwise the shared
-- lock, held to the end of the inserting transaction, keeps any relay from taking the
-- exclusive one, so no relay goes idle before this transaction's rows are visible to its
-- next pass: no wake-up is ever lost, only left out while the relay is busy anyway.
--
-- With the relay's wake-up the trigger also tells the workers which jobs a small statement
-- made ready: `NOTIFY leasework_ready` with a JSON array of [topic, job id, type], one per
-- row, for statements of at most 4 rows whose message has no ordering key (its key is the
-- job id). A worker whose queue has nothing in flight claims such a job at once
-- (leasework/worker/wakeup.py), under the same fenced lease as a Kafka delivery; the job's
-- Kafka message, published as before, then finds it running and is settled.

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ready json;
BEGIN
    IF pg_try_advisory_xact_lock_shared(7305004, 1) THEN
        RETURN NULL;  -- no relay is idle: the next pass finds these rows
    END IF;
    PERFORM pg_notify('leasework_outbox', '');
    IF (SELECT count(*) FROM (SELECT 1 FROM new_rows LIMIT 5) AS first_rows) <= 4 THEN
        SELECT json_agg(json_build_array(n.topic, n.job_id, j.type)) INTO ready
          FROM new_rows AS n JOIN jobs AS j ON j.id = n.job_id
         WHERE n.key = n.job_id::text;
        IF ready IS NOT NULL THEN
            PERFORM pg_notify('leasework_ready', ready::text);
        END IF;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
