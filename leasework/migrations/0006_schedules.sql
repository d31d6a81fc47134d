-- Recurring schedules (leasework.schedule is the calendar; leasework.relay.scheduler fires).
--
-- A schedule is a row; each tick it handles is a row of schedule_ticks, unique on
-- (schedule, nominal_at), inserted in the transaction that inserts the tick's job and
-- advances the schedule's next_fire_at by compare-and-set. The constraint, not a leader,
-- makes a second insert of one tick impossible: two schedulers that race for a tick collide
-- on it and one of them inserts nothing (docs/design-decisions.md, "Exactly once per tick").

CREATE TABLE schedules (
    name           text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    type           text        NOT NULL,
    payload        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    cron           text        NOT NULL,
    timezone       text        NOT NULL DEFAULT 'UTC',
    overlap        text        NOT NULL DEFAULT 'allow'
                               CHECK (overlap IN ('allow', 'skip', 'buffer_one')),
    catch_up       text        NOT NULL DEFAULT 'latest'
                               CHECK (catch_up IN ('skip', 'latest', 'all')),
    catch_up_limit integer     NOT NULL DEFAULT 1 CHECK (catch_up_limit BETWEEN 1 AND 1000),
    grace_seconds  integer     NOT NULL DEFAULT 60 CHECK (grace_seconds BETWEEN 0 AND 86400),
    paused         boolean     NOT NULL DEFAULT false,
    -- the earliest tick not yet handled; NULL when the expression has no further tick
    next_fire_at   timestamptz,
    -- 'app': declared in an app's code and reconciled when a process of it starts;
    -- 'api': created over the API or the CLI
    source         text        NOT NULL CHECK (source IN ('app', 'api')),
    declared_by    text,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);

-- the scheduler's pass: schedules due, by due time
CREATE INDEX schedules_due_idx ON schedules (next_fire_at) WHERE NOT paused;

CREATE TABLE schedule_ticks (
    id          bigserial   PRIMARY KEY,
    schedule    text        NOT NULL REFERENCES schedules (name) ON DELETE CASCADE,
    -- the instant the tick stands for (UTC; to the second for cron ticks, the request's
    -- instant for a manual trigger)
    nominal_at  timestamptz NOT NULL,
    outcome     text        NOT NULL CHECK (outcome IN ('fired', 'skipped')),
    -- why a tick was skipped: 'catch_up' (missed, and the policy did not run it) or
    -- 'overlap' (earlier runs unfinished)
    reason      text        CHECK ((outcome = 'skipped') = (reason IS NOT NULL)),
    -- the job a fired tick inserted (no foreign key: finished jobs are pruned)
    job_id      uuid        CHECK ((outcome = 'fired') = (job_id IS NOT NULL)),
    -- what handled it: the scheduler on time ('cron'), late ('catch_up'), an operator
    -- ('trigger', 'backfill')
    source      text        NOT NULL CHECK (source IN ('cron', 'catch_up', 'trigger', 'backfill')),
    recorded_at timestamptz NOT NULL DEFAULT now(),
    -- the rule: one row per tick, however many schedulers race for it
    UNIQUE (schedule, nominal_at)
);

-- a schedule's latest ticks (its page), and the pruner's oldest-first batches
CREATE INDEX schedule_ticks_recent_idx ON schedule_ticks (schedule, recorded_at DESC);
CREATE INDEX schedule_ticks_recorded_idx ON schedule_ticks (recorded_at);

-- the schedule and tick a job came from (NULL for every other door)
ALTER TABLE jobs ADD COLUMN schedule text, ADD COLUMN tick_at timestamptz;

-- the overlap policy's count: a schedule's runs that are not finished
CREATE INDEX jobs_schedule_unfinished_idx ON jobs (schedule)
    WHERE schedule IS NOT NULL AND status IN ('scheduled', 'queued', 'running', 'failed');
