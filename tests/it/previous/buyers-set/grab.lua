-- grab.lua: sell one unit of an item to one user, atomically.
--
-- KEYS[1] meta          HASH  loaded, paused, start_ms, end_ms, sold, fenced, per_user, waves,
--                             draw_ms
-- KEYS[2] tokens        LIST  unsold units
-- KEYS[3] buyers        ZSET  user_id -> won-at ms (this user's shard)
-- KEYS[4] buyer_orders  HASH  user_id -> the user's live orders (same shard; see below)
-- KEYS[5] pending       HASH  order_sn -> order JSON (won, not yet in MySQL)
-- KEYS[6] outbox        ZSET  order_sn -> won-at ms (not yet confirmed by RabbitMQ)
-- KEYS[7] idempotency   STRING the order this user's key bought (only with ARGV[4])
-- ARGV[1] user_id
-- ARGV[2] order_sn      the number this order gets if the user wins
-- ARGV[3] order JSON    stored in `pending` for the publisher, the relay and order reads
-- ARGV[4] the buyer's Idempotency-Key, '' for none
--
-- The sale's window is judged by Redis's own TIME, not by the caller's clock: a host whose
-- clock runs ahead or behind sells exactly when the others do.
--
-- A buyer record lists the user's live orders by place (lib/places.lua); a win takes the
-- first free one. A new order takes the first free place (its
-- `slot`, which MySQL's unique key on (item, live user, slot) backs).
--
-- Waves (`waves`, lib/waves.lua): a unit sells only while the list holds more than a wave
-- still to come holds back, by Redis's own TIME; while a wave is to come the answer is
-- never "sold out".
--
-- Returns a two-element array {outcome, detail}:
--   {"won", slot} | {"repeat", order_sn} (this key bought that order before) |
--   {"duplicate", existing order_sn} (per_user 1) | {"limit_reached", "sn sn …"} |
--   {"sold_out", ""} | {"between_releases", next wave's ms} | {"paused", ""} |
--   {"not_loaded", ""} | {"reloading", ""} (a warm-up is replacing the item's units:
--   `fenced`) | {"not_started", ""} | {"ended", ""};
--   an error, with nothing written, when the meta's `sold` is not an integer
--
-- A script never rolls back: every check happens before the first write (the LPOP).

local meta = redis.call('HMGET', KEYS[1], 'loaded', 'paused', 'start_ms', 'end_ms', 'sold',
  'fenced', 'per_user', 'waves', 'draw_ms')
if not meta[1] then
  return {'not_loaded', ''}
end
local key = ARGV[4]
if key and key ~= '' then
  local bought = redis.call('GET', KEYS[7])
  if bought then
    return {'repeat', bought}
  end
end
if meta[6] then
  return {'reloading', ''}
end
if meta[2] == '1' then
  return {'paused', ''}
end
-- A draw's units are given by rank (award.lua), never to the fastest.
if meta[9] and meta[9] ~= '' then
  return {'ended', ''}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
if now < tonumber(meta[3]) then
  return {'not_started', ''}
end
if now >= tonumber(meta[4]) then
  return {'ended', ''}
end

local places, live = parse_places(redis.call('HGET', KEYS[4], ARGV[1]))
local limit = tonumber(meta[7]) or 1
if #live >= limit then
  if limit == 1 then
    return {'duplicate', live[1]}
  end
  return {'limit_reached', table.concat(live, ' ')}
end

-- HINCRBY below would fail on a `sold` that is not an integer, after the LPOP.
if meta[5] and not string.match(meta[5], '^%-?%d+$') then
  return redis.error_reply('item meta: sold is not an integer')
end

-- A wave to come holds back what is left here (even one with no share here: a split
-- item's buyer may borrow from a bucket it reached).
local next_wave = held_back(meta[8], KEYS[2])
if next_wave then
  return {'between_releases', next_wave}
end

local token = redis.call('LPOP', KEYS[2])
if not token then
  return {'sold_out', ''}
end

local slot = record_win(KEYS[1], KEYS[3], KEYS[4], KEYS[5], KEYS[6], ARGV[1], ARGV[2], now,
  ARGV[3], places)
if key and key ~= '' then
  redis.call('SET', KEYS[7], ARGV[2], 'PX', 86400000)
end
return {'won', slot}
