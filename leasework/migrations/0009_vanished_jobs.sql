-- The auditor's `vanished`: an accepted job deleted other than by the pruner. Nothing else
-- remembers accepted jobs once their row is gone, so the delete itself records it, in its
-- own transaction: a statement trigger over the deleted rows. The pruner declares its
-- deletes (set_config('leasework.deleting', 'pruner', true), store.jobs_prune); an operator,
-- a test or the bench deleting jobs on purpose says 'deliberately'. Anything else (a DELETE
-- by hand, a script, a bug) becomes a violation the auditor counts and alerts on.
CREATE FUNCTION leasework_jobs_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('leasework.deleting', true), '')
           NOT IN ('pruner', 'deliberately') THEN
        INSERT INTO invariant_violations (kind, job_id, detail)
        SELECT 'vanished', g.id,
               format('a %s %s job (created %s) was deleted, not by the pruner',
                      g.status, g.type, g.created_at)
        FROM gone g
        ON CONFLICT (kind, job_id) DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_vanished AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION leasework_jobs_deleted();

-- how far the auditor has counted the trigger's rows (invariant_violations.id)
ALTER TABLE invariant_audit ADD COLUMN vanished_after bigint NOT NULL DEFAULT 0;
