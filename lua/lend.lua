-- lend.lua: a bucket of a split item lends one unsold unit to another of its buckets (the
-- first step of a transfer; `receive.lua` on the other bucket is the second).
--
-- KEYS[1] meta    HASH  loaded, paused, fenced, total, waves, lends   (of the lending bucket)
-- KEYS[2] tokens  LIST  unsold units
-- KEYS[3] lent    HASH  transfer id -> "home|unit|ms": lent, not known to have arrived
-- ARGV[1] transfer id (new for each transfer)
-- ARGV[2] the receiving bucket's number
-- ARGV[3] now (ms)
-- ARGV[4] how old a loan may be and still count as on its way when cut off (ms)
--
-- The unit leaves the list and is recorded in `lent` in one step: until the transfer is
-- settled (the receiver has it: the record goes; or it never will: the unit comes back,
-- `unlend.lua`) it counts as remaining here, so it is never lost and never counted twice.
--
-- Units a wave still holds back here (`waves`, lib/waves.lua) are not lent: they go on
-- sale at their time, in this bucket.
--
-- `lends` counts the loans this bucket ever made. A buyer who found every bucket empty
-- twice says "sold out" only if no bucket lent between its two looks: a unit can move from
-- a bucket not yet asked to one asked already, and again, and a loan settled meanwhile
-- leaves no other trace (`Refill::grab` in src/purchase/sell.rs).
--
-- Returns {"lent", unit}; {"empty", lends} when this bucket has no unit it may sell now
-- (waves); {"moving", lends} when it has none it may lend but lent one within the last second
-- (by the callers' clocks) whose loan is not settled yet: the unit is on its way to another
-- bucket, or there already, so one asked before this one may have it now. An older loan
-- is either cut off (its unit comes back here with the repair, seconds later) or only late
-- to settle (its unit on the other list already); which one, only the home bucket's
-- decision says, on another slot: so "empty" comes with those loans, up to 16 of them no
-- older than ARGV[4] — {"empty", lends, transfer id, record, …}, and "more" last when it
-- holds more than that (then one of the rest may be on its way) — for the caller to ask
-- (src/items/transfer.rs). One older than that: the repair, which settles a loan within
-- seconds of the replicas being in step, is not running, and the unit is not counted.
-- {"held", ""} when it may have some but lends none now (not loaded, paused, or `fenced`
-- while a warm-up replaces its units).

local meta = redis.call('HMGET', KEYS[1], 'loaded', 'paused', 'fenced', 'waves')
if not meta[1] or meta[2] == '1' or meta[3] then
  return {'held', ''}
end
-- Nothing to lend when the units left are held back for a wave — yet a unit lent a moment
-- ago is moving all the same (answering "empty" then told a buyer the end while the unit
-- was on its way: a generated history on the cluster).
local unit = nil
if not held_back(meta[4], KEYS[2]) then
  unit = redis.call('LPOP', KEYS[2])
end
if not unit then
  local lends = redis.call('HGET', KEYS[1], 'lends') or '0'
  local now, horizon = tonumber(ARGV[3]), tonumber(ARGV[4])
  local empty = {'empty', lends}
  local loans = redis.call('HGETALL', KEYS[3])
  for i = 1, #loans, 2 do
    local at = tonumber(string.match(loans[i + 1], '|(%d+)$'))
    if at and math.abs(now - at) < 1000 then
      return {'moving', lends}
    end
    if at and math.abs(now - at) <= horizon and empty[#empty] ~= 'more' then
      if #empty < 2 + 2 * 16 then
        empty[#empty + 1] = loans[i]
        empty[#empty + 1] = loans[i + 1]
      else
        empty[#empty + 1] = 'more'
      end
    end
  end
  return empty
end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2] .. '|' .. unit .. '|' .. ARGV[3])
redis.call('HINCRBY', KEYS[1], 'total', -1)
redis.call('HINCRBY', KEYS[1], 'lends', 1)
return {'lent', unit}
