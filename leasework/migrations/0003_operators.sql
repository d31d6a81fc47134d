-- Operators and tenants: API tokens, the audit log, alert notifications, live workers and
-- the fence rejections the console shows.

-- Only a slow hash of each token is kept (leasework/tokens.py); `prefix` finds the row.
CREATE TABLE api_tokens (
    id           uuid        PRIMARY KEY,
    name         text        NOT NULL,
    prefix       text        NOT NULL UNIQUE,
    token_hash   text        NOT NULL,
    scopes       text[]      NOT NULL,
    rate         double precision CHECK (rate > 0),  -- requests per second; NULL: unlimited
    burst        integer     CHECK (burst >= 1),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text        NOT NULL,
    revoked_at   timestamptz,
    last_used_at timestamptz
);
-- one live token per name (a revoked one's name can be reused)
CREATE UNIQUE INDEX api_tokens_live_name_idx ON api_tokens (name) WHERE revoked_at IS NULL;

-- Who did what, when: every operator action (console or API).
CREATE TABLE audit_log (
    id        bigserial   PRIMARY KEY,
    at        timestamptz NOT NULL DEFAULT now(),
    actor     text        NOT NULL,  -- the token's name
    action    text        NOT NULL,  -- cancel, retry, retry-many, token-create, ...
    target    text,                  -- a job id, a token name, a filter
    detail    jsonb       NOT NULL DEFAULT '{}'::jsonb
);
CREATE INDEX audit_log_at_idx ON audit_log (at DESC);
CREATE INDEX audit_log_target_idx ON audit_log (target, at DESC);

-- Notifications Alertmanager delivered to the api's webhook.
CREATE TABLE alert_notifications (
    id          bigserial   PRIMARY KEY,
    received_at timestamptz NOT NULL DEFAULT now(),
    alertname   text        NOT NULL,
    status      text        NOT NULL,  -- firing | resolved
    severity    text,
    summary     text,
    starts_at   timestamptz,
    ends_at     timestamptz,
    labels      jsonb       NOT NULL DEFAULT '{}'::jsonb,
    receiver    text
);
CREATE INDEX alert_notifications_received_idx ON alert_notifications (received_at DESC);

-- Live workers: each heartbeat tick refreshes its row.
CREATE TABLE workers (
    name       text        PRIMARY KEY,
    app        text        NOT NULL,
    started_at timestamptz NOT NULL,
    last_seen  timestamptz NOT NULL,
    running    integer     NOT NULL DEFAULT 0,
    capacity   integer     NOT NULL DEFAULT 0
);

-- Terminal writes refused by the fence: a newer claim held the job.
CREATE TABLE fence_rejections (
    id       bigserial   PRIMARY KEY,
    job_id   uuid        NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    fence    bigint      NOT NULL,
    worker   text        NOT NULL,
    outcome  text        NOT NULL,  -- what the stale attempt would have written
    at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX fence_rejections_job_idx ON fence_rejections (job_id);

-- Per-deployment secrets shared by every api process (the console's session key).
CREATE TABLE leasework_secrets (
    name       text        PRIMARY KEY,
    value      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
