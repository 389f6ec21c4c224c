-- swap.lua: put a warm-up's loaded units and buyer records in place of the live ones, and
-- its meta, atomically — unless the item changed since the warm-up's decisive read, or
-- another run took the bucket over. Lifts this run's fence.
--
-- KEYS[1] meta                     HASH
-- KEYS[2] tokens                   LIST  the live units
-- KEYS[3] the run's side list      LIST  the units loaded (absent when none)
-- then, for the N buyer shards:  KEYS[3 + 1 .. 3 + N]        the live buyer records
--                                  (HASH per shard)
--                                KEYS[3 + N + 1 .. 3 + 2N]   the run's loading copies of
--                                  them, in the same order (absent when empty)
-- ARGV[1..4] `loaded`, `paused`, `start_ms`, `end_ms` as the warm-up read them ('' for
--            absent): a pause, a resume or a new window since changed one of them
-- ARGV[5]    this run's id: the bucket must still be `fenced` by it (a warm-up fences
--            every bucket of the item before its decisive read; while fenced, nothing
--            sells, lends, gives back or releases there)
-- ARGV[6..]  the new meta, field and value pairs (packed for grab.lua as well:
--            lib/rules.lua)
--
-- Every key carries the item's hash tag: one slot, so this runs on a Redis Cluster too
-- (a WATCH would not: the cluster connection is shared by every request).
--
-- Returns {'ok', units listed, units sold} as the swap left them (read back in the same
-- step: once the fence is lifted the sale may go on at once; sold is `total` less the
-- listed units), or {'raced', 0, 0} with nothing changed.

local fields = {'loaded', 'paused', 'start_ms', 'end_ms'}
local now = redis.call('HMGET', KEYS[1], unpack(fields))
for i = 1, #fields do
  if (now[i] or '') ~= ARGV[i] then
    return {'raced', 0, 0}
  end
end
if redis.call('HGET', KEYS[1], 'fenced') ~= ARGV[5] then
  return {'raced', 0, 0}
end

-- A renamed key keeps its expiry (the side copies have one): the live ones must not.
local function replace(live, loading)
  redis.call('DEL', live)
  if redis.call('EXISTS', loading) == 1 then
    redis.call('RENAME', loading, live)
    redis.call('PERSIST', live)
  end
end

replace(KEYS[2], KEYS[3])
local shard_keys = (#KEYS - 3) / 2
for i = 1, shard_keys do
  replace(KEYS[3 + i], KEYS[3 + shard_keys + i])
end
redis.call('HSET', KEYS[1], unpack(ARGV, 6))
-- The server that holds the load, by its run id: a later warm-up that finds another one
-- serving the bucket (a failover, a restart) knows writes may have been lost since.
redis.call('HSET', KEYS[1], 'loaded_on', string.match(redis.call('INFO', 'server'), 'run_id:(%x+)'))
redis.call('HDEL', KEYS[1], 'fenced')
-- A `sold` field an older server wrote is no count of this release's: it goes.
redis.call('HDEL', KEYS[1], 'sold')
-- What grab.lua checks, packed (lib/rules.lua): the new fields, and the fence gone.
pack_rules(KEYS[1])
local listed = redis.call('LLEN', KEYS[2])
return {'ok', listed, tonumber(redis.call('HGET', KEYS[1], 'total')) - listed}
