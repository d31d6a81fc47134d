-- The relay publishes by priority (leasework/relay/outbox.py): a wake-up of a higher band is
-- published before a backlog of lower ones waiting in the outbox, not after it (measured by
-- `just bench --rows priorities`: a priority 0 job's wake-up waited up to 3 s behind the
-- 20,000 rows of a priority 3 flood enqueued before it). Each outbox row carries the priority
-- of its job's band (0 for every other message: dead letters, events), and the relay takes
-- the oldest rows of the highest priority first; within one priority, and so within one
-- topic, rows keep their order.

-- (a constant default: no table rewrite)
ALTER TABLE outbox ADD COLUMN priority smallint NOT NULL DEFAULT 0;
CREATE INDEX outbox_priority_idx ON outbox (priority, id);

-- 0016's insert path, its wake-ups written with their jobs' priority.
CREATE OR REPLACE FUNCTION leasework_jobs_insert(requests jsonb, topic text DEFAULT 'jobs.ready')
RETURNS TABLE (
    ord integer, id uuid, status text, run_at timestamptz, created_at timestamptz,
    max_attempts integer, timeout_seconds integer, replay boolean, conflict boolean,
    duplicate boolean, unique_key bytea
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    pending jsonb := requests;
    total integer := jsonb_array_length(requests);
    answered integer := 0;
    inserted integer;
    done integer[];
    hit record;
    rounds integer := 0;
BEGIN
    LOOP
        rounds := rounds + 1;
        RETURN QUERY
        WITH req AS (SELECT * FROM leasework_job_requests(pending)),
        ins AS (
            INSERT INTO jobs AS j (id, type, payload, status, run_at, max_attempts,
                                   attempt_budget, timeout_seconds, retry_base, retry_cap,
                                   ordering_key, idempotency_key, request_hash, unique_key,
                                   unique_states, queue, priority)
            SELECT req.id, req.type, req.payload,
                   CASE WHEN req.due THEN 'queued' ELSE 'scheduled' END,
                   req.run_at, req.max_attempts, req.max_attempts, req.timeout_seconds,
                   req.retry_base, req.retry_cap, req.ordering_key, req.idempotency_key,
                   req.request_hash, req.unique_key, req.unique_states, req.queue,
                   req.priority
            -- keys in one order, so that two transactions inserting the same keys wait on
            -- each other in one direction instead of deadlocking
            FROM req ORDER BY req.unique_key, req.idempotency_key, req.ord
            ON CONFLICT DO NOTHING
            RETURNING j.id, j.type, j.status, j.run_at, j.created_at, j.max_attempts,
                      j.timeout_seconds, j.ordering_key, j.unique_key, j.queue, j.priority
        ),
        wake AS (
            INSERT INTO outbox (job_id, topic, key, value, headers, priority)
            SELECT ins.id, leasework_ready_topic(leasework_jobs_insert.topic, ins.queue,
                                                 ins.priority),
                   coalesce(ins.ordering_key, ins.id::text),
                   jsonb_build_object('job_id', ins.id::text, 'type', ins.type, 'attempt', 1),
                   jsonb_build_object('job_id', ins.id::text, 'type', ins.type), ins.priority
            FROM ins WHERE ins.status = 'queued'
        )
        SELECT req.ord, ins.id, ins.status, ins.run_at, ins.created_at, ins.max_attempts,
               ins.timeout_seconds, false, false, false, ins.unique_key
        FROM ins JOIN req ON req.id = ins.id;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        answered := answered + inserted;
        EXIT WHEN answered = total;
        -- The skipped requests, answered from the job holding their key. A new statement per
        -- lookup, so it sees keys that transactions this one waited for committed.
        done := '{}';
        FOR hit IN
            SELECT req.ord, j.id, j.status, j.run_at, j.created_at, j.max_attempts,
                   j.timeout_seconds, j.unique_key,
                   j.request_hash IS NOT DISTINCT FROM req.request_hash AS replay
            FROM leasework_job_requests(pending) req
            JOIN jobs j ON j.idempotency_key = req.idempotency_key
            WHERE j.id <> req.id AND NOT EXISTS (SELECT 1 FROM jobs m WHERE m.id = req.id)
        LOOP
            ord := hit.ord; id := hit.id; status := hit.status; run_at := hit.run_at;
            created_at := hit.created_at; max_attempts := hit.max_attempts;
            timeout_seconds := hit.timeout_seconds; replay := hit.replay;
            conflict := NOT hit.replay; duplicate := false; unique_key := hit.unique_key;
            RETURN NEXT;
            done := done || hit.ord;
        END LOOP;
        FOR hit IN
            SELECT req.ord, j.id, j.status, j.run_at, j.created_at, j.max_attempts,
                   j.timeout_seconds, j.unique_key
            FROM leasework_job_requests(pending) req
            JOIN jobs j ON j.unique_key = req.unique_key
                       AND leasework_unique_holds(j.unique_states, j.status)
            WHERE j.id <> req.id AND NOT req.ord = ANY (done)
              AND NOT EXISTS (SELECT 1 FROM jobs m WHERE m.id = req.id)
        LOOP
            ord := hit.ord; id := hit.id; status := hit.status; run_at := hit.run_at;
            created_at := hit.created_at; max_attempts := hit.max_attempts;
            timeout_seconds := hit.timeout_seconds; replay := false; conflict := false;
            duplicate := true; unique_key := hit.unique_key;
            RETURN NEXT;
            done := done || hit.ord;
        END LOOP;
        answered := answered + coalesce(array_length(done, 1), 0);
        EXIT WHEN answered = total;
        IF rounds >= 5 THEN
            RAISE EXCEPTION 'leasework_jobs_insert: % request(s) met a key whose holder kept '
                            'finishing while this insert looked for it', total - answered
                USING ERRCODE = '40001', HINT = 'retry the transaction';
        END IF;
        -- the rest: neither inserted nor answered (their holder finished or was pruned
        -- after the conflict); each keeps its place (`ord`) in the next round
        SELECT jsonb_agg(r.req || jsonb_build_object('ord', coalesce((r.req->>'ord')::integer,
                                                                     r.o::integer)))
        INTO pending
        FROM jsonb_array_elements(pending) WITH ORDINALITY AS r(req, o)
        WHERE NOT EXISTS (SELECT 1 FROM jobs m WHERE m.id = (r.req->>'id')::uuid)
          AND NOT coalesce((r.req->>'ord')::integer, r.o::integer) = ANY (done);
        IF pending IS NULL THEN
            -- every request is inserted or answered, yet the counts disagree: a request whose
            -- id a job already had (never made by leasework: ids are fresh uuids)
            RAISE EXCEPTION 'leasework_jobs_insert: % request(s) could not be inserted or '
                            'answered (an id already in use?)', total - answered
                USING ERRCODE = '23505';
        END IF;
    END LOOP;
END $$;
