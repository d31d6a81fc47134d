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

-- The mail service's ledger: one row per idempotency key, however often it was called.
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
