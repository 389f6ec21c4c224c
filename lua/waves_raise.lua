-- waves_raise.lua: hold more of a bucket's units back for waves (a `PUT` that enlarges a
-- wave still to come, adds one or moves one later: src/items/write.rs), only as far as the
-- units on the bucket's list can honour it at Redis's own TIME.
--
-- KEYS[1] meta    HASH  `loaded`, `fenced`, `waves` (and `rules`, packed again: lib/rules.lua)
-- KEYS[2] tokens  LIST  unsold units
-- ARGV[1] the new `waves` field ("at_ms:held" pairs: lib/waves.lua); at every instant it
--         holds back at least as much as the field it replaces
--
-- The check and the write are one step, so no purchase can take a unit the check counted
-- in between; and a purchase sells only above what is held back, so a list that covers
-- what is held back now keeps covering it (what is held back only shrinks with time).
--
-- A bucket not loaded, or `fenced` (a warm-up is replacing its units, and checks its own
-- load against the item's record), sells nothing: nothing is checked or written.
--
-- Returns {1}: written, or nothing to write; {0, held, listed}: nothing written, the new
-- field would hold `held` units back now and the list holds only `listed`.

local meta = redis.call('HMGET', KEYS[1], 'loaded', 'fenced')
if not meta[1] or meta[2] then
  return {1}
end
local time = redis.call('TIME')
local held = held_at(ARGV[1], time[1] * 1000 + math.floor(time[2] / 1000))
local listed = redis.call('LLEN', KEYS[2])
if listed < held then
  return {0, held, listed}
end
redis.call('HSET', KEYS[1], 'waves', ARGV[1])
pack_rules(KEYS[1])
return {1}
