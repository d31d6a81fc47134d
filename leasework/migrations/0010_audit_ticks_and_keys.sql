-- The auditor's checks across jobs (leasework/audit.py, tick_twice and unique_twice): when a
-- job finishes, the auditor looks up the other jobs of its schedule's tick and the other jobs
-- of its unique key, whatever their state (the unique index holds only a key's holders, and
-- jobs_schedule_unfinished_idx only the unfinished). Both partial: a job from no schedule and
-- with no key adds nothing to either.
CREATE INDEX jobs_schedule_tick_idx ON jobs (schedule, tick_at) WHERE schedule IS NOT NULL;
CREATE INDEX jobs_unique_key_all_idx ON jobs (unique_key) WHERE unique_key IS NOT NULL;
