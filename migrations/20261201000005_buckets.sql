-- A hot item's units spread over several Redis buckets (each its own hash tag, so its own
-- slot of a Redis Cluster). Fixed once the item has been loaded: every order and buyer
-- record lives in the bucket its buyer's id maps to among this many.
ALTER TABLE items
    ADD COLUMN buckets TINYINT UNSIGNED NOT NULL DEFAULT 1 AFTER pay_timeout_s;
