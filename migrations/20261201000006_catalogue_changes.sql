-- The item catalogue of every instance reads only the items changed since its last look
-- (a full read only every half minute): by their last change.
ALTER TABLE items
    ADD KEY idx_items_updated (updated_at);
