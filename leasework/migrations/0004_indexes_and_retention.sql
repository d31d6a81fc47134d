-- Every filter of the console's jobs page and of GET /jobs is served by an index, newest
-- first in the keyset order (created_at DESC, id DESC) the pages walk:
--   no filter         jobs_created_idx (0001)
--   status            jobs_status_created_idx (0001)
--   type              jobs_type_created_idx
--   type and status   jobs_type_status_created_idx
-- A created_at window is a range of the same index. A finished_at window walks it too: the
-- console's filter adds what every writer keeps true (only finished jobs have a finish time,
-- and a job finishes after it was created, so created_at < until), which also lets the
-- partial jobs_finished_idx (0002) serve.
-- The overview's counts by type and status read these two alone: the types by skipping
-- through jobs_type_created_idx, each (type, status) cell a bounded range of
-- jobs_type_status_created_idx (store/console.py, job_counts).
CREATE INDEX jobs_type_created_idx ON jobs (type, created_at DESC, id DESC);
CREATE INDEX jobs_type_status_created_idx ON jobs (type, status, created_at DESC, id DESC);

-- Retention of the audit log and of alert notifications (LEASEWORK_RETAIN_AUDIT, _ALERTS):
-- the pruner deletes the oldest rows first, a batch at a time, through audit_log_at_idx and
-- alert_notifications_received_idx (0003) read backwards; no index to add for it.
