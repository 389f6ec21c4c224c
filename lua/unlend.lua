-- unlend.lua: settles a transfer on the lending side, once its receiver decided it.
--
-- KEYS[1] meta    HASH  total   (of the lending bucket)
-- KEYS[2] tokens  LIST  unsold units
-- KEYS[3] lent    HASH  transfer id -> "home|unit|ms"
-- ARGV[1] transfer id
-- ARGV[2] "in" (the receiver has the unit: forget the record) or "void" (it never will:
--         the unit goes back on sale here)
--
-- Returns 1 when it settled the transfer, 0 when it was settled already.

local record = redis.call('HGET', KEYS[3], ARGV[1])
if not record then
  return 0
end
redis.call('HDEL', KEYS[3], ARGV[1])
if ARGV[2] == 'void' then
  local unit = string.match(record, '^[^|]*|(.*)|[^|]*$')
  redis.call('RPUSH', KEYS[2], unit)
  redis.call('HINCRBY', KEYS[1], 'total', 1)
end
return 1
