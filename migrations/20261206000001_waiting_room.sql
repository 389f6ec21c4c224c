-- The waiting room (docs/contract.md, "The waiting room"): a queued item's settings and
-- the seed that orders its pre-queue.

ALTER TABLE items
    -- `{"admit_per_s", "pass_ttl_s", "opens_before_s", "pow_bits"}` as JSON; NULL: no queue.
    ADD COLUMN queue_plan VARCHAR(255) CHARACTER SET ascii NULL AFTER draw_cutoff,
    -- 32 random bytes (hex), made when the queue is first set and never changed: the
    -- pre-queue's order follows from it and the user ids alone. Its SHA-256 is shown from
    -- then on, the seed itself from `start_at`.
    ADD COLUMN queue_seed CHAR(64) CHARACTER SET ascii NULL AFTER queue_plan;
