-- Concurrency limits across all workers (leasework/store/worker.py STAMP and FINISH_MANY;
-- docs/design-decisions.md, "Concurrency limits: counted from running rows at the stamp,
-- held jobs released as slots free up"). A queue may cap how many of its jobs run at once
-- (`queues.concurrency`); a job type may cap how many of its jobs run at once per value of a
-- payload field, or in all (`job_types.concurrency`: {"limit": n, "key": "customer_id" |
-- null}, registered with the app's types).
--
-- The claim's stamp enforces both. It takes an advisory lock (7305006, hash of the limit's
-- name) for every limit its batch touches, in one order, in a statement of its own; then,
-- in a statement begun after the locks are held, it counts the limit's running jobs (rows
-- `running`: a lease that expired holds its slot until the reaper takes its fence back) and
-- starts only the jobs that fit. The others are held, like a paused queue's: `scheduled`,
-- due 9999-01-01 UTC, no attempt spent, `held_for` naming the limit. The finish that frees
-- a slot releases the oldest job held for it; the relay's promoter releases what that
-- misses, oldest first, as slots free up.

ALTER TABLE queues ADD COLUMN concurrency integer CHECK (concurrency > 0);
ALTER TABLE job_types ADD COLUMN concurrency jsonb;

-- a running job's limit (its type's, with the key's value), written by the stamp
ALTER TABLE jobs ADD COLUMN limit_key text;
-- the limit a held job waits for: a limit key, or '@' and its queue's name (a type name
-- never holds '@' or '/')
ALTER TABLE jobs ADD COLUMN held_for text;

CREATE INDEX jobs_running_limit_idx ON jobs (limit_key)
    WHERE status = 'running' AND limit_key IS NOT NULL;
CREATE INDEX jobs_held_for_idx ON jobs (held_for, created_at)
    WHERE held_for IS NOT NULL AND status IN ('scheduled', 'queued');

-- The limit a job of `type` with `payload` counts against, under its type's policy: the
-- type's name, and '/' and the key field's value when the policy names one (a missing field
-- counts as the empty value); NULL when the type has no limit.
CREATE FUNCTION leasework_limit_key(type text, payload jsonb, policy jsonb) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN policy IS NULL OR jsonb_typeof(policy) <> 'object' THEN NULL
                WHEN policy->>'key' IS NULL THEN type
                ELSE type || '/' || coalesce(payload->>(policy->>'key'), '') END
$$;
