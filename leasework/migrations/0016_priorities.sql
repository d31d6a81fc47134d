-- Priorities within a queue (leasework/priorities.py; docs/design-decisions.md, "Priorities:
-- a topic per band, slots to the highest band waiting"). A job has a priority from 0 (the
-- highest, and the default) to 3: its submit's `priority`, else its door's (the app's type),
-- else its type's registered one, else 0. Each priority of a queue is a band with a Kafka
-- topic of its own: 0 is the queue's topic as before, b > 0 is `<topic>.<queue>.p<b>`,
-- created with the queue. A job's wake-up goes to its band's topic, wherever it is written
-- (this insert, and every statement that builds it with leasework_ready_topic's three
-- arguments: leasework/store/common.py ready_outbox_insert).

-- (a constant default: no table rewrite)
ALTER TABLE jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0
    CHECK (priority BETWEEN 0 AND 3);
-- a type's declared priority (App.job(priority=...)), registered with the type
ALTER TABLE job_types ADD COLUMN priority smallint CHECK (priority BETWEEN 0 AND 3);

-- The topic of a band's wake-up messages (leasework/priorities.py band_topic says the same).
CREATE FUNCTION leasework_ready_topic(topic text, queue text, priority smallint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN priority = 0 THEN leasework_ready_topic(topic, queue)
                ELSE topic || '.' || queue || '.p' || priority END
$$;

-- Refuses `priority` (a JSON value that is not one), saying what to do. (The requests keep
-- priorities 0-3 in plain SQL: a function call per row would cost every insert.)
CREATE FUNCTION leasework_priority_refused(priority jsonb) RETURNS smallint
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    RAISE EXCEPTION 'priority % is not a priority', priority::text
        USING ERRCODE = '22023',
              HINT = 'give an integer from 0 (the highest, and the default) to 3 (the lowest), '
                     'or leave priority out for the type''s';
END
$$;

-- The requests of one insert, as rows (0011's, plus each request's priority).
DROP FUNCTION leasework_job_requests(jsonb);
CREATE FUNCTION leasework_job_requests(requests jsonb)
RETURNS TABLE (
    ord integer, id uuid, type text, payload jsonb, run_at timestamptz, due boolean,
    max_attempts integer, timeout_seconds integer, retry_base double precision,
    retry_cap double precision, ordering_key text, idempotency_key text, request_hash text,
    unique_key bytea, unique_states smallint, queue text, priority smallint
) LANGUAGE sql STABLE AS $$
    SELECT coalesce((r.req->>'ord')::integer, r.ord::integer),
           (r.req->>'id')::uuid,
           r.req->>'type',
           coalesce(r.req->'payload', '{}'::jsonb),
           at.run_at,
           at.run_at <= now(),
           coalesce((r.req->>'max_attempts')::integer, (r.req->>'default_max_attempts')::integer,
                    t.max_attempts, 5),
           coalesce((r.req->>'timeout_seconds')::integer,
                    (r.req->>'default_timeout_seconds')::integer, t.timeout_seconds, 300),
           coalesce((r.req->>'retry_base')::float8, t.retry_base),
           coalesce((r.req->>'retry_cap')::float8, t.retry_cap),
           r.req->>'ordering_key',
           r.req->>'idempotency_key',
           CASE WHEN r.req ? 'idempotency_key' AND r.req->>'idempotency_key' IS NOT NULL THEN
               encode(sha256(convert_to((jsonb_build_object(
                   'type', r.req->>'type',
                   'payload', coalesce(r.req->'payload', '{}'::jsonb),
                   'run_at', extract(epoch FROM (r.req->>'run_at')::timestamptz),
                   'delay_seconds', round((r.req->>'delay_seconds')::numeric, 3),
                   'max_attempts', (r.req->>'max_attempts')::integer,
                   'timeout_seconds', (r.req->>'timeout_seconds')::integer,
                   'ordering_key', r.req->>'ordering_key')
                   -- (a queue only when asked: the hashes of requests before queues stand)
                   || CASE WHEN r.req ? 'queue' AND r.req->>'queue' IS NOT NULL
                           THEN jsonb_build_object('queue', r.req->>'queue')
                           ELSE '{}'::jsonb END
                   -- (likewise a priority)
                   || CASE WHEN r.req ? 'priority' AND r.req->>'priority' IS NOT NULL
                           THEN jsonb_build_object('priority', r.req->'priority')
                           ELSE '{}'::jsonb END)::text, 'UTF8')), 'hex')
           END,
           CASE WHEN u.policy IS NOT NULL THEN
               leasework_unique_key(
                   r.req->>'type', coalesce(r.req->'payload', '{}'::jsonb),
                   ARRAY(SELECT jsonb_array_elements_text(
                             CASE WHEN jsonb_typeof(u.policy->'fields') = 'array'
                                  THEN u.policy->'fields' END)),
                   ((u.policy->>'period_seconds')::numeric)::bigint,
                   at.run_at)
           END,
           CASE WHEN u.policy IS NOT NULL THEN leasework_unique_states(u.policy->'states') END,
           CASE WHEN q.queue = 'default' THEN q.queue ELSE leasework_queue_known(q.queue) END,
           CASE WHEN p.priority IN ('0', '1', '2', '3') THEN p.priority::text::numeric::smallint
                ELSE leasework_priority_refused(p.priority) END
    FROM jsonb_array_elements(requests) WITH ORDINALITY AS r(req, ord)
    LEFT JOIN job_types t ON t.name = r.req->>'type'
    CROSS JOIN LATERAL (
        SELECT coalesce((r.req->>'run_at')::timestamptz,
                        now() + make_interval(secs => (r.req->>'delay_seconds')::float8),
                        now()) AS run_at
    ) at
    CROSS JOIN LATERAL (
        SELECT coalesce(nullif(r.req->'unique', 'null'::jsonb),
                        nullif(r.req->'default_unique', 'null'::jsonb),
                        nullif(t.unique_policy, 'null'::jsonb)) AS policy
    ) u
    CROSS JOIN LATERAL (
        SELECT coalesce(r.req->>'queue', r.req->>'default_queue', t.queue, 'default') AS queue
    ) q
    CROSS JOIN LATERAL (
        SELECT coalesce(nullif(r.req->'priority', 'null'::jsonb),
                        nullif(r.req->'default_priority', 'null'::jsonb),
                        to_jsonb(t.priority), '0'::jsonb) AS priority
    ) p
$$;

-- The one insert path (0011's), writing each job's priority and waking it on its band's topic.
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
            INSERT INTO outbox (job_id, topic, key, value, headers)
            SELECT ins.id, leasework_ready_topic(leasework_jobs_insert.topic, ins.queue,
                                                 ins.priority),
                   coalesce(ins.ordering_key, ins.id::text),
                   jsonb_build_object('job_id', ins.id::text, 'type', ins.type, 'attempt', 1),
                   jsonb_build_object('job_id', ins.id::text, 'type', ins.type)
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

