-- Unique jobs (leasework/unique.py; docs/design-decisions.md, "Unique jobs: an index decides,
-- and a waiter is never dropped").
--
-- A job that asks for uniqueness (its submit's `unique`, else its door's policy, else its
-- type's registered policy) carries a key, a hash over its type, the chosen payload fields'
-- values and, with a period, the period's bucket of its run_at; and the set of states in
-- which the key holds. A partial unique index over the keys of the jobs in their states is
-- the whole rule: an insert of a key some job holds conflicts with it, and a job that leaves
-- its states (succeeds, dies, is cancelled) leaves the index, freeing the key, in the same
-- write. The insert (leasework_jobs_insert) takes `ON CONFLICT DO NOTHING` over every unique
-- index at once, so a second inserter of a key whose first holder has not committed waits on
-- the index for that transaction's end: it inserts if the holder rolled back and sees the
-- conflict if it committed. Then a new statement finds the holder and answers `duplicate`.
--
-- A job that asks nothing has a NULL key: the index does not hold it (the predicate skips
-- it), and the insert's extra work for it is the NULL tests of three coalesces.

ALTER TABLE jobs
    -- sha256 of leasework_unique_key(...); NULL: the job asked for no uniqueness
    ADD COLUMN unique_key    bytea,
    -- the states in which the key holds, a bit each (leasework_unique_bit); always every
    -- unfinished one, so no move between them can collide (only an operator's retry enters)
    ADD COLUMN unique_states smallint,
    ADD CONSTRAINT jobs_unique_pair CHECK ((unique_key IS NULL) = (unique_states IS NULL));

-- a type's declared uniqueness (App.job(unique=...)), registered with the type: the policy of
-- the doors that do not load the app (the SQL door, enqueue without app=, the scheduler)
ALTER TABLE job_types ADD COLUMN unique_policy jsonb;

-- a schedule's tick whose job would have been a duplicate is recorded skipped, reason
-- 'unique', naming the job that held the key (no foreign key: finished jobs are pruned)
ALTER TABLE schedule_ticks
    ADD COLUMN duplicate_of uuid CHECK (duplicate_of IS NULL OR reason = 'unique'),
    -- the reasons leasework.schedule.SkipReason names
    ADD CONSTRAINT schedule_ticks_reason_check
        CHECK (reason IS NULL OR reason IN ('catch_up', 'overlap', 'unique'));

-- The bit of a state in unique_states (leasework/unique.py STATE_BITS says the same).
CREATE FUNCTION leasework_unique_bit(status text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE status WHEN 'scheduled' THEN 1 WHEN 'queued' THEN 2 WHEN 'running' THEN 4
                       WHEN 'succeeded' THEN 8 WHEN 'failed' THEN 16 WHEN 'dead' THEN 32
                       WHEN 'cancelled' THEN 64 ELSE 0 END
$$;

-- Whether a job in `status` holds its key: the unique index's predicate, and every lookup of
-- a holder says it the same way (so the planner proves it and reads the index).
CREATE FUNCTION leasework_unique_holds(states smallint, status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (states::integer & leasework_unique_bit(status)) <> 0
$$;

-- The unique_states of a policy's `states` (names): always with every unfinished state
-- (scheduled, queued, running, failed = 23), whatever a request said, so that the promoter,
-- the claim and the reaper, which move a job between those, can never meet the index.
CREATE FUNCTION leasework_unique_states(states jsonb) RETURNS smallint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (23 | coalesce((SELECT bit_or(leasework_unique_bit(s))
                           FROM jsonb_array_elements_text(
                               CASE WHEN jsonb_typeof(states) = 'array' THEN states END) AS s),
                          0))::smallint
$$;

-- A payload value as the key sees it: a number without trailing zeros (1.50 is 1.5), so
-- that two requests that mean the same number share a key; anything else as Postgres keeps it.
CREATE FUNCTION leasework_unique_value(value jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN jsonb_typeof(value) = 'number' THEN to_jsonb(trim_scale(value::numeric))
                ELSE coalesce(value, 'null'::jsonb) END
$$;

-- The key: sha256 over [type, {field: value} of the chosen fields (a field left out is null),
-- the period in seconds (null: none), the period's bucket of run_at (null: none)]. Buckets
-- are counted from the Unix epoch in UTC: a period of an hour buckets by UTC hour, a day by
-- UTC day. Pure: the same arguments give the same key at every door.
CREATE FUNCTION leasework_unique_key(
    job_type text, payload jsonb, fields text[], period_seconds bigint, run_at timestamptz
) RETURNS bytea LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT sha256(convert_to(jsonb_build_array(
        job_type,
        (SELECT coalesce(jsonb_object_agg(f, leasework_unique_value(payload -> f)), '{}'::jsonb)
         FROM unnest(fields) AS f),
        period_seconds,
        floor(extract(epoch FROM run_at) / nullif(period_seconds, 0))
    )::text, 'UTF8'))
$$;

-- The unique index: at most one job per key among the jobs in their key's states.
CREATE UNIQUE INDEX jobs_unique_key_idx ON jobs (unique_key)
    WHERE unique_key IS NOT NULL AND leasework_unique_holds(unique_states, status);

-- The requests of one insert, as rows (0002's, plus each request's unique key and states).
-- A request's `unique` ({"fields": [...], "period_seconds": n, "states": [...]}) is what the
-- client asked; `default_unique` the door's policy (the app's type); then the type's
-- registered policy. `ord` in a request keeps its place when the insert retries a part.
DROP FUNCTION leasework_job_requests(jsonb);
CREATE FUNCTION leasework_job_requests(requests jsonb)
RETURNS TABLE (
    ord integer, id uuid, type text, payload jsonb, run_at timestamptz, due boolean,
    max_attempts integer, timeout_seconds integer, retry_base double precision,
    retry_cap double precision, ordering_key text, idempotency_key text, request_hash text,
    unique_key bytea, unique_states smallint
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
               encode(sha256(convert_to(jsonb_build_object(
                   'type', r.req->>'type',
                   'payload', coalesce(r.req->'payload', '{}'::jsonb),
                   'run_at', extract(epoch FROM (r.req->>'run_at')::timestamptz),
                   'delay_seconds', round((r.req->>'delay_seconds')::numeric, 3),
                   'max_attempts', (r.req->>'max_attempts')::integer,
                   'timeout_seconds', (r.req->>'timeout_seconds')::integer,
                   'ordering_key', r.req->>'ordering_key')::text, 'UTF8')), 'hex')
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
           CASE WHEN u.policy IS NOT NULL THEN leasework_unique_states(u.policy->'states') END
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
$$;

-- Insert jobs (and, for those due now, their outbox rows) in the caller's transaction: the
-- one insert path of every door. Returns one row per request: the job that request names;
-- `replay` when an earlier request with the same idempotency key and the same content made
-- it, `conflict` when that earlier request differed, `duplicate` when a job holding the same
-- unique key made it (nothing was written for a conflict or a duplicate).
--
-- `ON CONFLICT DO NOTHING` names no index, so every unique index is an arbiter: the
-- idempotency key's, the unique key's (and the primary key's). A request that meets a key an
-- uncommitted transaction holds waits for that transaction's end, then inserts (it rolled
-- back) or conflicts (it committed); it is never dropped. Each request the insert skipped is
-- then answered from the job that holds its idempotency key (replay or conflict, which win:
-- a replay answers as the original did), else its unique key (duplicate), in new statements,
-- which see what the transactions waited for committed. A request neither inserted nor
-- answered met a holder that left its states (finished) or was pruned in between: it is
-- inserted again, up to five rounds, then 40001 (retry the transaction).
DROP FUNCTION leasework_jobs_insert(jsonb, text);
CREATE FUNCTION leasework_jobs_insert(requests jsonb, topic text DEFAULT 'jobs.ready')
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
                                   unique_states)
            SELECT req.id, req.type, req.payload,
                   CASE WHEN req.due THEN 'queued' ELSE 'scheduled' END,
                   req.run_at, req.max_attempts, req.max_attempts, req.timeout_seconds,
                   req.retry_base, req.retry_cap, req.ordering_key, req.idempotency_key,
                   req.request_hash, req.unique_key, req.unique_states
            -- keys in one order, so that two transactions inserting the same keys wait on
            -- each other in one direction instead of deadlocking
            FROM req ORDER BY req.unique_key, req.idempotency_key, req.ord
            ON CONFLICT DO NOTHING
            RETURNING j.id, j.type, j.status, j.run_at, j.created_at, j.max_attempts,
                      j.timeout_seconds, j.ordering_key, j.unique_key
        ),
        wake AS (
            INSERT INTO outbox (job_id, topic, key, value, headers)
            SELECT ins.id, leasework_jobs_insert.topic,
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

-- The SQL door's checks of a uniqueness request (leasework/unique.py holds the same rules):
-- `fields` names up to 32 distinct payload fields (of the registered payload schema's
-- properties, when it lists them; an empty array: by type alone), `period` is whole seconds
-- from 1 s to 366 days (no months: a month has no fixed length), `states` are job states
-- among which every unfinished one must be. Returns the policy as the insert takes it;
-- raises 22023 saying what to change.
CREATE FUNCTION leasework_unique_policy(
    fields text[], period interval, states text[], properties jsonb
) RETURNS jsonb LANGUAGE plpgsql STABLE AS $$
DECLARE
    field text;
    missing text;
    seconds numeric;
BEGIN
    IF fields IS NULL THEN
        IF period IS NOT NULL OR states IS NOT NULL THEN
            RAISE EXCEPTION 'leasework_enqueue: unique_period and unique_states need unique_fields'
                USING ERRCODE = '22023',
                      HINT = 'give unique_fields => ARRAY[...] (the payload fields the key is '
                             'made of; ''{}'' for the type alone)';
        END IF;
        RETURN NULL;
    END IF;
    IF cardinality(fields) > 32 OR array_position(fields, NULL) IS NOT NULL
       OR EXISTS (SELECT 1 FROM unnest(fields) f WHERE NOT length(f) BETWEEN 1 AND 200)
       OR (SELECT count(DISTINCT f) <> count(*) FROM unnest(fields) f) THEN
        RAISE EXCEPTION 'leasework_enqueue: unique_fields must hold up to 32 distinct payload '
                        'field names of 1-200 characters'
            USING ERRCODE = '22023';
    END IF;
    IF jsonb_typeof(properties) = 'object' THEN
        FOREACH field IN ARRAY fields LOOP
            IF NOT properties ? field THEN
                RAISE EXCEPTION 'leasework_enqueue: unique_fields names %, not a field of the '
                                'payload', quote_literal(field)
                    USING ERRCODE = '22023',
                          HINT = 'the payload''s fields: ' || (
                              SELECT string_agg(k, ', ' ORDER BY k)
                              FROM jsonb_object_keys(properties) k);
            END IF;
        END LOOP;
    END IF;
    IF period IS NOT NULL THEN
        seconds := extract(epoch FROM period);
        IF extract(month FROM period) <> 0 OR extract(year FROM period) <> 0
           OR seconds <> trunc(seconds) OR NOT seconds BETWEEN 1 AND 31622400 THEN
            RAISE EXCEPTION 'leasework_enqueue: unique_period must be whole seconds from 1 second '
                            'to 366 days, got %', period
                USING ERRCODE = '22023', HINT = 'e.g. ''1 hour'' or ''1 day''; not months';
        END IF;
    END IF;
    IF states IS NOT NULL THEN
        IF array_position(states, NULL) IS NOT NULL
           OR EXISTS (SELECT 1 FROM unnest(states) s WHERE leasework_unique_bit(s) = 0)
           OR (SELECT count(DISTINCT s) <> count(*) FROM unnest(states) s) THEN
            RAISE EXCEPTION 'leasework_enqueue: unique_states must hold distinct job states'
                USING ERRCODE = '22023',
                      HINT = 'scheduled, queued, running, succeeded, failed, dead, cancelled';
        END IF;
        SELECT string_agg(s, ', ' ORDER BY leasework_unique_bit(s)) INTO missing
        FROM unnest(ARRAY['scheduled', 'queued', 'running', 'failed']) s
        WHERE NOT s = ANY (states);
        IF missing IS NOT NULL THEN
            RAISE EXCEPTION 'leasework_enqueue: unique_states leaves out %', missing
                USING ERRCODE = '22023',
                      HINT = 'a unique key holds in every unfinished state (scheduled, queued, '
                             'running, failed): list them all, and add succeeded, dead or '
                             'cancelled to keep the key after the job ends that way';
        END IF;
    END IF;
    RETURN jsonb_strip_nulls(jsonb_build_object(
        'fields', to_jsonb(fields),
        'period_seconds', seconds::bigint,
        'states', to_jsonb(states)));
END $$;


-- The SQL door, for every language: enqueue one job in the caller's transaction.
--   SELECT leasework_enqueue('send_receipt', '{"order_id": 42}', delay => '10 seconds');
--   SELECT leasework_enqueue('send_receipt', '{"order_id": 42}', unique_fields => '{order_id}',
--                            unique_period => '1 hour');
-- `unique_fields` asks for uniqueness by the type and those payload fields (an empty array:
-- the type alone), `unique_period` per period of run_at, `unique_states` in those states
-- (default: the unfinished ones, which it must include); left out, the type's declared
-- uniqueness applies. Returns the job id: the new job's, an earlier job's on an idempotency
-- replay, the holder's on a duplicate (nothing written). How it went is the transaction's
-- setting leasework.enqueue_outcome ('inserted', 'replay' or 'duplicate';
-- `SELECT current_setting('leasework.enqueue_outcome')`), and a duplicate also raises a
-- NOTICE naming the holder. Refuses (SQLSTATE 22023, with a hint) a type no api or worker
-- registered, and requests the job store cannot keep; raises 23505 when the idempotency key
-- was used for a different request.
DROP FUNCTION leasework_enqueue(text, jsonb, timestamptz, interval, integer, integer, text, text);
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
    unique_states   text[]      DEFAULT NULL
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
            'unique', policy))
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
