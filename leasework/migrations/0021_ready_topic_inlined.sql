-- leasework_ready_topic's three-argument form (0016) is inlined into the statements that call
-- it, as its two-argument form always was. Its body appended the priority with `text ||
-- smallint`, an operator Postgres declares STABLE (it formats any type), and an IMMUTABLE SQL
-- function whose body is not immutable is never inlined: every outbox row of every job insert
-- ran it as a SQL function of its own, parsed and planned anew at each statement (perf showed
-- `fmgr_sql` in 11% of Postgres's CPU under a stream of one-job inserts; one
-- leasework_jobs_insert of one job fell from 0.45 to 0.39 ms of Postgres CPU with this change,
-- docs/design-decisions.md, "Hot statements use generic plans"). `priority::text` is an
-- immutable cast; the topics it makes are the same.
CREATE OR REPLACE FUNCTION leasework_ready_topic(topic text, queue text, priority smallint)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN priority = 0 THEN leasework_ready_topic(topic, queue)
                ELSE topic || '.' || queue || '.p' || priority::text END
$$;
