-- finish.lua: a scheduler is done with delay-queue tasks it took under a lease.
--
-- KEYS[1] leased  ZSET  task -> when its lease runs out (ms)
-- KEYS[2] due     ZSET  task -> when it is due (ms)
-- ARGV[1] the lease end this scheduler's claim set
-- ARGV[2] '' when the tasks are done, or when they are due again (ms): put back
-- ARGV[3..] tasks
--
-- Only tasks still held under this very lease are touched: a scheduler that overran its
-- lease (another took the task since, with a later lease end) changes nothing of them.
--
-- Returns how many were still this scheduler's.

local mine = 0
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    if ARGV[2] ~= '' then
      redis.call('ZADD', KEYS[2], ARGV[2], ARGV[i])
    end
    mine = mine + 1
  end
end
return mine
