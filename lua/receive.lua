-- receive.lua: a bucket of a split item takes in a unit another bucket lent it (`lend.lua`),
-- once per transfer, unless the transfer was voided first.
--
-- KEYS[1] meta       HASH  loaded, total   (of the receiving bucket)
-- KEYS[2] tokens     LIST  unsold units
-- KEYS[3] transfers  HASH  transfer id -> "in" | "void"
-- ARGV[1] transfer id
-- ARGV[2] the unit
--
-- A transfer is decided here, once: "in" (the unit is on sale here now) or "void" (a
-- sweeper found it stuck and gave the unit back to its lender, or this bucket is not
-- loaded). Deciding again answers the first decision, so a late or repeated call can never
-- put a unit on sale twice. The request that made the transfer drops the decision once it
-- settled the lender (no call of it can come after); one cut off keeps it.
--
-- Returns "in" or "void".

local decided = redis.call('HGET', KEYS[3], ARGV[1])
if decided then
  return decided
end
if redis.call('HEXISTS', KEYS[1], 'loaded') == 0 then
  redis.call('HSET', KEYS[3], ARGV[1], 'void')
  return 'void'
end
redis.call('HSET', KEYS[3], ARGV[1], 'in')
redis.call('RPUSH', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[1], 'total', 1)
return 'in'
