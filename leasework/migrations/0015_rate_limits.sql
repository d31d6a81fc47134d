-- Rate limits across all workers (leasework/rates.py, leasework/ratelimit.py;
-- docs/design-decisions.md, "Job rate limits: a start reserved in Redis, kept in Postgres"). A
-- type may allow N starts per second, minute or hour, per value of a payload field or in
-- all. At the claim, a worker reserves each such job's start slot in Redis (GCRA on Redis's
-- clock, one script per batch); a job whose slot is later than now waits for it,
-- `scheduled` and due at the slot, no attempt spent, carrying its reservation here. Its
-- next claim starts it without asking Redis again (the stamp clears the reservation). When
-- Redis lost a limit's state (a restart without data, a wipe, an idle key's expiry), the
-- worker re-seeds it from the latest reservation kept here, so a wipe never hands out the
-- slots already promised to waiting jobs a second time.

-- the limit a job's reservation counts against (its type's name, and '/' and the key's
-- value when the limit names a field), and the reserved start (Redis's clock)
ALTER TABLE jobs ADD COLUMN rate_key text;
ALTER TABLE jobs ADD COLUMN rate_slot_at timestamptz;

CREATE INDEX jobs_rate_slot_idx ON jobs (rate_key, rate_slot_at)
    WHERE rate_slot_at IS NOT NULL;

-- a type's rate limit as registered with the app's types: {"count": n, "per": seconds,
-- "burst": n, "key": field | null}
ALTER TABLE job_types ADD COLUMN rate jsonb;

-- The auditor's concurrency check (leasework/audit.py check_limits): the jobs of a limit key
-- whose attempts may overlap a finished batch's, by creation time.
CREATE INDEX jobs_limit_key_idx ON jobs (limit_key, created_at) WHERE limit_key IS NOT NULL;
