-- breaker_auto.lua: move one instance's automatic breaker from one state to the next,
-- atomically.
--
-- KEYS[1] automatic breakers   HASH  `instance:ID` -> setting JSON
-- ARGV[1] the instance's field (`instance:ID`)
-- ARGV[2] the state the caller saw: `closed`, `open` or `half_open`
-- ARGV[3] the new setting JSON, or '' to close (remove the entry)
--
-- Changes nothing, and returns 0, when the breaker is no longer in the state the caller saw
-- (an operator closed it, with the global breaker, since the caller looked) or its entry is
-- not an automatic one. Returns 1 when it changed.

local current = redis.call('HGET', KEYS[1], ARGV[1])
local state = 'closed'
if current then
  local ok, setting = pcall(cjson.decode, current)
  if not ok or setting.source ~= 'auto' then
    return 0
  end
  state = setting.state or 'closed'
end
if state ~= ARGV[2] then
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
return 1
