-- A lower priority band's consumer runs only while its band has work
-- (leasework/worker/bands.py): the relay counts what it publishes to each lower band's topic
-- here, in the pass that retires the rows, and every worker reads the counts with the paused
-- queues; a count that moved opens the band's consumer again. Level 0's topic is not
-- counted (its consumer always runs), so a pass of level 0 jobs writes nothing more.
CREATE TABLE band_publishes (
    topic text PRIMARY KEY,
    published bigint NOT NULL DEFAULT 0
);
