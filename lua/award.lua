-- award.lua: give a draw's winner a unit, once ever.
--
-- KEYS[1] meta          HASH  loaded, fenced, end_ms, per_user, first_round_done
-- KEYS[2] tokens        LIST  unsold units
-- KEYS[3] buyer_orders  HASH  (the winner's shard, as grab.lua)
-- KEYS[4] pending       HASH  order_sn -> order JSON
-- KEYS[5] outbox        ZSET  order_sn -> ms
-- KEYS[6] entries       ZSET  user_id -> rank
-- KEYS[7] awarded       HASH  user_id -> the order they were given, or '-': passed over
-- ARGV[1] user_id
-- ARGV[2] order_sn      the number the order gets
-- ARGV[3] now           ms since the epoch (the order's time: its pay deadline counts
--                       from the draw)
-- ARGV[4] order JSON
-- ARGV[5] '1' when the caller's record of the item shows the draw's first round not done
--         (MySQL's `drawn_at` is NULL), else '0'
--
-- The winner's order is made exactly as grab.lua makes a purchase's (lib/places.lua), so
-- everything after a win — the outbox, MySQL, deadlines, cancels — is the same. `awarded`
-- makes it once ever: a second call (a scheduler resuming a draw cut off, or a second
-- scheduler) answers 'repeat', and a winner who cancelled is not given the unit again —
-- it passes on to the next entry by rank.
--
-- A winner whose live orders already reach the meta's `per_user` (bought while the item
-- was a first-come sale, before it became a draw) is never given one more: the entry is
-- passed over for good ('-' in `awarded`) and the unit goes to the next entry by rank, as
-- a cancelled winner's does.
--
-- The first round gives its units whenever it runs, also after the sale's end (`end_ms`): a
-- draw at `end_at`, the default, is drawn then. After the first round a unit passes on to
-- the next entry by rank only while the sale lasts: none once Redis's clock reaches
-- `end_ms`, the clock the window is judged by everywhere (grab.lua) — the draw pass reads
-- an item's record again only every 10 s, so its own view of the end may be that late.
-- The first round is done when the caller says so (ARGV[5]: MySQL's `drawn_at`, which a
-- draw of an earlier release has too) or the meta does (`first_round_done`, written by
-- src/draw/award.rs before that `drawn_at`): a draw pass whose record of the item is
-- older than the first round's end (another scheduler made it) still gives nothing after
-- `end_ms`. (`drawn`, in the meta from before the first unit, only closes the entries.)
--
-- Returns {'won', order_sn} | {'repeat', order_sn} | {'passed', ''} (passed over, now or
-- before) | {'not_entered', ''} | {'sold_out', ''} (no unit in this bucket: borrow, or
-- none is left) | {'ended', ''} (after the end, the first round done) | {'not_loaded', ''}
-- | {'reloading', ''};
-- an error, with nothing written, when the meta's end is not a number.
--
-- A script never rolls back: every check happens before the first write.

local PASSED = '-'

local meta = redis.call('HMGET', KEYS[1], 'loaded', 'fenced', 'end_ms', 'per_user',
  'first_round_done')
if not meta[1] then
  return {'not_loaded', ''}
end
local given = redis.call('HGET', KEYS[7], ARGV[1])
if given == PASSED then
  return {'passed', ''}
end
if given then
  return {'repeat', given}
end
if meta[2] then
  return {'reloading', ''}
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- Arithmetic on a string converts it (an error when it is not a number: nothing written).
if now >= meta[3] + 0 and (ARGV[5] ~= '1' or meta[5]) then
  return {'ended', ''}
end
if not redis.call('ZSCORE', KEYS[6], ARGV[1]) then
  return {'not_entered', ''}
end
local places, live = parse_places(redis.call('HGET', KEYS[3], ARGV[1]))
if #live >= (tonumber(meta[4]) or 1) then
  redis.call('HSET', KEYS[7], ARGV[1], PASSED)
  return {'passed', ''}
end
if not redis.call('LPOP', KEYS[2]) then
  return {'sold_out', ''}
end
record_win(KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[4], places)
-- No publisher takes a draw's orders: the relay sends them from the outbox.
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[2])
redis.call('HSET', KEYS[7], ARGV[1], ARGV[2])
return {'won', ARGV[2]}
