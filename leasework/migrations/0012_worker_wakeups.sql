-- An idle worker's wake-up (leasework/worker/wakeup.py; docs/design-decisions.md, "A lone
-- job is woken by Postgres, delivered by Kafka"). The statement trigger that wakes the relay
-- now also tells the workers, at the inserting transaction's commit, which jobs a small
-- statement made ready: `NOTIFY leasework_ready` with a JSON array of [topic, job id, type],
-- one per row, for statements of at most 4 rows whose message has no ordering key (its key
-- is the job id). A worker whose queue has nothing in flight claims such a job at once, under
-- the same fenced lease as a Kafka delivery; the job's Kafka message, published as before,
-- then finds it running and is settled. Larger statements (batches, the load a worker is
-- busy with anyway) and ordered jobs wake no worker: Kafka delivers them as before.

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ready json;
BEGIN
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
