-- The auditor judges each fact by what held when it happened (issue 54; leasework/audit.py,
-- leasework/store/audit.py), not by the settings as they are when it looks.
--
-- Limits. The claim's stamp (leasework/store/worker.py STAMP) records on each attempt it
-- opens the limits it applied, in the statement that inserts the attempt, from the rows it
-- already reads: its type's concurrency limit (per the job's limit_key), its queue's cap, and
-- its type's rate limit as registered then. The auditor holds each attempt's start to those:
-- a cap lowered while jobs ran does not make the jobs that started under the old one
-- violations, and the jobs started after it are held to the new one. `limits_recorded` tells
-- an attempt whose stamp recorded them (true: a NULL limit then means none was in force, and
-- the attempt is not judged against it) from one opened before this migration, or by a
-- worker still running the stamp before it (false: judged against the limits as they are
-- now, as every attempt was before). A constant default: no table rewrite.
ALTER TABLE attempts
    ADD COLUMN limits_recorded boolean NOT NULL DEFAULT false,
    -- the job's type's concurrency limit per key (jobs.limit_key) the stamp applied
    ADD COLUMN key_limit integer,
    -- the job's queue's cap (queues.concurrency) the stamp applied
    ADD COLUMN queue_limit integer,
    -- the job's type's rate limit (job_types.rate: {"count", "per", "burst", "key"}) as
    -- registered when the stamp started it (the worker reserved its start under its app's)
    ADD COLUMN rate jsonb;

-- Schedules. A schedule deleted and created again under its name (over the api, the way to
-- change one; or stored again by its app after an operator deleted it) has no ticks, and a
-- backfill of a range the deleted one fired gives those instants jobs again: rightly, as
-- ticks of the new schedule. Each deletion is recorded here (by the delete itself, whoever
-- deletes), so that the auditor's tick check (tick_twice) counts a tick's jobs per schedule
-- of that name: a job created before a deletion of its schedule's name was the deleted one's.
-- (A job's created_at is its insert's transaction's start; the transaction that inserts a
-- tick's job holds its schedule's row, so the delete waits for it and comes after.)
CREATE TABLE schedule_deletions (
    id         bigserial   PRIMARY KEY,
    name       text        NOT NULL,
    created_at timestamptz NOT NULL,  -- the deleted schedule's
    deleted_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX schedule_deletions_name_idx ON schedule_deletions (name, deleted_at);

CREATE FUNCTION leasework_schedules_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO schedule_deletions (name, created_at) SELECT name, created_at FROM gone;
    RETURN NULL;
END $$;

CREATE TRIGGER schedules_deleted AFTER DELETE ON schedules
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION leasework_schedules_deleted();
