-- Draws (docs/contract.md §3, §4): entries until draw_at, then winners by rank, the rank
-- of each entry following from a seed committed to in advance.

ALTER TABLE items
    -- When entries close and the draw runs; NULL for a first-come sale.
    ADD COLUMN draw_at     DATETIME(3) NULL AFTER release_plan,
    -- The draw's secret: 32 random bytes (hex), made when the item is first written as a
    -- draw and never changed; its SHA-256 is shown from then on, the seed itself only once
    -- the draw is done.
    ADD COLUMN draw_seed   CHAR(64) CHARACTER SET ascii NULL AFTER draw_at,
    -- When the first round of winners was complete: from then on the seed is public.
    ADD COLUMN drawn_at    DATETIME(3) NULL AFTER draw_seed,
    -- The highest rank given a unit so far (every entry ranked at or below it won one):
    -- where the next round, for a unit a winner gave back, starts.
    ADD COLUMN draw_cutoff BIGINT UNSIGNED NULL AFTER drawn_at,
    ADD KEY idx_items_draw (draw_at);
