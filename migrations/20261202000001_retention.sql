-- Retiring an ended sale's state from Redis (src/items/retire.rs): once its reconciliation
-- is older than SECKILL_SALE_RETENTION_S, MySQL alone is the record of the sale.

ALTER TABLE items
    -- When the sale was retired: from then on nothing reads its Redis state, which is
    -- being (or has been) deleted. Set before the first key goes, so a crash halfway
    -- leaves an item every reader already treats as retired.
    ADD COLUMN retired_at       DATETIME(3)  NULL AFTER loaded_at,
    -- Units left unsold when it was retired (the tokens Redis held): what
    -- `GET /api/items/{id}` and the stats still show as `remaining`.
    ADD COLUMN unsold           INT UNSIGNED NULL AFTER retired_at,
    -- When the last of its Redis state was gone (keys, index entries, marks).
    ADD COLUMN redis_cleared_at DATETIME(3)  NULL AFTER unsold,
    -- The retention pass asks every few seconds for reconciled items not yet cleared: by
    -- this index it reads only those, not every item that was ever retired.
    ADD KEY idx_items_retire (redis_cleared_at, reconciled_at);
