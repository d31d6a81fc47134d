-- The relay takes each topic's oldest rows in turn (store.relay.outbox_fetch), not the
-- oldest rows of a priority whatever their topic: a burst of 20,000 wake-ups in one queue
-- held every other queue's new wake-ups of the same priority behind it for as long as it
-- took to publish (0.2-1.5 s on two cores, `just bench --rows isolation`). A pass walks the
-- (priority, topic) pairs with rows waiting, one index probe each, and locks each pair's
-- oldest rows, an equal share of the batch. This index serves both, in the order a pass
-- publishes (a priority, then within a topic by id); it replaces 0017's (priority, id),
-- which nothing reads any more, so an outbox row still costs two index entries besides its
-- primary key and its job's.
CREATE INDEX outbox_band_idx ON outbox (priority, topic, id);
DROP INDEX outbox_priority_idx;
