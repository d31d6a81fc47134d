-- Jobs, the transactional outbox, execution attempts and fenced handler effects.

CREATE TABLE jobs (
    id               uuid PRIMARY KEY,
    type             text        NOT NULL,
    payload          jsonb       NOT NULL,
    status           text        NOT NULL CHECK (status IN (
                         'scheduled', 'queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled')),
    run_at           timestamptz NOT NULL,
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL CHECK (max_attempts >= 1),
    timeout_seconds  integer     NOT NULL CHECK (timeout_seconds >= 1),
    fence            bigint      NOT NULL DEFAULT 0,
    lease_owner      text,
    lease_expires_at timestamptz,
    idempotency_key  text UNIQUE,
    request_hash     text,
    ordering_key     text,
    last_error       text,
    cancel_requested boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz
);

-- listing: newest first, optionally by status and type, keyset on (created_at, id)
CREATE INDEX jobs_created_idx ON jobs (created_at DESC, id DESC);
CREATE INDEX jobs_status_created_idx ON jobs (status, created_at DESC, id DESC);
-- the promoter: waiting jobs by due time
CREATE INDEX jobs_due_idx ON jobs (run_at) WHERE status IN ('scheduled', 'failed');
-- the reaper: running jobs by lease expiry
CREATE INDEX jobs_lease_idx ON jobs (lease_expires_at) WHERE status = 'running';

CREATE TABLE outbox (
    id           bigserial   PRIMARY KEY,
    job_id       uuid        NOT NULL REFERENCES jobs (id),
    topic        text        NOT NULL,
    key          text        NOT NULL,
    value        jsonb       NOT NULL,
    headers      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);

CREATE INDEX outbox_pending_idx ON outbox (id) WHERE published_at IS NULL;

CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('leasework_outbox', '');
    RETURN NULL;
END $$;

CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

CREATE TABLE attempts (
    id          bigserial   PRIMARY KEY,
    job_id      uuid        NOT NULL REFERENCES jobs (id),
    attempt     integer     NOT NULL,
    worker      text        NOT NULL,
    fence       bigint      NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz,
    outcome     text,
    error       text
);

CREATE INDEX attempts_job_idx ON attempts (job_id, attempt);

-- Effects written by handlers through the fenced transaction; the chaos checker counts them.
CREATE TABLE effects (
    id         bigserial   PRIMARY KEY,
    job_id     uuid        NOT NULL REFERENCES jobs (id),
    fence      bigint      NOT NULL,
    kind       text        NOT NULL,
    data       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX effects_job_idx ON effects (job_id);
