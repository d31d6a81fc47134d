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

-- The SQL door (0007's), naming a queue and a priority too (NULL: the type's, else `default`
-- and 0). A queue that does not exist and a priority that is none are refused by the insert,
-- saying what to do.
DROP FUNCTION leasework_enqueue(text, jsonb, timestamptz, interval, integer, integer, text, text, text[], interval, text[]);
CREATE FUNCTION leasework_enqueue(
    job_type        text,
    payload         jsonb       DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    delay           interval    DEFAULT NULL,
    max_attempts    integer     DEFAULT NULL,
    timeout_seconds integer     DEFAULT NULL,
    ordering_key    text        DEFAULT NULL,
    idempotency_key text        DEFAULT NULL,
    unique_fields   text[]      DEFAULT NULL,
    unique_period   interval    DEFAULT NULL,
    unique_states   text[]      DEFAULT NULL,
    queue           text        DEFAULT NULL,
    priority        integer     DEFAULT NULL
) RETURNS uuid LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    known text;
    properties jsonb;
    declared jsonb;
    policy jsonb;
    missing text;
    result record;
BEGIN
    IF job_type IS NULL OR job_type !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
        RAISE EXCEPTION 'leasework_enqueue: job_type % is invalid', quote_nullable(job_type)
            USING ERRCODE = '22023', HINT = 'use 1-100 letters, digits and _ . : -';
    END IF;
    SELECT t.payload_schema->'properties', t.unique_policy INTO properties, declared
    FROM job_types t WHERE t.name = job_type;
    IF NOT FOUND THEN
        SELECT string_agg(t.name, ', ' ORDER BY t.name) INTO known FROM job_types t;
        RAISE EXCEPTION 'leasework_enqueue: unknown job type %', quote_literal(job_type)
            USING ERRCODE = '22023',
                  HINT = 'registered types: ' || coalesce(known, 'none') || '; an api or worker '
                         'registers the types of its app (LEASEWORK_APP) when it starts';
    END IF;
    IF payload IS NULL THEN
        payload := 'null'::jsonb;
    END IF;
    IF leasework_jsonb_depth(payload, 33) > 32 THEN
        RAISE EXCEPTION 'leasework_enqueue: payload nests deeper than 32 levels'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM jsonb_path_query(payload, 'lax $.**') AS v
               WHERE jsonb_typeof(v) = 'number' AND length(v::text) > 1001) THEN
        RAISE EXCEPTION 'leasework_enqueue: payload holds a number of more than 1000 digits'
            USING ERRCODE = '22023';
    END IF;
    IF octet_length(payload::text) > 1048576 THEN
        RAISE EXCEPTION 'leasework_enqueue: payload is over 1048576 bytes as JSON'
            USING ERRCODE = '22023', HINT = 'store large data elsewhere and pass a reference';
    END IF;
    IF run_at IS NOT NULL AND delay IS NOT NULL THEN
        RAISE EXCEPTION 'leasework_enqueue: give run_at or delay, not both' USING ERRCODE = '22023';
    END IF;
    IF delay IS NOT NULL AND (delay < interval '0' OR delay > interval '366 days') THEN
        RAISE EXCEPTION 'leasework_enqueue: delay must be between 0 and 366 days'
            USING ERRCODE = '22023';
    END IF;
    IF run_at IS NOT NULL AND NOT isfinite(run_at) THEN
        RAISE EXCEPTION 'leasework_enqueue: run_at must be a finite time' USING ERRCODE = '22023';
    END IF;
    IF max_attempts IS NOT NULL AND NOT max_attempts BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'leasework_enqueue: max_attempts must be between 1 and 100'
            USING ERRCODE = '22023';
    END IF;
    IF timeout_seconds IS NOT NULL AND NOT timeout_seconds BETWEEN 1 AND 86400 THEN
        RAISE EXCEPTION 'leasework_enqueue: timeout_seconds must be between 1 and 86400'
            USING ERRCODE = '22023';
    END IF;
    IF ordering_key IS NOT NULL AND NOT length(ordering_key) BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'leasework_enqueue: ordering_key must be 1-200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF idempotency_key IS NOT NULL AND NOT length(idempotency_key) BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'leasework_enqueue: idempotency_key must be 1-200 characters'
            USING ERRCODE = '22023';
    END IF;
    policy := leasework_unique_policy(unique_fields, unique_period, unique_states, properties);
    -- every field of the key (asked here, else declared by the type) is in the payload
    SELECT string_agg(quote_literal(f), ', ') INTO missing
    FROM jsonb_array_elements_text(coalesce(policy, declared)->'fields') AS f
    WHERE NOT (jsonb_typeof(payload) = 'object' AND payload ? f);
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'leasework_enqueue: the payload has no % (the unique key''s field)', missing
            USING ERRCODE = '22023',
                  HINT = 'a unique job''s key is made of these top-level payload fields: put '
                         'them in the payload';
    END IF;
    SELECT * INTO result FROM leasework_jobs_insert(jsonb_build_array(jsonb_strip_nulls(
        jsonb_build_object(
            'id', gen_random_uuid(),
            'type', job_type,
            'payload', payload,
            'run_at', run_at,
            'delay_seconds', extract(epoch FROM delay),
            'max_attempts', max_attempts,
            'timeout_seconds', timeout_seconds,
            'ordering_key', ordering_key,
            'idempotency_key', idempotency_key,
            'unique', policy,
            'queue', queue,
            'priority', priority))
        -- jsonb_strip_nulls also strips nulls inside the payload: put the payload back as is
        || jsonb_build_object('payload', payload)));
    IF result.conflict THEN
        RAISE EXCEPTION 'leasework_enqueue: idempotency key % was used for a different request',
                        quote_literal(idempotency_key)
            USING ERRCODE = '23505',
                  DETAIL = 'the earlier job is ' || result.id::text,
                  HINT = 'use a new key for a new job, or repeat the original request';
    END IF;
    PERFORM set_config('leasework.enqueue_outcome',
                       CASE WHEN result.duplicate THEN 'duplicate'
                            WHEN result.replay THEN 'replay' ELSE 'inserted' END, true);
    IF result.duplicate THEN
        RAISE NOTICE 'leasework_enqueue: duplicate of job %', result.id
            USING DETAIL = 'job ' || result.id::text || ' (' || result.status || ') holds the '
                           'unique key; nothing was written';
    END IF;
    RETURN result.id;
END $$;
