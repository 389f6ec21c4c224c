-- Every change of a circuit breaker's level, by hand or automatic: who, when, why.

CREATE TABLE circuit_changes (
    id          BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
    -- `global` or `item:ID`.
    scope       VARCHAR(40)     NOT NULL,
    old_level   TINYINT UNSIGNED NOT NULL,
    new_level   TINYINT UNSIGNED NOT NULL,
    source      ENUM('manual', 'auto') CHARACTER SET ascii COLLATE ascii_general_ci NOT NULL,
    -- An operator's name (or `admin`), or the instance that measured the trip.
    actor       VARCHAR(100)    NOT NULL,
    reason      VARCHAR(500)    NOT NULL,
    changed_at  DATETIME(3)     NOT NULL DEFAULT CURRENT_TIMESTAMP(3),
    KEY idx_circuit_changes_scope (scope, changed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
