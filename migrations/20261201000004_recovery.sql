-- Knowing what Redis should hold, so that a Redis that lost its data is recognised and
-- rebuilt from MySQL only when no order can still be on its way.

ALTER TABLE items
    -- When the item's units were last loaded into Redis by a warm-up. An item loaded once
    -- whose units are no longer in Redis lost them (a crash without persistence, a flush,
    -- a failover to an empty replica): it is rebuilt, not loaded afresh.
    ADD COLUMN loaded_at  DATETIME(3) NULL AFTER reconciled_at,
    -- When the current pause began (NULL while not paused): orders won before it may still
    -- be on their way for a few seconds, and a rebuild waits them out.
    ADD COLUMN paused_at  DATETIME(3) NULL AFTER paused;

-- A shop whose change reached MySQL but not yet Redis (Redis failed in between): a
-- scheduler pushes it to Redis and announces it as soon as Redis answers. Indexed so that
-- looking for such shops every second costs nothing when there are none.
ALTER TABLE shops
    ADD COLUMN redis_stale BOOLEAN NOT NULL DEFAULT FALSE,
    ADD KEY idx_shops_redis_stale (redis_stale);
