-- Autovacuum never analyzed `jobs`: its ANALYZE evaluates the unique index's predicate
-- (0007, `leasework_unique_holds`) with the search_path of maintenance work
-- (`pg_catalog, pg_temp`), where the predicate's inner call of `leasework_unique_bit`, looked
-- up by name when the function is inlined, does not resolve; every automatic analyze of
-- `jobs` failed ("function leasework_unique_bit(text) does not exist" in the Postgres log),
-- so the planner kept the table's statistics from whenever someone last ran ANALYZE by hand.
-- The predicate now calls nothing of ours: the state's bit is written out here, as
-- leasework_unique_bit (0007) and leasework/unique.py STATE_BITS say it. Same arguments, same
-- result, still IMMUTABLE and inlinable, so the index and every lookup that names the
-- predicate are unchanged. (Not `SET search_path` on the function: that stops inlining, and
-- the planner then cannot prove the index's predicate.)
CREATE OR REPLACE FUNCTION leasework_unique_holds(states smallint, status text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (states::integer & CASE status WHEN 'scheduled' THEN 1 WHEN 'queued' THEN 2
                                          WHEN 'running' THEN 4 WHEN 'succeeded' THEN 8
                                          WHEN 'failed' THEN 16 WHEN 'dead' THEN 32
                                          WHEN 'cancelled' THEN 64 ELSE 0 END) <> 0
$$;
