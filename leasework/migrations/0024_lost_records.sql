-- Lost Kafka records (issue 54): the relay's recovery service (leasework/relay/recovery.py)
-- watches jobs that have waited as `queued` with no outbox row (published, not yet started)
-- for longer than a few seconds. Each pass that finds such jobs makes one mark per topic and
-- watches its jobs under it; a later reading of Kafka's positions (started after the mark
-- was committed) fills the mark with its topic's id and each partition's high watermark, so
-- every watched job's record sits below them. A job still waiting, unchanged, once its
-- group's committed offsets or the log start have passed every one of them (or a watermark
-- went backwards, or the topic's id changed) lost its record: it gets a new outbox row.

CREATE TABLE delivery_marks (
    id         bigserial   PRIMARY KEY,
    topic      text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    -- filled from a reading of Kafka that started after this row was committed
    filled_at  timestamptz,
    topic_id   text,
    -- {"<partition>": high watermark, ...}
    high       jsonb
);

CREATE TABLE delivery_watch (
    job_id          uuid        PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    mark_id         bigint      NOT NULL REFERENCES delivery_marks (id) ON DELETE CASCADE,
    -- the job's updated_at when it was watched: a job that moved since (ran, was retried,
    -- republished) is no longer the one the mark speaks for
    seen_updated_at timestamptz NOT NULL
);

CREATE INDEX delivery_watch_mark_idx ON delivery_watch (mark_id);

-- the watch's scan: queued jobs by the time they became queued, whatever the finished jobs
-- number (a row enters this index only when it is written as queued)
CREATE INDEX jobs_queued_idx ON jobs (updated_at) WHERE status = 'queued';
