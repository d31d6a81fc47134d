-- Pausing a queue (leasework/queue_ops.py set_paused; docs/design-decisions.md, "Pausing a
-- queue: the consumer stops fetching, the claim refuses"). A paused queue's row carries when
-- and by whom. Workers stop fetching its topic within half a second; what they fetched
-- before is refused at the claim, whose stamp reads the row after taking the advisory lock
-- (7305005, 0) shared, in a statement of its own: a pause takes that lock exclusively, so a
-- claim that began before the pause committed has finished, and one that begins after it
-- sees the pause. A refused job is held: `scheduled`, due 9999-01-01 UTC (leasework/queues.py
-- HELD_UNTIL; no attempt spent, no lease), until the resume makes it due now.

ALTER TABLE queues ADD COLUMN paused_at timestamptz;
ALTER TABLE queues ADD COLUMN paused_by text;
-- the last resume: the auditor's "stuck queued" bound counts from it for the queue's jobs
ALTER TABLE queues ADD COLUMN resumed_at timestamptz;
