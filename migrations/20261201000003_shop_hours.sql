-- Shops' opening hours (in the shop's own time zone), dated exceptions, operators'
-- overrides, and a log of every change.

ALTER TABLE shops
    ADD COLUMN timezone         VARCHAR(64)  NOT NULL DEFAULT 'UTC' AFTER id,
    -- An operator's word, winning over the hours until `override_until` (or until cleared).
    ADD COLUMN override_open    BOOLEAN      NULL,
    ADD COLUMN override_until   DATETIME(3)  NULL,
    ADD COLUMN override_reason  VARCHAR(500) NULL,
    ADD COLUMN updated_at       DATETIME(3)  NOT NULL DEFAULT CURRENT_TIMESTAMP(3);

-- Weekly openings: weekday 1 = Monday; a close at or before the open runs past midnight.
CREATE TABLE shop_hours (
    shop_id     BIGINT UNSIGNED  NOT NULL,
    weekday     TINYINT UNSIGNED NOT NULL,
    open_time   TIME             NOT NULL,
    close_time  TIME             NOT NULL,
    PRIMARY KEY (shop_id, weekday, open_time),
    CONSTRAINT fk_shop_hours_shop FOREIGN KEY (shop_id) REFERENCES shops (id),
    CONSTRAINT ck_shop_hours_weekday CHECK (weekday BETWEEN 1 AND 7)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Dated exceptions: closed all day, open all day, or open from/until on that date.
CREATE TABLE shop_exceptions (
    shop_id     BIGINT UNSIGNED NOT NULL,
    day         DATE            NOT NULL,
    open        BOOLEAN         NOT NULL,
    from_time   TIME            NULL,
    until_time  TIME            NULL,
    PRIMARY KEY (shop_id, day),
    CONSTRAINT fk_shop_exceptions_shop FOREIGN KEY (shop_id) REFERENCES shops (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE shop_changes (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    shop_id     BIGINT UNSIGNED NOT NULL,
    -- `hours`, `status` (an override set or cleared), `refresh`, `repair`.
    what        VARCHAR(16)     NOT NULL,
    old_open    BOOLEAN         NOT NULL,
    new_open    BOOLEAN         NOT NULL,
    actor       VARCHAR(100)    NOT NULL,
    reason      VARCHAR(500)    NOT NULL,
    changed_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    KEY idx_shop_changes_shop (shop_id, changed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
