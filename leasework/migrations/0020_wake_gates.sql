-- Wake gates (leasework/wakegate.py; docs/design-decisions.md, "An insert sends its NOTIFY
-- only while someone waits for it"). Postgres serialises every transaction that sends a
-- NOTIFY through its commit's WAL flush (PreCommit_Notify holds a cluster-wide lock until the
-- transaction has ended), so a stream of one-job transactions committed one flush at a time.
-- The outbox trigger now sends each NOTIFY only while a listener waits for it: a waiting
-- relay holds every stripe of advisory lock class 7305007 shared, a quiet worker every stripe
-- of 7305008; the trigger tries its connection's stripe exclusively for the rest of the
-- transaction, and sends the channel's NOTIFY only when that fails. A transaction that sends
-- none keeps its stripe until it has ended, so a relay that arms after it finds its rows.
-- Stripes: 32 (wakegate.STRIPES).

CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ready json;
    stripe int := pg_backend_pid() % 32;
BEGIN
    IF NOT pg_try_advisory_xact_lock(7305007, stripe) THEN
        PERFORM pg_notify('leasework_outbox', '');
    END IF;
    IF (SELECT count(*) FROM (SELECT 1 FROM new_rows LIMIT 5) AS first_rows) <= 4 THEN
        IF NOT pg_try_advisory_xact_lock(7305008, stripe) THEN
            SELECT json_agg(json_build_array(n.topic, n.job_id, j.type)) INTO ready
              FROM new_rows AS n JOIN jobs AS j ON j.id = n.job_id
             WHERE n.key = n.job_id::text;
            IF ready IS NOT NULL THEN
                PERFORM pg_notify('leasework_ready', ready::text);
            END IF;
        END IF;
    END IF;
    RETURN NULL;
END $$;
