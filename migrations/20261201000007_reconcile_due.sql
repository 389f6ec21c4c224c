-- The scheduler asks every two seconds for ended sales not yet reconciled: by this index
-- it reads only those, not every item that ever ended.
ALTER TABLE items
    ADD KEY idx_items_reconcile (reconciled_at, end_at);
