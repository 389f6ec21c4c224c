-- grab.lua: sell one unit of an item to one user, atomically.
--
-- KEYS[1] meta          HASH  loaded, paused, start_ms, end_ms, sold, total, fenced
-- KEYS[2] tokens        LIST  unsold units
-- KEYS[3] buyers        ZSET  user_id -> won-at ms (this user's shard)
-- KEYS[4] buyer_orders  HASH  user_id -> order_sn (same shard)
-- KEYS[5] pending       HASH  order_sn -> order JSON (won, not yet in MySQL)
-- KEYS[6] outbox        ZSET  order_sn -> won-at ms (not yet confirmed by RabbitMQ)
-- ARGV[1] user_id
-- ARGV[2] order_sn      the number this order gets if the user wins
-- ARGV[3] now           server time, ms since the epoch
-- ARGV[4] order JSON    stored in `pending` for the publisher, the relay and order reads
--
-- Returns a two-element array {outcome, detail}:
--   {"won", order_sn} | {"duplicate", existing order_sn} | {"sold_out", ""} |
--   {"paused", ""} | {"not_loaded", ""} | {"reloading", ""} (a warm-up is replacing the
--   item's units: `fenced`) | {"not_started", ""} | {"ended", ""};
--   an error, with nothing written, when the meta's `sold` is not an integer
--
-- A script never rolls back: every check happens before the first write (the LPOP).

local meta = redis.call('HMGET', KEYS[1], 'loaded', 'paused', 'start_ms', 'end_ms', 'sold', 'fenced')
if not meta[1] then
  return {'not_loaded', ''}
end
if meta[6] then
  return {'reloading', ''}
end
if meta[2] == '1' then
  return {'paused', ''}
end
local now = tonumber(ARGV[3])
if now < tonumber(meta[3]) then
  return {'not_started', ''}
end
if now >= tonumber(meta[4]) then
  return {'ended', ''}
end

local held = redis.call('HGET', KEYS[4], ARGV[1])
if held then
  return {'duplicate', held}
end

-- HINCRBY below would fail on a `sold` that is not an integer, after the LPOP.
if meta[5] and not string.match(meta[5], '^%-?%d+$') then
  return redis.error_reply('item meta: sold is not an integer')
end

local token = redis.call('LPOP', KEYS[2])
if not token then
  return {'sold_out', ''}
end

redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'sold', 1)
redis.call('HSET', KEYS[5], ARGV[2], ARGV[4])
redis.call('ZADD', KEYS[6], now, ARGV[2])
return {'won', ARGV[2]}
