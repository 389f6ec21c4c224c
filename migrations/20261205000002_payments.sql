-- Payments by signed events (docs/contract.md, "Payments"): an order is paid when the party
-- that took the money says so. Two statuses that hold no unit: `refund_due` (money taken
-- for an order that cannot have its unit: a late payment) and `refunded`. Appending ENUM
-- values changes only the table's definition; `active_user_id` still names the user only
-- while the order holds a unit (unpaid or paid).
ALTER TABLE orders
    MODIFY COLUMN status ENUM('unpaid', 'paid', 'cancelled', 'refund_due', 'refunded')
        CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL DEFAULT 'unpaid',
    -- The provider's reference of the charge that paid it (`provider_ref`); NULL when paid
    -- by its buyer under SECKILL_PAYMENTS=trust_buyer. A refund names the charge it returns.
    ADD COLUMN paid_ref VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NULL AFTER paid_at,
    -- A cancelled order revived by a late payment: when it had been cancelled (its unit
    -- went back then) and when it took a unit again. The contract's §7 is judged over the
    -- history from these (src/orders/repo.rs, held_over_time).
    ADD COLUMN lapsed_at DATETIME(3) NULL AFTER paid_ref,
    ADD COLUMN revived_at DATETIME(3) NULL AFTER lapsed_at;

-- Every payment event once, with what it did: a repeat of `event_id` answers from its row.
CREATE TABLE payment_events (
    id            BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id      VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    type          ENUM('payment.succeeded', 'payment.refunded', 'payment.failed')
                      CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL,
    order_sn      VARCHAR(40) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    amount_cents  BIGINT UNSIGNED NOT NULL,
    currency      CHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    occurred_at   DATETIME(3) NOT NULL,
    provider_ref  VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- What it did (the answer's `code`), and the answer's HTTP status.
    outcome       VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    answered      SMALLINT UNSIGNED NOT NULL,
    received_at   DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    -- A charge owed back (outcome `refund_due`, `charged_twice`, `order_not_found`): set
    -- when the provider reports it refunded.
    settled_at    DATETIME(3) NULL,
    UNIQUE KEY uk_payment_events_event (event_id),
    KEY idx_payment_events_order (order_sn),
    -- Held events to apply, and charges owed back: both few, both found by outcome.
    KEY idx_payment_events_outcome (outcome, settled_at),
    KEY idx_payment_events_charge (provider_ref)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Events for other services written in the same transaction as the change they announce
-- (`order.refund_due`), sent by the scheduler and deleted once RabbitMQ confirms them: a
-- crash between the two sends one again, never none.
CREATE TABLE event_outbox (
    id           BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    routing_key  VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    message_id   VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    body         TEXT NOT NULL,
    created_at   DATETIME(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
