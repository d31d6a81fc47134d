-- The application API: results, per-type policy, deferrals of unknown types, the job-type
-- registry, pruning, and one insert path for every door (HTTP, enqueue, the SQL function).

ALTER TABLE jobs
    ADD COLUMN result     jsonb,
    -- per-type backoff (seconds); NULL: the worker's and reaper's LEASEWORK_RETRY_BASE/CAP
    ADD COLUMN retry_base double precision CHECK (retry_base > 0),
    ADD COLUMN retry_cap  double precision CHECK (retry_cap > 0),
    -- times a worker that did not know the type put the job back (no attempt spent)
    ADD COLUMN deferrals  integer NOT NULL DEFAULT 0,
    -- the attempts one run may spend: an operator's retry grants this many more
    ADD COLUMN attempt_budget integer CHECK (attempt_budget >= 1);
UPDATE jobs SET attempt_budget = max_attempts;
ALTER TABLE jobs ALTER COLUMN attempt_budget SET NOT NULL;

-- the pruner: finished jobs by finish time
CREATE INDEX jobs_finished_idx ON jobs (finished_at)
    WHERE status IN ('succeeded', 'dead', 'cancelled');

-- pruning a job takes its outbox rows, attempts and effects with it
ALTER TABLE outbox DROP CONSTRAINT outbox_job_id_fkey,
    ADD CONSTRAINT outbox_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE;
ALTER TABLE attempts DROP CONSTRAINT attempts_job_id_fkey,
    ADD CONSTRAINT attempts_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE;
ALTER TABLE effects DROP CONSTRAINT effects_job_id_fkey,
    ADD CONSTRAINT effects_job_id_fkey FOREIGN KEY (job_id) REFERENCES jobs (id) ON DELETE CASCADE;
-- the pruner: published outbox rows by age
CREATE INDEX outbox_published_idx ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Job types of the apps that api and worker processes loaded, registered when they start.
-- The SQL door reads its defaults (and refuses unknown types) from here.
CREATE TABLE job_types (
    name            text PRIMARY KEY,
    payload_schema  jsonb       NOT NULL DEFAULT '{}'::jsonb,
    max_attempts    integer,
    timeout_seconds integer,
    retry_base      double precision,
    retry_cap       double precision,
    description     text,
    registered_by   text        NOT NULL,
    registered_at   timestamptz NOT NULL DEFAULT now()
);

-- Nesting depth of a jsonb value (objects and arrays), counted up to `stop_at`.
CREATE FUNCTION leasework_jsonb_depth(value jsonb, stop_at integer DEFAULT 64)
RETURNS integer LANGUAGE sql IMMUTABLE AS $$
    WITH RECURSIVE walk(v, depth) AS (
        SELECT value, CASE WHEN jsonb_typeof(value) IN ('object', 'array') THEN 1 ELSE 0 END
        UNION ALL
        SELECT child.v, walk.depth + 1
        FROM walk,
             LATERAL (SELECT e.value AS v FROM jsonb_each(
                          CASE WHEN jsonb_typeof(walk.v) = 'object' THEN walk.v END) e
                      UNION ALL
                      SELECT a.value FROM jsonb_array_elements(
                          CASE WHEN jsonb_typeof(walk.v) = 'array' THEN walk.v END) a) child
        WHERE jsonb_typeof(child.v) IN ('object', 'array') AND walk.depth < stop_at
    )
    SELECT max(depth) FROM walk
$$;

