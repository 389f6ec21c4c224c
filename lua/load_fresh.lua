-- load_fresh.lua: load a fresh bucket (never loaded, no orders, no buyer records) — its
-- units and its meta in one step, unless the item changed since the warm-up read it.
--
-- KEYS[1] meta    HASH
-- KEYS[2] tokens  LIST  the units (empty before: the caller checked)
-- ARGV[1..4] `loaded`, `paused`, `start_ms`, `end_ms` as the warm-up read them ('' for
--            absent): a pause or a resume since changed one of them
-- ARGV[5]    the number of the first unit, minus one
-- ARGV[6]    units to load (unit numbers ARGV[5] + 1 .. ARGV[5] + ARGV[6])
-- ARGV[7..]  the new meta, field and value pairs (packed for grab.lua as well:
--            lib/rules.lua)
--
-- The bulk warm-up's fast path (src/items/fresh.rs): one call per bucket instead of a
-- side list and swap.lua, which also replaces buyer records a fresh bucket does not have.
--
-- Returns 'ok', or 'raced' with nothing changed.

local fields = {'loaded', 'paused', 'start_ms', 'end_ms'}
local now = redis.call('HMGET', KEYS[1], unpack(fields))
for i = 1, #fields do
  if (now[i] or '') ~= ARGV[i] then
    return 'raced'
  end
end

redis.call('DEL', KEYS[2])
local first, units = tonumber(ARGV[5]), tonumber(ARGV[6])
local batch = {}
for unit = first + 1, first + units do
  batch[#batch + 1] = unit
  if #batch == 1000 then
    redis.call('RPUSH', KEYS[2], unpack(batch))
    batch = {}
  end
end
if #batch > 0 then
  redis.call('RPUSH', KEYS[2], unpack(batch))
end
redis.call('HSET', KEYS[1], unpack(ARGV, 7))
-- The server that holds the load, by its run id (see swap.lua).
redis.call('HSET', KEYS[1], 'loaded_on', string.match(redis.call('INFO', 'server'), 'run_id:(%x+)'))
-- What grab.lua checks, packed (lib/rules.lua).
pack_rules(KEYS[1])
return 'ok'
