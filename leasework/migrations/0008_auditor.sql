-- The auditor (leasework.audit, leasework.relay.auditor): the promise checked on the live
-- tables, incrementally.
--
-- An attempt row says whether its fenced effects committed, written by the completer in the
-- same statement (and transaction) as the attempt's outcome and the effects themselves: a job
-- whose effects committed twice has two such attempts, whatever the effects wrote. Adding a
-- column with a constant default rewrites nothing (Postgres 11+).
ALTER TABLE attempts ADD COLUMN effects_committed boolean NOT NULL DEFAULT false;

-- Where the auditor has got to: finished jobs are checked in (finished_at, id) order, from
-- the watermark on (NULL: from the first), through jobs_finished_idx; one row, locked by the
-- pass that advances it, so relays side by side take turns instead of checking twice.
CREATE TABLE invariant_audit (
    id             integer     PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    finished_after timestamptz,
    after_id       uuid,
    passes         bigint      NOT NULL DEFAULT 0,
    jobs_checked   bigint      NOT NULL DEFAULT 0,
    last_pass_at   timestamptz,
    started_at     timestamptz NOT NULL DEFAULT now()
);
INSERT INTO invariant_audit DEFAULT VALUES;

-- What it found: one row per kind and job (a job found again adds nothing), kept until the
-- pruner's audit retention.
CREATE TABLE invariant_violations (
    id       bigserial   PRIMARY KEY,
    kind     text        NOT NULL,
    job_id   uuid        NOT NULL,
    detail   text        NOT NULL,
    found_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, job_id)
);
CREATE INDEX invariant_violations_found_idx ON invariant_violations (found_at DESC);
