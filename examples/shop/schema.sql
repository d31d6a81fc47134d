-- The shop's own tables. A real application owns its migrations; the example applies this
-- idempotently when it starts.

CREATE TABLE IF NOT EXISTS shop_orders (
    id                 bigserial   PRIMARY KEY,
    email              text        NOT NULL CHECK (email LIKE '%_@_%'),
    amount_cents       integer     NOT NULL CHECK (amount_cents > 0),
    -- the client's key: a retried order request finds its order instead of making a second
    idempotency_key    text        UNIQUE,
    receipt_job_id     uuid,
    -- written by send_receipt through the fence: more than 1 would be a doubled receipt
    receipts_recorded  integer     NOT NULL DEFAULT 0,
    receipt_message_id text,
    receipt_sent_at    timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now()
);

-- The mail service's idempotency ledger (its `key` guard): one row per key, however often it
-- was called. The fence guard's table, leasework_fences, is leasework.downstream.TABLE_SQL.
CREATE TABLE IF NOT EXISTS shop_mail (
    idempotency_key text        PRIMARY KEY,
    message_id      text        NOT NULL,
    recipient       text        NOT NULL,
    subject         text        NOT NULL,
    body            text        NOT NULL,
    calls           integer     NOT NULL DEFAULT 1,
    first_sent_at   timestamptz NOT NULL DEFAULT now(),
    last_call_at    timestamptz NOT NULL DEFAULT now()
);

-- Every email the mail service sent, with the job and fence of the call that sent it (NULL
-- for a call without fence headers): more than one row for a job is a duplicate email.
CREATE TABLE IF NOT EXISTS shop_emails (
    id              bigserial   PRIMARY KEY,
    message_id      text        NOT NULL,
    job_id          uuid,
    fence           bigint,
    idempotency_key text,
    recipient       text        NOT NULL,
    subject         text        NOT NULL,
    body            text        NOT NULL,
    sent_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS shop_emails_job_id ON shop_emails (job_id);

-- Calls the mail service refused because their fence was stale (a newer attempt had called).
CREATE TABLE IF NOT EXISTS shop_mail_refused (
    id         bigserial   PRIMARY KEY,
    job_id     uuid        NOT NULL,
    fence      bigint      NOT NULL,
    highest    bigint,
    refused_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS shop_mail_refused_job_id ON shop_mail_refused (job_id);