-- The requests of one insert, as rows. Each request is a JSON object:
--   id (uuid, required), type (required), payload, run_at (timestamptz) or delay_seconds,
--   max_attempts, timeout_seconds, ordering_key, idempotency_key: what the client asked;
--   default_max_attempts, default_timeout_seconds, retry_base, retry_cap: the door's policy
--   for what the client left out (the app's per-type values, then the process settings).
-- request_hash covers only what the client asked, so a replay matches across deploys that
-- change a type's defaults, and across doors.
CREATE FUNCTION leasework_job_requests(requests jsonb)
RETURNS TABLE (
    ord integer, id uuid, type text, payload jsonb, run_at timestamptz, due boolean,
    max_attempts integer, timeout_seconds integer, retry_base double precision,
    retry_cap double precision, ordering_key text, idempotency_key text, request_hash text
) LANGUAGE sql STABLE AS $$
    SELECT r.ord::integer,
           (r.req->>'id')::uuid,
           r.req->>'type',
           coalesce(r.req->'payload', '{}'::jsonb),
           coalesce((r.req->>'run_at')::timestamptz,
                    now() + make_interval(secs => (r.req->>'delay_seconds')::float8),
                    now()),
           coalesce((r.req->>'run_at')::timestamptz,
                    now() + make_interval(secs => (r.req->>'delay_seconds')::float8),
                    now()) <= now(),
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
           END
    FROM jsonb_array_elements(requests) WITH ORDINALITY AS r(req, ord)
    LEFT JOIN job_types t ON t.name = r.req->>'type'
$$;

-- Insert jobs (and, for those due now, their outbox rows) in the caller's transaction: the
-- one insert path of every door. Returns one row per request, in order: the job that request
-- names; `replay` when an earlier request with the same idempotency key and the same content
-- made it, `conflict` when that earlier request differed (nothing was written for it).
CREATE FUNCTION leasework_jobs_insert(requests jsonb, topic text DEFAULT 'jobs.ready')
RETURNS TABLE (
    ord integer, id uuid, status text, run_at timestamptz, created_at timestamptz,
    max_attempts integer, timeout_seconds integer, replay boolean, conflict boolean
) LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    inserted integer;
BEGIN
    RETURN QUERY
    WITH req AS (SELECT * FROM leasework_job_requests(requests)),
    ins AS (
        INSERT INTO jobs AS j (id, type, payload, status, run_at, max_attempts, attempt_budget,
                               timeout_seconds, retry_base, retry_cap, ordering_key,
                               idempotency_key, request_hash)
        SELECT req.id, req.type, req.payload,
               CASE WHEN req.due THEN 'queued' ELSE 'scheduled' END,
               req.run_at, req.max_attempts, req.max_attempts, req.timeout_seconds, req.retry_base,
               req.retry_cap, req.ordering_key, req.idempotency_key, req.request_hash
        FROM req ORDER BY req.ord
        ON CONFLICT (idempotency_key) DO NOTHING
        RETURNING j.id, j.type, j.status, j.run_at, j.created_at, j.max_attempts,
                  j.timeout_seconds, j.ordering_key
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
           ins.timeout_seconds, false, false
    FROM ins JOIN req ON req.id = ins.id;
    GET DIAGNOSTICS inserted = ROW_COUNT;
    IF inserted < jsonb_array_length(requests) THEN
        -- a new statement, so it sees keys that a concurrent transaction committed while
        -- this one waited on the unique index
        RETURN QUERY
        SELECT req.ord, j.id, j.status, j.run_at, j.created_at, j.max_attempts,
               j.timeout_seconds, j.request_hash IS NOT DISTINCT FROM req.request_hash,
               j.request_hash IS DISTINCT FROM req.request_hash
        FROM leasework_job_requests(requests) req
        JOIN jobs j ON j.idempotency_key = req.idempotency_key
        WHERE j.id <> req.id;
    END IF;
END $$;

-- The SQL door, for every language: enqueue one job in the caller's transaction.
--   SELECT leasework_enqueue('send_receipt', '{"order_id": 42}', delay => '10 seconds');
-- Refuses (SQLSTATE 22023, with a hint) a type no api or worker registered, and requests
-- the job store cannot keep; raises 23505 when the idempotency key was used for a
-- different request. Returns the job id (the earlier job's, on a replay).
CREATE FUNCTION leasework_enqueue(
    job_type        text,
    payload         jsonb       DEFAULT '{}'::jsonb,
    run_at          timestamptz DEFAULT NULL,
    delay           interval    DEFAULT NULL,
    max_attempts    integer     DEFAULT NULL,
    timeout_seconds integer     DEFAULT NULL,
    ordering_key    text        DEFAULT NULL,
    idempotency_key text        DEFAULT NULL
) RETURNS uuid LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    known text;
    result record;
BEGIN
    IF job_type IS NULL OR job_type !~ '^[A-Za-z0-9_.:-]{1,100}$' THEN
        RAISE EXCEPTION 'leasework_enqueue: job_type % is invalid', quote_nullable(job_type)
            USING ERRCODE = '22023', HINT = 'use 1-100 letters, digits and _ . : -';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM job_types t WHERE t.name = job_type) THEN
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
            'idempotency_key', idempotency_key))
        -- jsonb_strip_nulls also strips nulls inside the payload: put the payload back as is
        || jsonb_build_object('payload', payload)));
    IF result.conflict THEN
        RAISE EXCEPTION 'leasework_enqueue: idempotency key % was used for a different request',
                        quote_literal(idempotency_key)
            USING ERRCODE = '23505',
                  DETAIL = 'the earlier job is ' || result.id::text,
                  HINT = 'use a new key for a new job, or repeat the original request';
    END IF;
    RETURN result.id;
END $$;
