-- The durable record of a sale: shops, items, orders. Redis holds the live stock; this
-- schema is what operators query and what survives everything.

-- Minimal for now: opening hours and status arrive with the shops work.
CREATE TABLE shops (
    id          BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    created_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE items (
    id             BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    shop_id        BIGINT UNSIGNED NOT NULL,
    name           VARCHAR(200)    NOT NULL,
    total          INT UNSIGNED    NOT NULL,
    price_cents    BIGINT UNSIGNED NOT NULL,
    start_at       DATETIME(3)     NOT NULL,
    end_at         DATETIME(3)     NOT NULL,
    pay_timeout_s  INT UNSIGNED    NOT NULL DEFAULT 1800,
    -- Set by an operator (pause/resume); Redis keeps a copy that grab.lua checks.
    paused         BOOLEAN         NOT NULL DEFAULT FALSE,
    created_at     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    updated_at     DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    KEY idx_items_shop (shop_id),
    -- The item catalogue of every instance reloads the items whose sale is recent.
    KEY idx_items_end (end_at),
    CONSTRAINT fk_items_shop FOREIGN KEY (shop_id) REFERENCES shops (id),
    CONSTRAINT ck_items_window CHECK (start_at < end_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE orders (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    order_sn        VARCHAR(40)     NOT NULL,
    item_id         BIGINT UNSIGNED NOT NULL,
    user_id         BIGINT UNSIGNED NOT NULL,
    -- A non-binary collation: drivers see a binary-collated ENUM as bytes, not as an enum.
    status          ENUM('unpaid', 'paid', 'cancelled') CHARACTER SET ascii COLLATE ascii_general_ci
                        NOT NULL DEFAULT 'unpaid',
    created_at      DATETIME(3)     NOT NULL,
    pay_deadline    DATETIME(3)     NOT NULL,
    updated_at      DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
    -- The user while the order holds a unit (unpaid or paid), NULL once cancelled. A unique
    -- key ignores NULLs, so the key below allows any number of cancelled orders but only
    -- one live order per user and item: MySQL itself refuses a double purchase, whatever
    -- Redis says. (MariaDB and MySQL have no partial indexes; this is the portable way.)
    active_user_id  BIGINT UNSIGNED GENERATED ALWAYS AS
                        (CASE WHEN status IN ('unpaid', 'paid') THEN user_id END) STORED,
    -- Idempotency: a message delivered twice inserts one row.
    UNIQUE KEY uk_orders_sn (order_sn),
    UNIQUE KEY uk_orders_one_live_per_user (item_id, active_user_id),
    -- "My orders" and operators' lookups by user.
    KEY idx_orders_user (user_id),
    -- Counting an item's orders by status (stats), and finding overdue unpaid orders.
    KEY idx_orders_item_status (item_id, status, pay_deadline)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
