-- Sale shapes (docs/contract.md §3, §4): more than one unit per buyer, and waves.

ALTER TABLE items
    -- Live orders (pending, unpaid or paid) one user may hold of the item (1–100).
    ADD COLUMN per_user     TINYINT UNSIGNED NOT NULL DEFAULT 1 AFTER buckets,
    -- Waves: a JSON array of {"at_ms", "units"}, increasing; NULL or empty = every unit on
    -- sale from start_at.
    ADD COLUMN release_plan TEXT NULL AFTER per_user;

ALTER TABLE orders
    -- Which of the buyer's `per_user` places the order holds (0 for an item with one
    -- per buyer): Redis's buyer record gives each live order its own place, and the key
    -- below lets MySQL refuse a second order in the same place, as it refused a second
    -- live order per user before.
    ADD COLUMN slot TINYINT UNSIGNED NOT NULL DEFAULT 0 AFTER user_id,
    DROP KEY uk_orders_one_live_per_user,
    ADD UNIQUE KEY uk_orders_live_place (item_id, active_user_id, slot);
