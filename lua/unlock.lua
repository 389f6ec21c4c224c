-- unlock.lua: release a lock taken with `SET key token NX PX ms`, only by its owner.
--
-- KEYS[1] the lock
-- ARGV[1] the token its owner set
--
-- Returns 1 when the lock was released, 0 when somebody else holds it (or nobody).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
