-- minimal.lua: the least a sale can do in Redis, the benchmark's second yardstick
-- (loadtest/bare.rs `POST /minimal`, loadtest/redis_cost.rs): turn a repeat buyer away, take
-- a unit, record the buyer, count the sale. No sale window, no buyer record of orders, no
-- outbox: what grab.lua costs beyond this is the price of its guarantees.
--
-- KEYS[1] meta (HASH, `sold`)  KEYS[2] tokens (LIST)  KEYS[3] buyers (ZSET user -> ms)
-- ARGV[1] user_id  ARGV[2] now (ms)
-- Returns 'won', 'duplicate' or 'sold_out'.

if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  return 'duplicate'
end
if not redis.call('LPOP', KEYS[2]) then
  return 'sold_out'
end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'sold', 1)
return 'won'
